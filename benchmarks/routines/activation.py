"""Routines of kiln.activation: silu_and_mul, gelu_and_mul and gelu_tanh_and_mul, each against
torch (what an eager model writes: F.silu(x[..., :d]) * x[..., d:]) and FlashInfer (when
importable; CUDA, float16/bfloat16 only).

Outputs given to `out=` start as NaN, so an element a backend never writes fails the reference check.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln

from ..routine import Backend, Routine
from .norm import _flashinfer, _poisoned, cuda_only, flashinfer_version, kiln_version, torch_version


def flashinfer_available(device: torch.device, dtype: str) -> str | None:
    if dtype not in ("float16", "bfloat16"):
        return f"FlashInfer's activation kernels take float16 and bfloat16, not {dtype}"
    return cuda_only(device) or _flashinfer()[1]


def _out(x):
    return _poisoned(x[..., : x.shape[-1] // 2])


def kiln_setup(api):
    def setup(inp, ctx):
        x = inp["input"]
        out = _out(x)
        return lambda: api(x, out=out)

    return setup


TORCH_ACTS = {
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def torch_setup(act):
    def setup(inp, ctx):
        x = inp["input"]
        d = x.shape[-1] // 2
        fn = TORCH_ACTS[act]
        return lambda: fn(x[..., :d]) * x[..., d:]

    return setup


def flashinfer_setup(name):
    def setup(inp, ctx):
        fn = getattr(_flashinfer()[0], name)
        x = inp["input"]
        out = _out(x)
        return lambda: fn(x, out=out)

    return setup


def _routine(api, act):
    name = f"{act}_and_mul"
    return Routine(
        api=api,
        backends=(
            Backend("kiln", kiln_setup(api), version=kiln_version),
            Backend("torch", torch_setup(act), version=torch_version),
            Backend("flashinfer", flashinfer_setup(name), available=flashinfer_available,
                    version=flashinfer_version),
        ),
        # act (~10 FLOPs with its exp/erf/tanh counted as one) and the product, per output element.
        flops_per_call=lambda axes, dtype: 11 * axes["tokens"] * axes["intermediate"],
    )


SILU_AND_MUL = _routine(kiln.silu_and_mul, "silu")
GELU_AND_MUL = _routine(kiln.gelu_and_mul, "gelu")
GELU_TANH_AND_MUL = _routine(kiln.gelu_tanh_and_mul, "gelu_tanh")

ROUTINES = (SILU_AND_MUL, GELU_AND_MUL, GELU_TANH_AND_MUL)
