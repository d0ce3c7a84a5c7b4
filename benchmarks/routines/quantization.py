"""Routines of kiln.quantization: per_token_group_quant_fp8 and scaled_fp8_quant, each against
torch (the formula as an eager model writes it: kiln.trace.quantization's reference, also the
bit-exact specification). FlashInfer 0.7 has neither op; vLLM and SGLang, which do, are not among
the peers installed on the device.

Bytes per call: the input read once, one byte per element written, the scales.
"""

from __future__ import annotations

import torch

import kiln
from kiln.trace.quantization import group_quant_reference_fp8, tensor_quant_reference_fp8

from ..routine import Backend, Routine
from .norm import kiln_version, torch_version


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

ROUTINES = (PER_TOKEN_GROUP_QUANT_FP8, SCALED_FP8_QUANT)
