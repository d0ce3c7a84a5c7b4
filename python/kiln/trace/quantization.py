"""Trace templates of kiln.quantization's APIs: per_token_group_quant_fp8, scaled_fp8_quant,
packbits and segment_packbits.

fp8: axes `tokens` (var: rows quantised) x `hidden` (const: the activation width). The reference is
the formula with float32 results and torch's own E4M3 rounding (round to nearest even):
scale = absmax / 448, x_q = (x / scale).clamp(-448, 448).to(float8_e4m3fn), 0 where scale == 0.
Each float32 quotient is the IEEE (correctly rounded) one: it is evaluated in float64 and rounded
once to float32, which gives exactly the float32 division's result (a float64 quotient of two
float32 values rounds to float32 without a double-rounding error: 53 >= 2 * 24 + 2 bits). So the
reference does not depend on the device or on torch's kernels: torch's CUDA division of a tensor by
a Python number multiplies by the float32 reciprocal, one ulp off for about half of all values. The
kernels match it bit for bit, so the tolerance is zero (the references return the fp8 values
decoded to float32, exactly; the tests compare the bits).

packbits: the bits of each group of 8 booleans weighted 128 .. 1 (big) or 1 .. 128 (little) and
summed; exact (tolerance zero).
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


def div_f32(a, b):
    """a / b for float32 a and b: the correctly rounded float32 quotient, on any device (evaluated
    in float64, rounded once)."""
    return (a.double() / torch.as_tensor(b, dtype=torch.float64, device=a.device)).float()


def div_448(a):
    """a / 448, the float32 division (never torch's CUDA `a / 448`, a reciprocal product)."""
    return div_f32(a.float(), FP8_MAX)


def quantize_e4m3(x, scale):
    """x / scale in float32, rounded to E4M3 (nearest even, saturated at +-448); 0 where scale == 0."""
    q = div_f32(x.float(), scale.float()).clamp(-FP8_MAX, FP8_MAX)
    return torch.where(scale == 0, torch.zeros_like(q), q).to(torch.float8_e4m3fn)


def group_quant_reference_fp8(x, group_size):
    """(x_q, x_s) of per-token-group quantisation, scales [..., hidden / group_size] row-major."""
    g = x.float().unflatten(-1, (-1, group_size))
    scale = div_448(g.abs().amax(-1, keepdim=True))
    return quantize_e4m3(g, scale).flatten(-2), scale.squeeze(-1)


def tensor_quant_reference_fp8(x, scale=None):
    if scale is None:  # the absmax of no values is 0 (the kernels' scale starts there)
        absmax = x.float().abs().amax() if x.numel() else torch.zeros((), device=x.device)
        scale = div_448(absmax).reshape(1)
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


# ---- packbits ------------------------------------------------------------------------------------

PACK_AXES = {
    "tokens": var("query rows of a custom attention mask (its bits are what is packed)"),
    "kv_len": var("key columns of the mask"),
}
PACK_SMALL = ({"tokens": 1, "kv_len": 5}, {"tokens": 7, "kv_len": 33})
SEGMENT_AXES = {"batch_size": var("requests, one mask (segment) each"), **PACK_AXES}
SEGMENT_SMALL = ({"batch_size": 1, "tokens": 1, "kv_len": 5}, {"batch_size": 3, "tokens": 7, "kv_len": 33})
# Custom masks packed for BatchPrefillWithPaged/RaggedKVCacheWrapper's custom_mask (FlashInfer packs
# them with these APIs): speculative-decoding trees of up to 256 tokens over a 4k context, and
# square prefill masks of 1k-8k tokens.
PACK_EXAMPLES = (
    Example(name="llama-3.1-8b-decode", model="llama-3.1-8b", phase="decode", consts={},
            workloads=tuple({"tokens": t, "kv_len": 4096} for t in DECODE_BATCHES),
            source="a tree-attention mask over a 4096-token context"),
    Example(name="llama-3.1-8b-prefill", model="llama-3.1-8b", phase="prefill", consts={},
            workloads=tuple({"tokens": t, "kv_len": t} for t in PREFILL_TOKENS),
            source="a square prefill mask"),
)
SEGMENT_EXAMPLES = (
    Example(name="llama-3.1-8b-decode", model="llama-3.1-8b", phase="decode", consts={},
            workloads=tuple({"batch_size": b, "tokens": 4, "kv_len": 4096} for b in DECODE_BATCHES),
            source="4-token speculative trees over a 4096-token context, one per request"),
    Example(name="llama-3.1-8b-prefill", model="llama-3.1-8b", phase="prefill", consts={},
            workloads=tuple({"batch_size": 2, "tokens": t, "kv_len": t} for t in PREFILL_TOKENS),
            source="square prefill masks of 2 requests"),
)


def packbits_reference(x, bitorder):
    """numpy.packbits: each group of 8 (the last zero-padded) weighted by its bits' places."""
    n = x.shape[0]
    bits = torch.zeros((n + 7) // 8 * 8, dtype=torch.int32, device=x.device)
    bits[:n] = (x != 0).int()
    places = 2 ** torch.arange(8, device=x.device, dtype=torch.int32)
    weights = places.flip(0) if bitorder == "big" else places
    return (bits.view(-1, 8) * weights).sum(-1).to(torch.uint8)


def packbits_template_reference(x, bitorder):
    return {"y": packbits_reference(x, bitorder)}


def segment_packbits_reference(x, indptr, bitorder):
    bounds = indptr.long().tolist()
    parts = [packbits_reference(x[a:b], bitorder) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    new = torch.zeros(len(bounds), dtype=torch.int64)
    new[1:] = torch.tensor([len(p) for p in parts], dtype=torch.int64).cumsum(0)
    y = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=x.device)
    return {"y": y, "new_indptr": new.to(device=x.device, dtype=torch.int32)}


def mask_inputs(template, axes, dtype, device, gen):
    n = axes.get("batch_size", 1) * axes["tokens"] * axes["kv_len"]
    made = {"x": (torch.rand(n, generator=gen) < 0.5).to(device)}
    if "batch_size" in axes:
        made["indptr"] = (torch.arange(axes["batch_size"] + 1) * axes["tokens"] * axes["kv_len"]).to(device)
    return made


PACKBITS = TraceTemplate(
    name="packbits",
    target="//ops/quantization:packbits",
    description="y[j] = the bits of x[8j:8j+8] (numpy.packbits), big or little bit order",
    axes=PACK_AXES,
    inputs={"x": Tensor(("tokens * kv_len",), "bool", "the mask, flattened"),
            "bitorder": Scalar("str", "big", "'big': element 8j at bit 7; 'little': at bit 0")},
    outputs={"y": Tensor(("cdiv(tokens * kv_len, 8)",), "uint8")},
    reference=packbits_template_reference,
    tolerance={"bool": (0.0, 0.0)},
    examples=PACK_EXAMPLES,
    small=PACK_SMALL,
    make_inputs=mask_inputs,
)

SEGMENT_PACKBITS = TraceTemplate(
    name="segment_packbits",
    target="//ops/quantization:packbits",
    description="packbits of each segment x[indptr[i]:indptr[i+1]], concatenated; the new indptr",
    axes=SEGMENT_AXES,
    inputs={"x": Tensor(("batch_size * tokens * kv_len",), "bool", "the masks, flattened and concatenated"),
            "indptr": Tensor(("batch_size + 1",), "int64", "segment i is x[indptr[i]:indptr[i+1]]"),
            "bitorder": Scalar("str", "big", "'big' or 'little'")},
    outputs={"y": Tensor(("batch_size * cdiv(tokens * kv_len, 8)",), "uint8"),
             "new_indptr": Tensor(("batch_size + 1",), "int32", "segment i's bytes: y[new[i]:new[i+1]]")},
    reference=segment_packbits_reference,
    tolerance={"bool": (0.0, 0.0)},
    examples=SEGMENT_EXAMPLES,
    small=SEGMENT_SMALL,
    make_inputs=mask_inputs,
)
