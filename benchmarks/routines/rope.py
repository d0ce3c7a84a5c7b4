"""Routines of kiln's RoPE APIs, each against torch (a float32 implementation as an eager model
writes it: vLLM's native rotary embedding, gather cos/sin, rotate, cast back) and FlashInfer (when
importable; CUDA only). The in-place routines return the rotated q and k.

Bytes per call: q and k read and written; the cos/sin-cache routines add the positions and the
cache rows they read (not the whole cache). rope_quantize_fp8 / mla_rope_quantize_fp8: every part
read once, one byte per element written, positions and cache rows.
"""

from __future__ import annotations

import torch

import kiln
from kiln.trace.rope import positions_of, rope_frequencies_float64

from ..routine import Backend, Routine
from .norm import _flashinfer, cuda_only, flashinfer_version, kiln_version, torch_version


def flashinfer_available(device: torch.device, dtype: str) -> str | None:
    return cuda_only(device) or _flashinfer()[1]


LLAMA31_KEYS = ("low_freq_factor", "high_freq_factor", "old_context_len")
ROPE_KEYS = ("rotary_dim", "interleave", "rope_scale", "rope_theta")


def _kwargs(inp, llama31):
    return {n: inp[n] for n in ROPE_KEYS + (LLAMA31_KEYS if llama31 else ())}


def _index_args(inp):
    return (inp["indptr"], inp["offsets"]) if "indptr" in inp else (inp["pos_ids"],)


def api_setup(name, in_place, llama31, module=None):
    """kiln's API, or FlashInfer's of the same name (module = flashinfer)."""

    def setup(inp, ctx):
        fn = getattr(module() if module else kiln, name)
        q, k, idx, kw = inp["q"], inp["k"], _index_args(inp), _kwargs(inp, llama31)
        if in_place:

            def run():
                fn(q, k, *idx, **kw)
                return q, k

            return run
        return lambda: fn(q, k, *idx, **kw)

    return setup


def torch_rotate(x, cos, sin, interleave):
    """Rotate the first 2 * cos.shape[-1] dims of x [nnz, heads, d] in float32, rest unchanged."""
    rd = 2 * cos.shape[-1]
    xf = x[..., :rd].float()
    c, s = cos[:, None, :], sin[:, None, :]
    if interleave:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., : rd // 2], xf[..., rd // 2 :]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), dim=-1)


def torch_setup(in_place, llama31):
    def setup(inp, ctx):
        q, k = inp["q"], inp["k"]
        rd = inp["rotary_dim"] or q.shape[-1]
        extra = tuple(inp[n] for n in LLAMA31_KEYS) if llama31 else None
        freq = rope_frequencies_float64(rd, inp["rope_scale"], inp["rope_theta"], extra).float().to(q.device)
        if "indptr" in inp:  # the positions, made once outside timing as a model's metadata would be
            pos = positions_of(inp["indptr"], inp["offsets"], q.shape[0]).to(q.device)
        else:
            pos = inp["pos_ids"]
        interleave = inp["interleave"]

        def run():
            angle = pos.float()[:, None] * freq[None, :]
            cos, sin = angle.cos(), angle.sin()
            qo, ko = torch_rotate(q, cos, sin, interleave), torch_rotate(k, cos, sin, interleave)
            if in_place:
                q.copy_(qo)
                k.copy_(ko)
                return q, k
            return qo, ko

        return run

    return setup


def cache_api_setup(name, in_place, module=None):
    def setup(inp, ctx):
        fn = getattr(module() if module else kiln, name)
        pos, query, key, hs, cache = (
            inp[n] for n in ("positions", "query", "key", "head_size", "cos_sin_cache")
        )
        neox = inp["is_neox"]
        if in_place:

            def run():
                fn(pos, query, key, hs, cache, is_neox=neox)
                return query, key

            return run
        return lambda: fn(pos, query, key, hs, cache, is_neox=neox)

    return setup


def torch_cache_setup(in_place):
    def setup(inp, ctx):
        pos, query, key, hs, cache = (
            inp[n] for n in ("positions", "query", "key", "head_size", "cos_sin_cache")
        )
        interleave = not inp["is_neox"]
        half = cache.shape[-1] // 2

        def run():
            rows = cache[pos]
            cos, sin = rows[:, :half], rows[:, half:]
            qo = torch_rotate(query.unflatten(-1, (-1, hs)), cos, sin, interleave).flatten(1)
            ko = torch_rotate(key.unflatten(-1, (-1, hs)), cos, sin, interleave).flatten(1)
            if in_place:
                query.copy_(qo)
                key.copy_(ko)
                return query, key
            return qo, ko

        return run

    return setup


def _fi():
    return _flashinfer()[0]


def qk_bytes(axes, dtype):
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * axes["tokens"] * (axes["num_q_heads"] + axes["num_kv_heads"]) * axes["head_dim"] * elem


def cache_bytes(axes, dtype):
    return qk_bytes(axes, dtype) + axes["tokens"] * (8 + axes["head_dim"] * 4)


def _routine(name, in_place, llama31):
    return Routine(
        api=getattr(kiln, name),
        backends=(
            Backend("kiln", api_setup(name, in_place, llama31), version=kiln_version),
            Backend("torch", torch_setup(in_place, llama31), version=torch_version),
            Backend(
                "flashinfer",
                api_setup(name, in_place, llama31, module=_fi),
                available=flashinfer_available,
                version=flashinfer_version,
            ),
        ),
        bytes_per_call=qk_bytes,
    )


def _cache_routine(name, in_place):
    return Routine(
        api=getattr(kiln, name),
        backends=(
            Backend("kiln", cache_api_setup(name, in_place), version=kiln_version),
            Backend("torch", torch_cache_setup(in_place), version=torch_version),
            Backend(
                "flashinfer",
                cache_api_setup(name, in_place, module=_fi),
                available=flashinfer_available,
                version=flashinfer_version,
            ),
        ),
        bytes_per_call=cache_bytes,
    )


QUANT_KEYS = ("q_rope", "k_rope", "q_nope", "k_nope", "cos_sin_cache", "pos_ids")


def quant_api_setup(name, module=None):
    """kiln's rope_quantize_fp8 / mla_rope_quantize_fp8, or FlashInfer's (flashinfer.rope)."""

    def setup(inp, ctx):
        fn = getattr(module().rope if module else kiln, name)
        args = tuple(inp[n] for n in QUANT_KEYS)
        kw = {n: inp[n] for n in ("is_neox", "quant_scale_q", "quant_scale_kv")}
        return lambda: fn(*args, **kw)

    return setup


def torch_quant_setup(inp, ctx):
    """Gather cos/sin, rotate in float32, scale, cast to float8_e4m3fn (clamped: torch's cast
    overflows to NaN), as an eager model writes it."""
    q_rope, k_rope, q_nope, k_nope, cache, pos = (inp[n] for n in QUANT_KEYS)
    interleave, sq, sk = not inp["is_neox"], inp["quant_scale_q"], inp["quant_scale_kv"]
    half = cache.shape[-1] // 2

    def fp8(x, scale):
        return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)

    def run():
        rows = cache[pos]
        cos, sin = rows[:, :half], rows[:, half:]
        k3 = k_rope if k_rope.dim() == 3 else k_rope[:, None, :]
        qr = torch_rotate(q_rope.float(), cos, sin, interleave)
        kr = torch_rotate(k3.float(), cos, sin, interleave).reshape(k_rope.shape)
        return fp8(qr, sq), fp8(kr, sk), fp8(q_nope, sq), fp8(k_nope, sk)

    return run


def quant_bytes(axes, dtype):
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    per_token = (axes["num_q_heads"] + axes.get("num_kv_heads", 1)) * (axes["rope_dim"] + axes["no_rope_dim"])
    return axes["tokens"] * (per_token * (elem + 1) + 8 + axes["rope_dim"] * 4)


def _quant_routine(name):
    return Routine(
        api=getattr(kiln, name),
        backends=(
            Backend("kiln", quant_api_setup(name), version=kiln_version),
            Backend("torch", torch_quant_setup, version=torch_version),
            Backend("flashinfer", quant_api_setup(name, module=_fi), available=flashinfer_available,
                    version=flashinfer_version),
        ),
        bytes_per_call=quant_bytes,
    )


ROUTINES = (
    _routine("apply_rope", False, False),
    _routine("apply_rope_inplace", True, False),
    _routine("apply_rope_pos_ids", False, False),
    _routine("apply_rope_pos_ids_inplace", True, False),
    _routine("apply_llama31_rope", False, True),
    _routine("apply_llama31_rope_inplace", True, True),
    _routine("apply_llama31_rope_pos_ids", False, True),
    _routine("apply_llama31_rope_pos_ids_inplace", True, True),
    _cache_routine("apply_rope_with_cos_sin_cache", False),
    _cache_routine("apply_rope_with_cos_sin_cache_inplace", True),
    _quant_routine("rope_quantize_fp8"),
    _quant_routine("mla_rope_quantize_fp8"),
)
