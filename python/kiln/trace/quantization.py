"""Trace templates of kiln.quantization's APIs: per_token_group_quant_fp8 and scaled_fp8_quant.

Axes: `tokens` (var: rows quantised) x `hidden` (const: the activation width). The reference is
the formula evaluated by torch in float32 with torch's own E4M3 rounding (round to nearest even):
scale = absmax / 448, x_q = (x / scale).clamp(-448, 448).to(float8_e4m3fn), 0 where scale == 0. The
kernels match it bit for bit, so the tolerance is zero (the references return the fp8 values
decoded to float32, exactly; the tests compare the bits).
"""

from __future__ import annotations

import torch

from .examples import DECODE_BATCHES, LLM_MODELS, PREFILL_TOKENS
from .template import Example, Scalar, Tensor, TraceTemplate, const, var

FP8_MAX = 448.0
TOLERANCE = {"bfloat16": (0.0, 0.0), "float16": (0.0, 0.0), "float32": (0.0, 0.0)}
AXES = {
    "tokens": var("rows quantised in one call: decode batch size or prefill tokens"),
    "hidden": const(doc="the activation width (a GEMM's K)"),
}
X = Tensor(("tokens", "hidden"))
X_Q = Tensor(("tokens", "hidden"), "float8_e4m3fn")
SMALL = ({"tokens": 1}, {"tokens": 33})
EXAMPLES = tuple(
    Example(name=f"{m.name}-{phase}", model=m.name, phase=phase, consts={"hidden": m.hidden},
            workloads=tuple({"tokens": t} for t in tokens), source=m.source)
    for m in LLM_MODELS for phase, tokens in (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS)))


def div_448(a):
    """a / 448 as a float32 division. Against a tensor of 448s, not the Python number: torch's CUDA
    division by a scalar multiplies by its reciprocal, which is not exactly 1/448 and can land one
    ulp away from the division."""
    return a / torch.full_like(a, FP8_MAX)


def quantize_e4m3(x, scale):
    """x / scale in float32, rounded to E4M3 (nearest even, saturated at +-448); 0 where scale == 0."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX)
    return torch.where(scale == 0, torch.zeros_like(q), q).to(torch.float8_e4m3fn)


def group_quant_reference_fp8(x, group_size):
    """(x_q, x_s) of per-token-group quantisation, scales [..., hidden / group_size] row-major."""
    g = x.float().unflatten(-1, (-1, group_size))
    scale = div_448(g.abs().amax(-1, keepdim=True))
    return quantize_e4m3(g, scale).flatten(-2), scale.squeeze(-1)


def tensor_quant_reference_fp8(x, scale=None):
    if scale is None:
        scale = div_448(x.float().abs().amax()).reshape(1)
    return quantize_e4m3(x.float(), scale), scale


# The template references return the fp8 values decoded to float32 (exact: every E4M3 value is a
# float32), since torch implements few ops on float8 tensors; the tests compare the fp8 bits.
def per_token_group_quant_fp8_reference(x, group_size, column_major_scales):
    x_q, x_s = group_quant_reference_fp8(x, group_size)
    return {"x_q": x_q.float(), "x_s": x_s}


def scaled_fp8_quant_reference(x, scale):
    x_q, s = tensor_quant_reference_fp8(x, scale)
    return {"x_q": x_q.float(), "x_scale": s}


def dynamic_scale_inputs(template, axes, dtype, device, gen):
    """The workload is the dynamic quantiser: no scale given."""
    return {"scale": None}


PER_TOKEN_GROUP_QUANT_FP8 = TraceTemplate(
    name="per_token_group_quant_fp8",
    target="//ops:quantization",
    description="x_s = absmax(group) / 448 per 1 x group_size group; x_q = e4m3(x / x_s)",
    axes=AXES,
    inputs={"x": X, "group_size": Scalar("int64", 128, "elements per scale"),
            "column_major_scales": Scalar("bool", False, "scales stored [groups, tokens] (transposed view)")},
    outputs={"x_q": X_Q, "x_s": Tensor(("tokens", "hidden // 128"), "float32")},
    reference=per_token_group_quant_fp8_reference,
    tolerance=TOLERANCE,
    examples=EXAMPLES,
    small=SMALL,
)

SCALED_FP8_QUANT = TraceTemplate(
    name="scaled_fp8_quant",
    target="//ops:quantization",
    description="x_q = e4m3(x / scale), scale = absmax(x) / 448 when none is given",
    axes=AXES,
    inputs={"x": X, "scale": Tensor(("1",), "float32", "a given scale, or None: dynamic (the workload)")},
    outputs={"x_q": X_Q, "x_scale": Tensor(("1",), "float32", "the scale used")},
    reference=scaled_fp8_quant_reference,
    tolerance=TOLERANCE,
    examples=EXAMPLES,
    small=SMALL,
    make_inputs=dynamic_scale_inputs,
)
