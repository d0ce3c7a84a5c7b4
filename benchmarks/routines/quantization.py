"""Routines of kiln.quantization: per_token_group_quant_fp8 and scaled_fp8_quant, each against
torch (the formula as an eager model writes it: kiln.trace.quantization's reference, also the
bit-exact specification). FlashInfer 0.7 has neither op; vLLM and SGLang, which do, are not among
the peers installed on the device.

Bytes per call: the input read once, one byte per element written, the scales. packbits /
segment_packbits (//ops/quantization:packbits) against torch (the reference: weights times bits,
summed) and FlashInfer's (flashinfer.quantization, when importable; CUDA only): one byte read per
element, one written per 8.
"""

from __future__ import annotations

import torch

import kiln
from kiln.trace.quantization import (
    group_quant_reference_fp8,
    packbits_reference,
    segment_packbits_reference,
    tensor_quant_reference_fp8,
)

from ..routine import Backend, Routine, cuda_only
from .norm import _flashinfer, flashinfer_version, kiln_version, torch_version


def kiln_group(inp, ctx):
    x, gs, cm = inp["x"], inp["group_size"], inp["column_major_scales"]
    return lambda: kiln.per_token_group_quant_fp8(x, group_size=gs, column_major_scales=cm)


def torch_group(inp, ctx):
    x, gs = inp["x"], inp["group_size"]
    return lambda: group_quant_reference_fp8(x, gs)


def kiln_tensor(inp, ctx):
    x, scale = inp["x"], inp["scale"]
    return lambda: kiln.scaled_fp8_quant(x, scale)


def torch_tensor(inp, ctx):
    x, scale = inp["x"], inp["scale"]
    return lambda: tensor_quant_reference_fp8(x, scale)


def quant_bytes(group_size: int | None):
    def count(axes, dtype):
        n = axes["tokens"] * axes["hidden"]
        elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        scales = 4 * (n // group_size if group_size else 1)
        return n * elem + n + scales

    return count


PER_TOKEN_GROUP_QUANT_FP8 = Routine(
    api=kiln.per_token_group_quant_fp8,
    backends=(Backend("kiln", kiln_group, version=kiln_version),
              Backend("torch", torch_group, version=torch_version)),
    bytes_per_call=quant_bytes(128),
)
SCALED_FP8_QUANT = Routine(
    api=kiln.scaled_fp8_quant,
    backends=(Backend("kiln", kiln_tensor, version=kiln_version),
              Backend("torch", torch_tensor, version=torch_version)),
    # Dynamic: the input is read twice (absmax, then quantisation); counted once, as the floor.
    bytes_per_call=quant_bytes(None),
)



def flashinfer_available(device, dtype):
    return cuda_only(device) or _flashinfer()[1]


def packbits_setup(module=None):
    def setup(inp, ctx):
        fn = module().quantization.packbits if module else kiln.packbits
        x, order = inp["x"], inp["bitorder"]
        return lambda: fn(x, order)

    return setup


def segment_setup(module=None):
    def setup(inp, ctx):
        fn = module().quantization.segment_packbits if module else kiln.segment_packbits
        x, indptr, order = inp["x"], inp["indptr"], inp["bitorder"]
        return lambda: fn(x, indptr, order)

    return setup


def torch_packbits(inp, ctx):
    x, order = inp["x"], inp["bitorder"]
    return lambda: packbits_reference(x, order)


def torch_segment(inp, ctx):
    x, indptr, order = inp["x"], inp["indptr"], inp["bitorder"]
    return lambda: segment_packbits_reference(x, indptr, order)


def _fi():
    return _flashinfer()[0]


def pack_bytes(axes, dtype):
    n = axes.get("batch_size", 1) * axes["tokens"] * axes["kv_len"]
    return n + (n + 7) // 8


PACKBITS = Routine(
    api=kiln.packbits,
    backends=(Backend("kiln", packbits_setup(), version=kiln_version),
              Backend("torch", torch_packbits, version=torch_version),
              Backend("flashinfer", packbits_setup(_fi), available=flashinfer_available,
                      version=flashinfer_version)),
    bytes_per_call=pack_bytes,
)
SEGMENT_PACKBITS = Routine(
    api=kiln.segment_packbits,
    backends=(Backend("kiln", segment_setup(), version=kiln_version),
              Backend("torch", torch_segment, version=torch_version),
              Backend("flashinfer", segment_setup(_fi), available=flashinfer_available,
                      version=flashinfer_version)),
    bytes_per_call=pack_bytes,
)

ROUTINES = (PER_TOKEN_GROUP_QUANT_FP8, SCALED_FP8_QUANT, PACKBITS, SEGMENT_PACKBITS)
