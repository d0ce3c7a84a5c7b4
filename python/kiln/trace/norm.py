"""Trace templates of kiln.norm's APIs: rmsnorm, fused_add_rmsnorm and the Gemma variants.

Axes: `tokens` (var: rows in the batch: decode batch size or prefill tokens) x `hidden` (const:
the model's hidden size). The references compute in float64; the fused ones round the residual
sum to the input dtype first, as the API does. Tolerances per dtype: the kernel rounds once at the
output (half an ulp: 2^-24, 2^-11, 2^-8 relative) after float32 accumulation; the bound allows one
ulp plus accumulation-order error (the same bounds as tests/ops/norm).
"""

from __future__ import annotations

import torch

from .examples import DECODE_BATCHES, GEMMA_MODELS, LLM_MODELS, PREFILL_TOKENS, Model
from .template import Example, Scalar, Tensor, TraceTemplate, const, var

TOLERANCE = {"bfloat16": (1.6e-2, 8e-3), "float16": (2e-3, 1e-3), "float32": (2e-5, 2e-5)}
AXES = {
    "tokens": var("rows normalised in one call: decode batch size or prefill tokens"),
    "hidden": const(doc="the model's hidden size, normalised over"),
}
ROWS = Tensor(("tokens", "hidden"))
WEIGHT = Tensor(("hidden",))
EPS = Scalar("float32", 1e-6, "added to the mean square")
# Small CPU workloads for CI: one row, and an odd count that exercises the row loop.
SMALL = ({"tokens": 1}, {"tokens": 33})


def norm_examples(models: tuple[Model, ...]) -> tuple[Example, ...]:
    phases = (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS))
    return tuple(
        Example(name=f"{m.name}-{phase}", model=m.name, phase=phase, consts={"hidden": m.hidden},
                workloads=tuple({"tokens": t} for t in tokens), scalars={"eps": m.rms_eps},
                source=m.source)
        for m in models for phase, tokens in phases)


def rms_norm_float64(x, weight, eps, weight_offset=0.0):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (weight.double() + weight_offset)


def layer_norm_float64(x, gemma, beta, eps):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps) * gemma.double() + beta.double()


def layernorm_reference(input, gemma, beta, eps):
    return {"out": layer_norm_float64(input, gemma, beta, eps)}


def rmsnorm_reference(input, weight, eps):
    return {"out": rms_norm_float64(input, weight, eps, 0.0)}


def fused_add_rmsnorm_reference(input, residual, weight, eps):
    summed = (input.float() + residual.float()).to(input.dtype)
    return {"input": rms_norm_float64(summed, weight, eps, 0.0), "residual": summed}


def gemma_rmsnorm_reference(input, weight, eps):
    return {"out": rms_norm_float64(input, weight, eps, 1.0)}


def gemma_fused_add_rmsnorm_reference(input, residual, weight, eps):
    summed = (input.float() + residual.float()).to(input.dtype)
    return {"input": rms_norm_float64(summed, weight, eps, 1.0), "residual": summed}


RMSNORM = TraceTemplate(
    name="rmsnorm",
    target="//ops:norm",
    description="out = input / sqrt(mean(input^2, -1) + eps) * weight",
    axes=AXES,
    inputs={"input": ROWS, "weight": WEIGHT, "eps": EPS},
    outputs={"out": ROWS},
    reference=rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
)

FUSED_ADD_RMSNORM = TraceTemplate(
    name="fused_add_rmsnorm",
    target="//ops:norm",
    description="in place: residual += input; input = rmsnorm(residual, weight, eps)",
    axes=AXES,
    inputs={"input": ROWS, "residual": ROWS, "weight": WEIGHT, "eps": EPS},
    outputs={"input": ROWS, "residual": ROWS},
    reference=fused_add_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
)

GEMMA_RMSNORM = TraceTemplate(
    name="gemma_rmsnorm",
    target="//ops:norm",
    description="out = input / sqrt(mean(input^2, -1) + eps) * (1 + weight)",
    axes=AXES,
    inputs={"input": ROWS, "weight": WEIGHT, "eps": EPS},
    outputs={"out": ROWS},
    reference=gemma_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(GEMMA_MODELS),
    small=SMALL,
)

GEMMA_FUSED_ADD_RMSNORM = TraceTemplate(
    name="gemma_fused_add_rmsnorm",
    target="//ops:norm",
    description="in place: residual += input; input = gemma_rmsnorm(residual, weight, eps)",
    axes=AXES,
    inputs={"input": ROWS, "residual": ROWS, "weight": WEIGHT, "eps": EPS},
    outputs={"input": ROWS, "residual": ROWS},
    reference=gemma_fused_add_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(GEMMA_MODELS),
    small=SMALL,
)

LAYERNORM = TraceTemplate(
    name="layernorm",
    target="//ops:norm",
    description="out = (input - mean) / sqrt(var + eps) * gemma + beta (gemma, beta float32)",
    axes=AXES,
    inputs={"input": ROWS, "gemma": Tensor(("hidden",), "float32"), "beta": Tensor(("hidden",), "float32"),
            "eps": EPS},
    outputs={"out": ROWS},
    reference=layernorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
)
