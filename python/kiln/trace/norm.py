"""Trace templates of kiln.norm's APIs: rmsnorm, fused_add_rmsnorm and the Gemma variants,
layernorm, and the fp8-quantised rmsnorm_quant, fused_add_rmsnorm_quant and layernorm_quant.

Axes: `tokens` (var: rows in the batch: decode batch size or prefill tokens) x `hidden` (const:
the model's hidden size). The references compute in float64; the fused ones round the residual
sum to the input dtype first, as the API does. Tolerances per dtype: the kernel rounds once at the
output (half an ulp: 2^-24, 2^-11, 2^-8 relative) after float32 accumulation; the bound allows one
ulp plus accumulation-order error (the same bounds as tests/ops/norm).

The quantised references round the float64 result times 1 / scale to fp8 (nearest even, clamped
to the format's largest finite value first, as the kernels saturate). A float32 result a hair
away from a rounding midpoint can land one fp8 step away, and nothing more: one E4M3 step is at
most 2^-3 of the value (three mantissa bits) and 2^-9 among the subnormals, hence the tolerance
(0.125, 2^-9) for every dtype.
"""

from __future__ import annotations

import torch

from .examples import DECODE_BATCHES, GEMMA_MODELS, LLM_MODELS, PREFILL_TOKENS, Model
from .template import Example, Scalar, Tensor, TraceTemplate, const, entry_tensors, var

TOLERANCE = {"bfloat16": (1.6e-2, 8e-3), "float16": (2e-3, 1e-3), "float32": (2e-5, 2e-5)}
AXES = {
    "tokens": var("rows normalised in one call: decode batch size or prefill tokens"),
    "hidden": const(doc="the model's hidden size, normalised over"),
}
# The tensors of the BUILD file's entries, in trace axes: rows (tokens, hidden), weight (hidden,);
# fused_add_rmsnorm's input and residual are inputs and outputs both.
_AXES = {"rows": "tokens", "hidden": "hidden"}
RMS_IN, RMS_OUT = entry_tensors("//ops:norm", "rmsnorm", _AXES)
FUSED_IN, FUSED_OUT = entry_tensors("//ops:norm", "fused_add_rmsnorm", _AXES)
LN_IN, LN_OUT = entry_tensors("//ops:norm", "layernorm", _AXES)
ROWS, WEIGHT = RMS_IN["input"], RMS_IN["weight"]
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


def fp8_of(y, scale, dtype=torch.float8_e4m3fn):
    """y * (1 / scale) rounded to the fp8 `dtype` (nearest even, saturated), decoded to float32."""
    top = torch.finfo(dtype).max
    return (y.double() * (1.0 / scale.double())).clamp(-top, top).float().to(dtype).float()


def rmsnorm_quant_reference(out, input, weight, scale, eps):
    return {"out": fp8_of(rms_norm_float64(input, weight, eps, 0.0), scale, out.dtype)}


def fused_add_rmsnorm_quant_reference(out, input, residual, weight, scale, eps):
    summed = (input.float() + residual.float()).to(input.dtype)
    return {"out": fp8_of(rms_norm_float64(summed, weight, eps, 0.0), scale, out.dtype), "residual": summed}


def layernorm_quant_reference(out, input, gemma, beta, scale, eps):
    return {"out": fp8_of(layer_norm_float64(input, gemma, beta, eps), scale, out.dtype)}


def quant_inputs(template, axes, dtype, device, gen):
    """The fp8 output (zeros) and a static scale: 1/32 maps the outputs' typical range (|y| up to
    ~15 with standard-normal weights) onto E4M3's +-448, as a calibrated scale would."""
    return {"out": torch.zeros((axes["tokens"], axes["hidden"]), dtype=torch.float8_e4m3fn, device=device),
            "scale": torch.full((1,), 1.0 / 32, dtype=torch.float32, device=device)}


PDL_OPTION = {"enable_pdl": "launch detail: programmatic dependent launch on sm90+, no workload"}
QUANT_TOLERANCE = {"bfloat16": (0.125, 2.0**-9), "float16": (0.125, 2.0**-9), "float32": (0.125, 2.0**-9)}
FP8_ROWS = Tensor(("tokens", "hidden"), "float8_e4m3fn")
SCALE = Tensor(("1",), "float32", "the static per-tensor scale")


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
    inputs={**RMS_IN, "eps": EPS},
    outputs=RMS_OUT,
    reference=rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
    options=PDL_OPTION,
)

FUSED_ADD_RMSNORM = TraceTemplate(
    name="fused_add_rmsnorm",
    target="//ops:norm",
    description="in place: residual += input; input = rmsnorm(residual, weight, eps)",
    axes=AXES,
    inputs={**FUSED_IN, "eps": EPS},
    outputs=FUSED_OUT,
    reference=fused_add_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
    options=PDL_OPTION,
)

GEMMA_RMSNORM = TraceTemplate(
    name="gemma_rmsnorm",
    target="//ops:norm",
    description="out = input / sqrt(mean(input^2, -1) + eps) * (1 + weight)",
    axes=AXES,
    inputs={**RMS_IN, "eps": EPS},
    outputs=RMS_OUT,
    reference=gemma_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(GEMMA_MODELS),
    small=SMALL,
    options=PDL_OPTION,
)

GEMMA_FUSED_ADD_RMSNORM = TraceTemplate(
    name="gemma_fused_add_rmsnorm",
    target="//ops:norm",
    description="in place: residual += input; input = gemma_rmsnorm(residual, weight, eps)",
    axes=AXES,
    inputs={**FUSED_IN, "eps": EPS},
    outputs=FUSED_OUT,
    reference=gemma_fused_add_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(GEMMA_MODELS),
    small=SMALL,
    options=PDL_OPTION,
)

LAYERNORM = TraceTemplate(
    name="layernorm",
    target="//ops:norm",
    description="out = (input - mean) / sqrt(var + eps) * gemma + beta (gemma, beta float32)",
    axes=AXES,
    inputs={**LN_IN, "eps": EPS},
    outputs=LN_OUT,
    reference=layernorm_reference,
    tolerance=TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
)

RMSNORM_QUANT = TraceTemplate(
    name="rmsnorm_quant",
    target="//ops:norm",
    description="out = fp8(input / sqrt(mean(input^2, -1) + eps) * weight / scale)",
    axes=AXES,
    inputs={"out": FP8_ROWS, "input": ROWS, "weight": WEIGHT, "scale": SCALE, "eps": EPS},
    outputs={"out": FP8_ROWS},
    reference=rmsnorm_quant_reference,
    tolerance=QUANT_TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
    options=PDL_OPTION,
    make_inputs=quant_inputs,
)

FUSED_ADD_RMSNORM_QUANT = TraceTemplate(
    name="fused_add_rmsnorm_quant",
    target="//ops:norm",
    description="residual += input (in place); out = fp8(rmsnorm(residual, weight, eps) / scale)",
    axes=AXES,
    inputs={"out": FP8_ROWS, "input": ROWS, "residual": ROWS, "weight": WEIGHT, "scale": SCALE, "eps": EPS},
    outputs={"out": FP8_ROWS, "residual": ROWS},
    reference=fused_add_rmsnorm_quant_reference,
    tolerance=QUANT_TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
    options=PDL_OPTION,
    make_inputs=quant_inputs,
)

LAYERNORM_QUANT = TraceTemplate(
    name="layernorm_quant",
    target="//ops:norm",
    description="out = fp8(((input - mean) / sqrt(var + eps) * gemma + beta) / scale) (gemma, beta float32)",
    axes=AXES,
    inputs={"out": FP8_ROWS, "input": ROWS, "gemma": LN_IN["gemma"], "beta": LN_IN["beta"], "scale": SCALE,
            "eps": EPS},
    outputs={"out": FP8_ROWS},
    reference=layernorm_quant_reference,
    tolerance=QUANT_TOLERANCE,
    examples=norm_examples(LLM_MODELS),
    small=SMALL,
    make_inputs=quant_inputs,
)
