"""Trace templates of kiln.rope's APIs: apply_rope, apply_rope_pos_ids, apply_llama31_rope(_pos_ids),
apply_rope_with_cos_sin_cache, each one's _inplace variant, and rope_quantize_fp8 /
mla_rope_quantize_fp8 (RoPE from a cos/sin cache fused with fp8 quantisation).

Axes: `tokens` (var: q/k rows), `batch_size` (var: requests of indptr), and the model's consts
`num_q_heads`, `num_kv_heads`, `head_dim`; the cos/sin cache has `max_pos` rows. The reference
computes the frequencies, angles and rotation in float64 from the definition (FlashInfer's
convention: freq(i) = 1 / (rope_scale * rope_theta^(2i / rotary_dim))); dims past rotary_dim are
the input's own values. Tolerances: the kernel's angle pos * freq is a float32 product (an absolute
error up to ~ulp(pos * freq), 1e-3 rad at position 8192), then one rounding of each output; atol
covers the angle error times |x|, rtol the rounding (2^-8, 2^-11).

rope_quantize_fp8's reference is the exact rotation (float64) times the scale, unrounded; the
kernel's float32 result rounded once to E4M3 lies within half an E4M3 step of it: 2^-4 relative
for normal values (rtol 0.063, the float32 error included), 2^-10 absolute among the subnormals
(atol 1e-3).
"""

from __future__ import annotations

import math

import torch

from .examples import DECODE_BATCHES, LLM_MODELS, PREFILL_TOKENS
from .template import Example, Scalar, Tensor, TraceTemplate, const, entry_tensors, var

TOLERANCE = {"bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 4e-3)}
MAX_POS = 8192  # rows of the benchmark's cos/sin cache and the range of its positions
AXES = {
    "tokens": var("q/k rows rotated in one call: decode batch size or prefill tokens"),
    "batch_size": var("requests in indptr/offsets"),
    "num_q_heads": const(doc="query heads"),
    "num_kv_heads": const(doc="key heads"),
    "head_dim": const(doc="the head dimension (rotary_dim defaults to it)"),
}
CACHE_AXES = {
    "tokens": AXES["tokens"],
    "num_q_heads": AXES["num_q_heads"],
    "num_kv_heads": AXES["num_kv_heads"],
    "head_dim": AXES["head_dim"],
    "max_pos": const(MAX_POS, "rows of cos_sin_cache (the positions it covers)"),
}
# q (tokens, num_q_heads, head_dim) and k (tokens, num_kv_heads, head_dim), from the BUILD file's entry
_QK, _ = entry_tensors("//ops:rope", "rope_pos_ids", {"nnz": "tokens", "q_heads": "num_q_heads",
                                                      "k_heads": "num_kv_heads", "head_dim": "head_dim"},
                       skip=("q_out", "k_out", "pos_ids"))
Q, K = _QK["q"], _QK["k"]
INDPTR = Tensor(("batch_size + 1",), "int32", "request b holds tokens [indptr[b], indptr[b+1])")
OFFSETS = Tensor(("batch_size",), "int32", "the position of each request's first token")
POS_IDS = Tensor(("tokens",), "int32", "each token's position")
SMALL = ({"tokens": 1, "batch_size": 1}, {"tokens": 33, "batch_size": 3})
SMALL_CACHE = ({"tokens": 1}, {"tokens": 33})
# Llama 3.1's published rope_scaling (factor 8, low 1, high 4, original context 8192, theta 5e5).
LLAMA31 = {
    "rope_scale": 8,
    "rope_theta": 5e5,
    "low_freq_factor": 1,
    "high_freq_factor": 4,
    "old_context_len": 8192,
}


def _examples(with_batch: bool):
    def workload(tokens, phase):
        if not with_batch:
            return {"tokens": tokens}
        # Decode: one token per request; prefill: prompts of ~1k tokens.
        return {"tokens": tokens, "batch_size": tokens if phase == "decode" else max(1, tokens // 1024)}

    return tuple(
        Example(
            name=f"{m.name}-{phase}",
            model=m.name,
            phase=phase,
            consts={"num_q_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim},
            workloads=tuple(workload(t, phase) for t in tokens),
            source=m.source,
        )
        for m in LLM_MODELS
        for phase, tokens in (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS))
    )


# ---- the reference -----------------------------------------------------------------------------


def rope_frequencies_float64(rotary_dim, rope_scale=1.0, rope_theta=1e4, llama31=None):
    """freq(i), i < rotary_dim / 2. llama31: (low_freq_factor, high_freq_factor, old_context_len)
    blends each frequency between f / rope_scale (long wavelengths) and f (short ones)."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    f = float(rope_theta) ** (-2.0 * i / rotary_dim)
    if llama31 is None:
        return f / rope_scale
    low, high, old = llama31
    smooth = ((old * f / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)
    return (1.0 - smooth) * f / rope_scale + smooth * f


def rotate_float64(x, cos, sin, interleave):
    """x [nnz, heads, head_dim] rotated over its first 2 * cos.shape[-1] dims by the per-token angles
    (cos, sin [nnz, rotary_dim / 2]); the rest is x itself. float64."""
    x = x.double()
    rd = 2 * cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.clone()
    if interleave:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2], out[..., 1:rd:2] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        x1, x2 = x[..., : rd // 2], x[..., rd // 2 : rd]
        out[..., : rd // 2], out[..., rd // 2 : rd] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def positions_of(indptr, offsets, nnz):
    """Token t of request b (indptr[b] <= t < indptr[b+1]) is at offsets[b] + t - indptr[b]."""
    indptr, offsets = indptr.long().cpu(), offsets.long().cpu()
    pos = torch.empty(nnz, dtype=torch.int64)
    for b in range(len(offsets)):
        lo, hi = int(indptr[b]), int(indptr[b + 1])
        pos[lo:hi] = offsets[b] + torch.arange(hi - lo)
    return pos


def rope_float64(q, k, pos, rotary_dim=None, interleave=False, rope_scale=1.0, rope_theta=1e4, llama31=None):
    rd = q.shape[-1] if rotary_dim is None else rotary_dim
    angle = (
        pos.double().cpu()[:, None] * rope_frequencies_float64(rd, rope_scale, rope_theta, llama31)[None, :]
    )
    cos, sin = angle.cos().to(q.device), angle.sin().to(q.device)
    return rotate_float64(q, cos, sin, interleave), rotate_float64(k, cos, sin, interleave)


def rope_cos_sin_float64(positions, query, key, head_size, cos_sin_cache, is_neox):
    half = cos_sin_cache.shape[-1] // 2
    rows = cos_sin_cache.double()[positions.long()]
    cos, sin = rows[:, :half], rows[:, half:]
    q = rotate_float64(query.reshape(query.shape[0], -1, head_size), cos, sin, not is_neox)
    k = rotate_float64(key.reshape(key.shape[0], -1, head_size), cos, sin, not is_neox)
    return q.reshape(query.shape), k.reshape(key.shape)


def _llama31(low_freq_factor, high_freq_factor, old_context_len):
    return (low_freq_factor, high_freq_factor, old_context_len)


def apply_rope_reference(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta):
    qr, kr = rope_float64(
        q, k, positions_of(indptr, offsets, q.shape[0]), rotary_dim, interleave, rope_scale, rope_theta
    )
    return {"q_rope": qr, "k_rope": kr}


def apply_rope_inplace_reference(**inputs):  # the rotated q and k, written over the inputs
    out = apply_rope_reference(**inputs)
    return {"q": out["q_rope"], "k": out["k_rope"]}


def apply_rope_pos_ids_reference(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta):
    qr, kr = rope_float64(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta)
    return {"q_rope": qr, "k_rope": kr}


def apply_rope_pos_ids_inplace_reference(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta):
    qr, kr = rope_float64(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta)
    return {"q": qr, "k": kr}


def apply_llama31_rope_reference(
    q,
    k,
    indptr,
    offsets,
    rotary_dim,
    interleave,
    rope_scale,
    rope_theta,
    low_freq_factor,
    high_freq_factor,
    old_context_len,
):
    qr, kr = rope_float64(
        q,
        k,
        positions_of(indptr, offsets, q.shape[0]),
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        _llama31(low_freq_factor, high_freq_factor, old_context_len),
    )
    return {"q_rope": qr, "k_rope": kr}


def apply_llama31_rope_inplace_reference(**inputs):
    out = apply_llama31_rope_reference(**inputs)
    return {"q": out["q_rope"], "k": out["k_rope"]}


def apply_llama31_rope_pos_ids_reference(
    q,
    k,
    pos_ids,
    rotary_dim,
    interleave,
    rope_scale,
    rope_theta,
    low_freq_factor,
    high_freq_factor,
    old_context_len,
):
    qr, kr = rope_float64(
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        _llama31(low_freq_factor, high_freq_factor, old_context_len),
    )
    return {"q_rope": qr, "k_rope": kr}


def apply_llama31_rope_pos_ids_inplace_reference(**inputs):
    out = apply_llama31_rope_pos_ids_reference(**inputs)
    return {"q": out["q_rope"], "k": out["k_rope"]}


def apply_rope_with_cos_sin_cache_reference(positions, query, key, head_size, cos_sin_cache, is_neox):
    q, k = rope_cos_sin_float64(positions, query, key, head_size, cos_sin_cache, is_neox)
    return {"query_out": q, "key_out": k}


def apply_rope_with_cos_sin_cache_inplace_reference(positions, query, key, head_size, cos_sin_cache, is_neox):
    q, k = rope_cos_sin_float64(positions, query, key, head_size, cos_sin_cache, is_neox)
    return {"query": q, "key": k}


# ---- inputs ------------------------------------------------------------------------------------


def indptr_inputs(template, axes, dtype, device, gen):
    """Requests of near-equal length covering the tokens, starting at random positions."""
    tokens, batch = axes["tokens"], axes["batch_size"]
    indptr = torch.div(torch.arange(batch + 1) * tokens, batch, rounding_mode="floor").to(torch.int32)
    offsets = torch.randint(0, MAX_POS // 2, (batch,), generator=gen, dtype=torch.int32)
    return {"indptr": indptr.to(device), "offsets": offsets.to(device)}


def pos_ids_inputs(template, axes, dtype, device, gen):
    return {
        "pos_ids": torch.randint(0, MAX_POS, (axes["tokens"],), generator=gen, dtype=torch.int32).to(device)
    }


def cos_sin_cache_float32(max_pos, rotary_dim, rope_theta=1e4):
    """vLLM's cache: row p = [cos(p * freq), sin(p * freq)] for the plain frequencies, float32."""
    angle = (
        torch.arange(max_pos, dtype=torch.float64)[:, None]
        * rope_frequencies_float64(rotary_dim, 1.0, rope_theta)[None, :]
    )
    return torch.cat([angle.cos(), angle.sin()], dim=-1).float()


def cos_sin_inputs(template, axes, dtype, device, gen):
    positions = torch.randint(0, axes["max_pos"], (axes["tokens"],), generator=gen, dtype=torch.int64)
    return {
        "positions": positions.to(device),
        "cos_sin_cache": cos_sin_cache_float32(axes["max_pos"], axes["head_dim"]).to(device),
    }


# ---- the templates -----------------------------------------------------------------------------


def _scalars(llama31: bool):
    out = {
        "rotary_dim": Scalar("int64", None, "dims rotated; None: head_dim"),
        "interleave": Scalar("bool", False, "GPT-J pairs (2i, 2i+1) instead of NeoX (i, i + rotary_dim/2)"),
        "rope_scale": Scalar("float32", LLAMA31["rope_scale"] if llama31 else 1, "frequencies divided by it"),
        "rope_theta": Scalar("float32", LLAMA31["rope_theta"] if llama31 else 1e4, "the base"),
    }
    if llama31:
        out["low_freq_factor"] = Scalar("float32", 1, "wavelengths past old_context_len / low are scaled")
        out["high_freq_factor"] = Scalar("float32", 4, "wavelengths below old_context_len / high are kept")
        out["old_context_len"] = Scalar("int64", 8192, "the pre-training context length")
    return out


def _template(name, description, positions, in_place, llama31, reference):
    index = {"indptr": INDPTR, "offsets": OFFSETS} if positions == "indptr" else {"pos_ids": POS_IDS}
    outputs = {"q": Q, "k": K} if in_place else {"q_rope": Q, "k_rope": K}
    return TraceTemplate(
        name=name,
        target="//ops:rope",
        description=description,
        axes=AXES if positions == "indptr" else {n: a for n, a in AXES.items() if n != "batch_size"},
        inputs={"q": Q, "k": K, **index, **_scalars(llama31)},
        outputs=outputs,
        reference=reference,
        tolerance=TOLERANCE,
        examples=_examples(positions == "indptr"),
        small=SMALL if positions == "indptr" else SMALL_CACHE,
        make_inputs=indptr_inputs if positions == "indptr" else pos_ids_inputs,
    )


APPLY_ROPE = _template(
    "apply_rope",
    "(q, k) rotated at offsets[b] + t - indptr[b], new tensors",
    "indptr",
    False,
    False,
    apply_rope_reference,
)
APPLY_ROPE_INPLACE = _template(
    "apply_rope_inplace",
    "q, k rotated in place at offsets[b] + t - indptr[b]",
    "indptr",
    True,
    False,
    apply_rope_inplace_reference,
)
APPLY_ROPE_POS_IDS = _template(
    "apply_rope_pos_ids",
    "(q, k) rotated at pos_ids, new tensors",
    "pos_ids",
    False,
    False,
    apply_rope_pos_ids_reference,
)
APPLY_ROPE_POS_IDS_INPLACE = _template(
    "apply_rope_pos_ids_inplace",
    "q, k rotated in place at pos_ids",
    "pos_ids",
    True,
    False,
    apply_rope_pos_ids_inplace_reference,
)
APPLY_LLAMA31_ROPE = _template(
    "apply_llama31_rope",
    "Llama 3.1 RoPE at offsets[b] + t - indptr[b], new tensors",
    "indptr",
    False,
    True,
    apply_llama31_rope_reference,
)
APPLY_LLAMA31_ROPE_INPLACE = _template(
    "apply_llama31_rope_inplace",
    "Llama 3.1 RoPE in place (indptr)",
    "indptr",
    True,
    True,
    apply_llama31_rope_inplace_reference,
)
APPLY_LLAMA31_ROPE_POS_IDS = _template(
    "apply_llama31_rope_pos_ids",
    "Llama 3.1 RoPE at pos_ids, new tensors",
    "pos_ids",
    False,
    True,
    apply_llama31_rope_pos_ids_reference,
)
APPLY_LLAMA31_ROPE_POS_IDS_INPLACE = _template(
    "apply_llama31_rope_pos_ids_inplace",
    "Llama 3.1 RoPE in place at pos_ids",
    "pos_ids",
    True,
    True,
    apply_llama31_rope_pos_ids_inplace_reference,
)

QUERY = Tensor(("tokens", "num_q_heads * head_dim"))
KEY = Tensor(("tokens", "num_kv_heads * head_dim"))


def _cache_template(name, description, in_place, reference):
    return TraceTemplate(
        name=name,
        target="//ops:rope",
        description=description,
        axes=CACHE_AXES,
        inputs={
            "positions": Tensor(("tokens",), "int64", "rows of cos_sin_cache"),
            "query": QUERY,
            "key": KEY,
            "head_size": Scalar("int64", axis="head_dim"),
            "cos_sin_cache": Tensor(("max_pos", "head_dim"), "float32", "cos | sin per position"),
            "is_neox": Scalar("bool", True, "NeoX pairs; False: interleaved"),
        },
        outputs={"query": QUERY, "key": KEY} if in_place else {"query_out": QUERY, "key_out": KEY},
        reference=reference,
        tolerance=TOLERANCE,
        examples=_examples(False),
        small=SMALL_CACHE,
        make_inputs=cos_sin_inputs,
    )


APPLY_ROPE_WITH_COS_SIN_CACHE = _cache_template(
    "apply_rope_with_cos_sin_cache",
    "(query, key) rotated by cos_sin_cache[positions], new tensors",
    False,
    apply_rope_with_cos_sin_cache_reference,
)
APPLY_ROPE_WITH_COS_SIN_CACHE_INPLACE = _cache_template(
    "apply_rope_with_cos_sin_cache_inplace",
    "query, key rotated in place by cos_sin_cache[positions]",
    True,
    apply_rope_with_cos_sin_cache_inplace_reference,
)


# ---- RoPE + fp8 quantisation ---------------------------------------------------------------------

QUANT_TOLERANCE = {"bfloat16": (0.063, 1e-3), "float16": (0.063, 1e-3)}


def rope_quantize_float64(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True,
                          quant_scale_q=1.0, quant_scale_kv=1.0):
    """(q_rope_out, k_rope_out, q_nope_out, k_nope_out) before the fp8 rounding, float64: the rotary
    parts rotated by cos_sin_cache[pos_ids] rows, every part times its scale. A 2-D (MLA) k is one
    head. None for a non-rotary part: a zero-width one."""
    half = cos_sin_cache.shape[-1] // 2
    rows = cos_sin_cache.double()[pos_ids.long()]
    cos, sin = rows[:, :half], rows[:, half:]

    def heads(x):
        return x if x.dim() == 3 else x[:, None, :]

    qr = rotate_float64(q_rope, cos, sin, not is_neox) * quant_scale_q
    kr = rotate_float64(heads(k_rope), cos, sin, not is_neox).reshape(k_rope.shape) * quant_scale_kv
    q_nope = q_rope.new_empty((*q_rope.shape[:-1], 0)) if q_nope is None else q_nope
    k_nope = k_rope.new_empty((*k_rope.shape[:-1], 0)) if k_nope is None else k_nope
    return qr, kr, q_nope.double() * quant_scale_q, k_nope.double() * quant_scale_kv


def rope_quantize_reference_fp8(*args, quantize_dtype=torch.float8_e4m3fn, **kwargs):
    """rope_quantize_float64 rounded to fp8 (nearest even, saturated at the format's largest finite
    value): what the kernel returns up to a tie its float32 arithmetic lands on the other side of."""
    big = torch.finfo(quantize_dtype).max
    exact = rope_quantize_float64(*args, **kwargs)
    return tuple(v.clamp(-big, big).float().to(quantize_dtype) for v in exact)


def rope_quantize_fp8_reference(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                                quant_scale_q, quant_scale_kv):
    out = rope_quantize_float64(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                                quant_scale_q, quant_scale_kv)
    return dict(zip(("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"), out, strict=True))


def rope_quantize_inputs(template, axes, dtype, device, gen):
    positions = torch.randint(0, axes["max_pos"], (axes["tokens"],), generator=gen, dtype=torch.int64)
    return {
        "pos_ids": positions.to(device),
        "cos_sin_cache": cos_sin_cache_float32(axes["max_pos"], axes["rope_dim"]).to(device),
    }


# Models whose attention rotates part of each head. GLM-4: RoPE on half of each 128-dim head.
# Pythia (GPT-NeoX): rotary_pct 0.25 of 128 dims. DeepSeek-V3 MLA (absorbed): 128 query heads of
# qk_rope_head_dim 64 + kv_lora_rank 512, one latent key of the same split.
PARTIAL_ROTARY_MODELS = (
    ("glm-4-9b", {"num_q_heads": 32, "num_kv_heads": 2, "rope_dim": 64, "no_rope_dim": 64},
     "THUDM/glm-4-9b config.json (kv_channels 128, multi_query_group_num 2, rotary on half)"),
    ("pythia-6.9b", {"num_q_heads": 32, "num_kv_heads": 32, "rope_dim": 32, "no_rope_dim": 96},
     "EleutherAI/pythia-6.9b config.json (rotary_pct 0.25, head_dim 128)"),
)
MLA_MODELS = (
    ("deepseek-v3", {"num_q_heads": 128, "rope_dim": 64, "no_rope_dim": 512},
     "deepseek-ai/DeepSeek-V3 config.json (qk_rope_head_dim 64, kv_lora_rank 512)"),
)


def _quant_examples(models):
    return tuple(
        Example(name=f"{name}-{phase}", model=name, phase=phase, consts=consts,
                workloads=tuple({"tokens": t} for t in tokens), source=source)
        for name, consts, source in models
        for phase, tokens in (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS))
    )


def _quant_template(name, description, mla):
    k_heads = () if mla else ("num_kv_heads",)
    axes = {
        "tokens": AXES["tokens"],
        "num_q_heads": AXES["num_q_heads"],
        **({} if mla else {"num_kv_heads": AXES["num_kv_heads"]}),
        "rope_dim": const(doc="the rotary dims of each head (q_rope, k_rope)"),
        "no_rope_dim": const(doc="the other dims (q_nope, k_nope)"),
        "max_pos": const(MAX_POS, "rows of cos_sin_cache"),
    }
    fp8 = "float8_e4m3fn"
    q_r, q_n = ("tokens", "num_q_heads", "rope_dim"), ("tokens", "num_q_heads", "no_rope_dim")
    k_r, k_n = ("tokens", *k_heads, "rope_dim"), ("tokens", *k_heads, "no_rope_dim")
    options = {"quantize_dtype": "the fp8 format: the workload is float8_e4m3fn (None, the default)",
               "enable_pdl": "a launch detail (programmatic dependent launch)"}
    if not mla:
        options["backend"] = "'cuda' only (FlashInfer's 'cutile' is not offered)"
    return TraceTemplate(
        name=name,
        target="//ops:rope",
        description=description,
        axes=axes,
        inputs={
            "q_rope": Tensor(q_r), "k_rope": Tensor(k_r), "q_nope": Tensor(q_n), "k_nope": Tensor(k_n),
            "cos_sin_cache": Tensor(("max_pos", "rope_dim"), "float32", "cos | sin per position"),
            "pos_ids": Tensor(("tokens",), "int64", "rows of cos_sin_cache"),
            "is_neox": Scalar("bool", True, "NeoX pairs; False: interleaved"),
            "quant_scale_q": Scalar("float32", 1.0, "q's factor before rounding"),
            "quant_scale_kv": Scalar("float32", 1.0, "k's factor before rounding"),
        },
        outputs={"q_rope_out": Tensor(q_r, fp8), "k_rope_out": Tensor(k_r, fp8),
                 "q_nope_out": Tensor(q_n, fp8), "k_nope_out": Tensor(k_n, fp8)},
        reference=rope_quantize_fp8_reference,
        tolerance=QUANT_TOLERANCE,
        examples=_quant_examples(MLA_MODELS if mla else PARTIAL_ROTARY_MODELS),
        small=SMALL_CACHE,
        options=options,
        make_inputs=rope_quantize_inputs,
    )


ROPE_QUANTIZE_FP8 = _quant_template(
    "rope_quantize_fp8",
    "rotary parts rotated by cos_sin_cache[pos_ids], every part scaled, rounded to fp8",
    False,
)
MLA_ROPE_QUANTIZE_FP8 = _quant_template(
    "mla_rope_quantize_fp8", "rope_quantize_fp8 with MLA's single latent key head", True)
