"""Rotary positional embedding of q and k (//ops:rope), with FlashInfer's names and argument order.

    apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4)
    apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4)
    apply_llama31_rope(q, k, indptr, offsets, ..., rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                       high_freq_factor=4, old_context_len=8192)
    apply_llama31_rope_pos_ids(q, k, pos_ids, ...)
    apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True)
    ... and each one's `_inplace` variant, which rotates q and k in place and returns None.

q [nnz, num_q_heads, head_dim] and k [nnz, num_k_heads, head_dim] (different head counts allowed),
float16/bfloat16, contiguous in the last dimension with free token and head strides (views of a
fused qkv tensor work). Positions: token t of request b (indptr[b] <= t < indptr[b+1]) is at
offsets[b] + t - indptr[b]; or pos_ids[t] (indptr, offsets and pos_ids int32 or int64 each). The
rotary pair i < rotary_dim / 2 turns by pos * freq(i), freq(i) = 1 / (rope_scale * rope_theta **
(2i / rotary_dim)) (Llama 3.1: blended per frequency band); NeoX style pairs (x[i],
x[i + rotary_dim/2]), interleaved (GPT-J) style (x[2i], x[2i+1]). Dims at and past rotary_dim are
left untouched bit for bit (copied into the outputs of the out-of-place variants); rotary_dim >
head_dim is an error.

The cos/sin-cache form (vLLM's and SGLang's): query [nnz, num_heads * head_size] (or
[nnz, num_heads, head_size]), key likewise, cos_sin_cache [max_pos, rotary_dim] float32 holding
cos in its first half and sin in its second, positions [nnz] int32/int64. A position outside
[0, max_pos) is an index error: the CPU backend raises IndexError before writing anything; CUDA
kernels skip the token and record it for kiln.check_errors() (KILN_VALIDATE_INDICES=1 checks after
every call).

RoPE fused with fp8 quantisation (FlashInfer's, for MLA, GQA and MHA):

    rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True,
                      quantize_dtype=None, quant_scale_q=1, quant_scale_kv=1, q_rope_out=None, ...,
                      enable_pdl=False, backend="cuda") -> (q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    mla_rope_quantize_fp8(...)      the same, k_rope / k_nope [nnz, dim] (one latent key head)

the rotary parts rotated by cos_sin_cache[pos_ids] rows, every part multiplied by its scale and
rounded once to float8_e4m3fn / float8_e5m2 (nearest even, saturated). enable_pdl launches with
programmatic dependent launch on sm90+ (ignored elsewhere).

Each function is a torch custom op (kiln::rope_indptr, kiln::rope_pos_ids, kiln::rope_cos_sin_cache
and their _inplace ops, kiln::rope_quantize) with a fake implementation; launches go to the
caller's current stream.
"""

from __future__ import annotations

import math

import torch

from ._entries import entry_op
from .api_logging import logged_api
from .trace import rope as rope_traces
from .trace import traced

LABEL = "//ops:rope"

# The custom ops and their launchers, from the entries in the BUILD file: out-of-place ones write
# q_out/k_out, in-place ones q/k (passed as q_out/k_out: never both aliased in one op, so
# torch.compile's functionalisation sees plain mutations).
_rope_indptr_op = entry_op(LABEL, "rope_indptr")
_rope_indptr_inplace_op = entry_op(LABEL, "rope_indptr", op_name="rope_indptr_inplace",
                                   alias={"q_out": "q", "k_out": "k"}, api="kiln.apply_rope_inplace")
_rope_pos_ids_op = entry_op(LABEL, "rope_pos_ids")
_rope_pos_ids_inplace_op = entry_op(LABEL, "rope_pos_ids", op_name="rope_pos_ids_inplace",
                                    alias={"q_out": "q", "k_out": "k"}, api="kiln.apply_rope_pos_ids_inplace")
_rope_cos_sin_op = entry_op(LABEL, "rope_cos_sin_cache")
_rope_cos_sin_inplace_op = entry_op(LABEL, "rope_cos_sin_cache", op_name="rope_cos_sin_cache_inplace",
                                    alias={"q_out": "q", "k_out": "k"},
                                    api="kiln.apply_rope_with_cos_sin_cache_inplace")
# fp8 outputs travel as uint8 views (not every torch build exports fp8 through DLPack), e5m2 from
# q_rope_out's dtype.
_rope_quantize_op = entry_op(LABEL, "rope_quantize")


def _check_tensors(api: str, **tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    q = tensors.get("q")
    if q is not None and q.dim() != 3:
        raise ValueError(f"{api}: q must be [nnz, num_q_heads, head_dim], got shape {list(q.shape)}")


def _rotary_dim(q: torch.Tensor, rotary_dim: int | None) -> int:
    return int(q.shape[-1]) if rotary_dim is None else int(rotary_dim)


def llama31_smoothing(api: str, low_freq_factor: float, high_freq_factor: float,
                      old_context_len: float) -> tuple[float, float]:
    """Llama 3.1's band blend as smooth = clamp(freq * a + b, 0, 1): a = old_context_len /
    (2 pi (high - low)), b = -low / (high - low) (ops/rope/rope.h)."""
    if not low_freq_factor > 0:
        raise ValueError(f"{api}: low_freq_factor must be > 0, got {low_freq_factor}")
    if not high_freq_factor > low_freq_factor:
        raise ValueError(f"{api}: high_freq_factor must be > low_freq_factor ({low_freq_factor}), "
                         f"got {high_freq_factor}")
    if not old_context_len > 0:
        raise ValueError(f"{api}: old_context_len must be > 0, got {old_context_len}")
    a = old_context_len / (2 * math.pi * (high_freq_factor - low_freq_factor))
    b = -low_freq_factor / (high_freq_factor - low_freq_factor)
    return a, b


def _new(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor like t (empty_like: half the host cost of torch.empty(shape, ...))."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# ---- indptr / offsets ------------------------------------------------------------------------

@logged_api
@traced(rope_traces.APPLY_ROPE)
def apply_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
               rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 1,
               rope_theta: float = 1e4) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of q and k into new tensors; token t of request b is at ``offsets[b] + t - indptr[b]``.

    Args:
        q: ``[nnz, num_q_heads, head_dim]``, float16 or bfloat16.
        k: ``[nnz, num_k_heads, head_dim]``, the dtype of ``q``.
        indptr: ``[batch + 1]`` int32 or int64, request b holds tokens ``[indptr[b], indptr[b + 1])``.
        offsets: ``[batch]`` int32 or int64, the position of each request's first token.
        rotary_dim: dims rotated (even, <= head_dim; default head_dim); the rest are copied.
        interleave: pairs ``(x[2i], x[2i + 1])`` (GPT-J) instead of ``(x[i], x[i + rotary_dim/2])``.
        rope_scale, rope_theta: ``freq(i) = 1 / (rope_scale * rope_theta ** (2i / rotary_dim))``.

    Returns:
        ``(q_rope, k_rope)``, new tensors of q's and k's shapes.
    """
    _check_tensors("kiln.apply_rope", q=q, k=k, indptr=indptr, offsets=offsets)
    q_out, k_out = _new(q), _new(k)
    _rope_indptr_op(q_out, k_out, q, k, indptr, offsets, _rotary_dim(q, rotary_dim), interleave,
                    float(rope_scale), float(rope_theta), 0.0, 0.0)
    return q_out, k_out


@logged_api(mutates=("q", "k"))
@traced(rope_traces.APPLY_ROPE_INPLACE)
def apply_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> None:
    """:func:`apply_rope` in place: q and k (which must not overlap) are rotated where they are."""
    _check_tensors("kiln.apply_rope_inplace", q=q, k=k, indptr=indptr, offsets=offsets)
    _rope_indptr_inplace_op(q, k, indptr, offsets, _rotary_dim(q, rotary_dim), interleave,
                            float(rope_scale), float(rope_theta), 0.0, 0.0)


@logged_api
@traced(rope_traces.APPLY_LLAMA31_ROPE)
def apply_llama31_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 8,
                       rope_theta: float = 5e5, low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` with Llama 3.1's frequency scaling: per frequency f, ``s = clamp((
    old_context_len * f / (2 pi) - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1)``
    and ``freq = (1 - s) * f / rope_scale + s * f`` (long wavelengths scaled, short ones kept)."""
    api = "kiln.apply_llama31_rope"
    _check_tensors(api, q=q, k=k, indptr=indptr, offsets=offsets)
    a, b = llama31_smoothing(api, low_freq_factor, high_freq_factor, old_context_len)
    q_out, k_out = _new(q), _new(k)
    _rope_indptr_op(q_out, k_out, q, k, indptr, offsets, _rotary_dim(q, rotary_dim), interleave,
                    float(rope_scale), float(rope_theta), a, b)
    return q_out, k_out


@logged_api(mutates=("q", "k"))
@traced(rope_traces.APPLY_LLAMA31_ROPE_INPLACE)
def apply_llama31_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                               rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4, old_context_len: int = 8192) -> None:
    """:func:`apply_llama31_rope` in place."""
    api = "kiln.apply_llama31_rope_inplace"
    _check_tensors(api, q=q, k=k, indptr=indptr, offsets=offsets)
    a, b = llama31_smoothing(api, low_freq_factor, high_freq_factor, old_context_len)
    _rope_indptr_inplace_op(q, k, indptr, offsets, _rotary_dim(q, rotary_dim), interleave,
                            float(rope_scale), float(rope_theta), a, b)


# ---- position ids ----------------------------------------------------------------------------

@logged_api
@traced(rope_traces.APPLY_ROPE_POS_IDS)
def apply_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` with token t at ``pos_ids[t]`` (``[nnz]``, int32 or int64)."""
    _check_tensors("kiln.apply_rope_pos_ids", q=q, k=k, pos_ids=pos_ids)
    q_out, k_out = _new(q), _new(k)
    _rope_pos_ids_op(q_out, k_out, q, k, pos_ids, _rotary_dim(q, rotary_dim), interleave,
                     float(rope_scale), float(rope_theta), 0.0, 0.0)
    return q_out, k_out


@logged_api(mutates=("q", "k"))
@traced(rope_traces.APPLY_ROPE_POS_IDS_INPLACE)
def apply_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                               rotary_dim: int | None = None, interleave: bool = False,
                               rope_scale: float = 1, rope_theta: float = 1e4) -> None:
    """:func:`apply_rope_pos_ids` in place."""
    _check_tensors("kiln.apply_rope_pos_ids_inplace", q=q, k=k, pos_ids=pos_ids)
    _rope_pos_ids_inplace_op(q, k, pos_ids, _rotary_dim(q, rotary_dim), interleave, float(rope_scale),
                             float(rope_theta), 0.0, 0.0)


@logged_api
@traced(rope_traces.APPLY_LLAMA31_ROPE_POS_IDS)
def apply_llama31_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                               rotary_dim: int | None = None, interleave: bool = False,
                               rope_scale: float = 8, rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_llama31_rope` with token t at ``pos_ids[t]``."""
    api = "kiln.apply_llama31_rope_pos_ids"
    _check_tensors(api, q=q, k=k, pos_ids=pos_ids)
    a, b = llama31_smoothing(api, low_freq_factor, high_freq_factor, old_context_len)
    q_out, k_out = _new(q), _new(k)
    _rope_pos_ids_op(q_out, k_out, q, k, pos_ids, _rotary_dim(q, rotary_dim), interleave,
                     float(rope_scale), float(rope_theta), a, b)
    return q_out, k_out


@logged_api(mutates=("q", "k"))
@traced(rope_traces.APPLY_LLAMA31_ROPE_POS_IDS_INPLACE)
def apply_llama31_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                                       rotary_dim: int | None = None, interleave: bool = False,
                                       rope_scale: float = 8, rope_theta: float = 5e5,
                                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                                       old_context_len: int = 8192) -> None:
    """:func:`apply_llama31_rope_pos_ids` in place."""
    api = "kiln.apply_llama31_rope_pos_ids_inplace"
    _check_tensors(api, q=q, k=k, pos_ids=pos_ids)
    a, b = llama31_smoothing(api, low_freq_factor, high_freq_factor, old_context_len)
    _rope_pos_ids_inplace_op(q, k, pos_ids, _rotary_dim(q, rotary_dim), interleave, float(rope_scale),
                             float(rope_theta), a, b)


# ---- cos/sin cache (vLLM / SGLang) -----------------------------------------------------------

def _heads(api: str, name: str, t: torch.Tensor, head_size: int) -> torch.Tensor:
    """[nnz, heads * head_size] -> [nnz, heads, head_size] (a view); 3-D passes through."""
    if t.dim() == 3 and t.shape[-1] == head_size:
        return t
    if t.dim() != 2 or head_size <= 0 or t.shape[-1] % head_size:
        raise ValueError(f"{api}: {name} must be [nnz, num_heads * head_size] or [nnz, num_heads, "
                         f"head_size] with head_size = {head_size}, got shape {list(t.shape)}")
    return t.unflatten(-1, (-1, head_size))


def _cos_sin_args(api, positions, query, key, head_size, cos_sin_cache):
    _check_tensors(api, positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    return _heads(api, "query", query, head_size), _heads(api, "key", key, head_size)


@logged_api
@traced(rope_traces.APPLY_ROPE_WITH_COS_SIN_CACHE)
def apply_rope_with_cos_sin_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                  head_size: int, cos_sin_cache: torch.Tensor,
                                  is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE with cos/sin read from a cache (vLLM's form).

    Args:
        positions: ``[nnz]`` int32 or int64, rows of ``cos_sin_cache``.
        query: ``[nnz, num_q_heads * head_size]`` (or ``[nnz, num_q_heads, head_size]``), fp16/bf16.
        key: ``[nnz, num_k_heads * head_size]`` likewise.
        head_size: the head dimension.
        cos_sin_cache: ``[max_pos, rotary_dim]`` float32: cos in ``[:, :rotary_dim/2]``, sin in
            ``[:, rotary_dim/2:]``; ``rotary_dim <= head_size``.
        is_neox: NeoX pairs ``(x[i], x[i + rotary_dim/2])``; False: interleaved ``(x[2i], x[2i+1])``.

    Returns:
        ``(query_out, key_out)``, new tensors of query's and key's shapes.
    """
    api = "kiln.apply_rope_with_cos_sin_cache"
    q, k = _cos_sin_args(api, positions, query, key, head_size, cos_sin_cache)
    query_out, key_out = _new(query), _new(key)
    _rope_cos_sin_op(_heads(api, "query", query_out, head_size), _heads(api, "key", key_out, head_size), q, k,
                     positions, cos_sin_cache, not is_neox)
    return query_out, key_out


@logged_api(mutates=("query", "key"))
@traced(rope_traces.APPLY_ROPE_WITH_COS_SIN_CACHE_INPLACE)
def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                          head_size: int, cos_sin_cache: torch.Tensor,
                                          is_neox: bool = True) -> None:
    """:func:`apply_rope_with_cos_sin_cache` in place (query and key must not overlap)."""
    api = "kiln.apply_rope_with_cos_sin_cache_inplace"
    q, k = _cos_sin_args(api, positions, query, key, head_size, cos_sin_cache)
    _rope_cos_sin_inplace_op(q, k, positions, cos_sin_cache, not is_neox)


# ---- RoPE + fp8 quantisation (FlashInfer's rope_quantize_fp8, MLA / GQA / MHA) ---------------------

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _quantize_dtype(api: str, quantize_dtype, outs) -> torch.dtype:
    """FlashInfer's rule: the given dtype, else the first given output's, else float8_e4m3fn; every
    given output must then have it."""
    given = [(n, o) for n, o in outs.items() if o is not None]
    for name, o in given:
        if not isinstance(o, torch.Tensor):
            raise TypeError(f"{api}: {name} must be a torch.Tensor or None, got {type(o).__name__}")
    dtype = quantize_dtype if quantize_dtype is not None else (given[0][1].dtype if given else FP8_DTYPES[0])
    if dtype not in FP8_DTYPES:
        raise TypeError(f"{api}: the quantised dtype must be torch.float8_e4m3fn or torch.float8_e5m2, "
                        f"got {dtype}")
    for name, o in given:
        if o.dtype != dtype:
            raise TypeError(f"{api}: {name}.dtype must be {dtype} (the quantised dtype), got {o.dtype}")
    return dtype


def _rope_quantize(api, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
                   quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl):
    from .utils import use_pdl

    _check_tensors(api, q_rope=q_rope, k_rope=k_rope, cos_sin_cache=cos_sin_cache, pos_ids=pos_ids)
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"{api}: cos_sin_cache should be float32, got {cos_sin_cache.dtype}")
    if q_rope.dim() != 3:
        raise ValueError(f"{api}: q_rope must be [nnz, num_qo_heads, rope_dim], got shape "
                         f"{list(q_rope.shape)}")
    if k_rope.dim() not in (2, 3):
        raise ValueError(f"{api}: k_rope must be [nnz, num_kv_heads, rope_dim] or (MLA) [nnz, rope_dim], got "
                         f"shape {list(k_rope.shape)}")
    nnz, heads = q_rope.shape[0], q_rope.shape[1]
    # No non-rotary part: a zero-width one (FlashInfer's convention).
    if q_nope is None:
        q_nope = q_rope.new_empty((nnz, heads, 0))
    if k_nope is None:
        k_nope = k_rope.new_empty((*k_rope.shape[:-1], 0))
    _check_tensors(api, q_nope=q_nope, k_nope=k_nope)
    outs = {"q_rope_out": q_rope_out, "k_rope_out": k_rope_out, "q_nope_out": q_nope_out,
            "k_nope_out": k_nope_out}
    dtype = _quantize_dtype(api, quantize_dtype, outs)
    q_rope_out = torch.empty_like(q_rope, dtype=dtype) if q_rope_out is None else q_rope_out
    k_rope_out = torch.empty_like(k_rope, dtype=dtype) if k_rope_out is None else k_rope_out
    q_nope_out = torch.empty_like(q_nope, dtype=dtype) if q_nope_out is None else q_nope_out
    k_nope_out = torch.empty_like(k_nope, dtype=dtype) if k_nope_out is None else k_nope_out
    _rope_quantize_op(q_rope_out, k_rope_out, q_nope_out, k_nope_out, q_rope, k_rope, q_nope, k_nope,
                      cos_sin_cache, pos_ids, float(quant_scale_q), float(quant_scale_kv), not is_neox,
                      use_pdl(enable_pdl, q_rope.device))
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out


@logged_api(mutates=("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"))
@traced(rope_traces.ROPE_QUANTIZE_FP8)
def rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: torch.Tensor | None,
                      k_nope: torch.Tensor | None, cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor,
                      is_neox: bool = True, quantize_dtype: torch.dtype | None = None,
                      quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0,
                      q_rope_out: torch.Tensor | None = None, k_rope_out: torch.Tensor | None = None,
                      q_nope_out: torch.Tensor | None = None, k_nope_out: torch.Tensor | None = None,
                      enable_pdl: bool = False, backend: str = "cuda") -> tuple[torch.Tensor, ...]:
    """RoPE of pre-split q and k from a cos/sin cache, then both parts quantised to fp8 (MLA, GQA, MHA).

    ``q_rope_out = fp8(rope(q_rope) * quant_scale_q)``, ``q_nope_out = fp8(q_nope * quant_scale_q)``,
    and k's likewise with ``quant_scale_kv``: the rotation in float32 (cos/sin of token t from
    ``cos_sin_cache[pos_ids[t]]``), the product rounded once to nearest even and saturated at the
    format's largest finite value (448 for float8_e4m3fn, 57344 for float8_e5m2).

    Args:
        q_rope: ``[nnz, num_qo_heads, rope_dim]`` float16/bfloat16, the rotary dims of q.
        k_rope: ``[nnz, num_kv_heads, rope_dim]``, or ``[nnz, rope_dim]`` (MLA: one latent key head).
        q_nope: ``[nnz, num_qo_heads, no_rope_dim]`` the other dims of q, or None (no_rope_dim = 0).
        k_nope: ``[nnz, num_kv_heads, no_rope_dim]`` (MLA ``[nnz, no_rope_dim]``), or None.
        cos_sin_cache: ``[max_pos, rope_dim]`` float32, cos in the first half of a row, sin in the second.
        pos_ids: ``[nnz]`` int32/int64, rows of ``cos_sin_cache`` (outside ``[0, max_pos)``: an index
            error; the CPU backend raises before writing, CUDA skips the token and records it).
        is_neox: NeoX pairs ``(x[i], x[i + rope_dim/2])``; False: interleaved ``(x[2i], x[2i+1])``.
        quantize_dtype: float8_e4m3fn or float8_e5m2; None: the given outputs' dtype, else e4m3fn.
        quant_scale_q, quant_scale_kv: the factors applied to q and k before rounding.
        q_rope_out, k_rope_out, q_nope_out, k_nope_out: outputs to write (views of one tensor work,
            e.g. the column bands of ``[nnz, heads, rope_dim + no_rope_dim]``); None: allocated.
        enable_pdl: programmatic dependent launch (FlashInfer's switch, default off): on sm90+ the
            kernel may start while the previous kernel on the stream finishes; ignored on CPU
            tensors and older GPUs.
        backend: ``"cuda"``, kiln's kernels (the CPU backend for CPU tensors). FlashInfer's
            ``"cutile"`` (cuda.tile kernels) is not offered: NotImplementedError.

    Returns:
        ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.
    """
    api = "kiln.rope_quantize_fp8"
    if backend == "cutile":
        raise NotImplementedError(f"{api}: kiln has no cuda.tile backend (backend='cutile'); use "
                                  "backend='cuda'")
    if backend != "cuda":
        raise ValueError(f"{api}: unsupported backend {backend!r}; expected 'cuda'")
    return _rope_quantize(api, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                          quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out,
                          k_nope_out, enable_pdl)


@logged_api(mutates=("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"))
@traced(rope_traces.MLA_ROPE_QUANTIZE_FP8)
def mla_rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: torch.Tensor,
                          k_nope: torch.Tensor, cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor,
                          is_neox: bool = True, quantize_dtype: torch.dtype | None = None,
                          quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0,
                          q_rope_out: torch.Tensor | None = None, k_rope_out: torch.Tensor | None = None,
                          q_nope_out: torch.Tensor | None = None, k_nope_out: torch.Tensor | None = None,
                          enable_pdl: bool = False) -> tuple[torch.Tensor, ...]:
    """:func:`rope_quantize_fp8` in MLA's layout: ``k_rope [nnz, rope_dim]`` and ``k_nope [nnz,
    no_rope_dim]`` (one latent key head); q ``[nnz, num_qo_heads, *]`` as there (DeepSeek-V3:
    128 heads, rope_dim 64, no_rope_dim 512)."""
    return _rope_quantize("kiln.mla_rope_quantize_fp8", q_rope, k_rope, q_nope, k_nope, cos_sin_cache,
                          pos_ids, is_neox, quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out,
                          k_rope_out, q_nope_out, k_nope_out, enable_pdl)
