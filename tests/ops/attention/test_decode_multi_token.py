"""Decode with several queries a request (plan(q_len_per_req=N): speculative verification, causal
among a request's queries), ROPE_LLAMA inside the kernel, and the plan options FlashInfer's users
pass (fixed_split_size, disable_split_kv, fast_decode_plan, the CUDA-graph wrapper class), against
the float32 reference (kiln.trace.attention.attention; RoPE from kiln.trace.rope, float64), on the
host backend always and on CUDA where a device is present."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged import make_paged

import kiln
from kiln.trace.attention import attention
from kiln.trace.rope import rope_frequencies_float64, rotate_float64

TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
# RoPE rotates q and k in float32 and rounds them to the operand dtype once before the products:
# one more rounding of every logit's inputs than the reference (half an ulp each, so 2^-11 / 2^-8
# relative) and float32 angles (position x frequency to ~6e-8 relative: 1e-3 rad at 16k tokens).
ROPE_TOL = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}


def workspace(device):
    return torch.empty(64 << 20, dtype=torch.uint8, device=device)


def rope(x, positions, rope_scale=1.0, rope_theta=1e4):
    """ROPE_LLAMA (rotate-half over the whole head) of x [n, heads, D] at `positions` [n], float32."""
    freq = rope_frequencies_float64(x.shape[-1], rope_scale, rope_theta)
    angle = positions.double().cpu()[:, None] * freq[None, :]
    return rotate_float64(x, angle.cos().to(x.device), angle.sin().to(x.device), interleave=False).float()


def reference(batch, q, q_len, b, window_left=-1, rope_args=None):
    """Request b's queries (rows b * q_len ..) over its keys: causal, aligned to the end."""
    k, v = batch.keys(b)
    qb = q[b * q_len : (b + 1) * q_len]
    if rope_args is not None:
        kv_len = k.shape[0]
        qb = rope(qb, torch.arange(kv_len - q_len, kv_len), *rope_args)
        k = rope(k, torch.arange(kv_len), *rope_args)
    return attention(qb, k, v, causal=True, window_left=window_left)


def run(batch, q, q_len, device, hq, hk, **plan):
    d = q.shape[-1]
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device), batch.layout)
    w.plan(
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        hq,
        hk,
        d,
        batch.page_size,
        q_data_type=q.dtype,
        q_len_per_req=q_len,
        **plan,
    )
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
    w.run(q, (batch.k_cache, batch.v_cache), out=out, lse=lse, return_lse=True)
    return out, lse, w


def check(batch, q, q_len, out, lse, tol, **ref):
    rtol, atol = tol[q.dtype]
    assert out.isfinite().all(), "unwritten or non-finite output"
    for b in range(len(batch.kv_lens)):
        ro, rl = reference(batch, q, q_len, b, **ref)
        rows = slice(b * q_len, (b + 1) * q_len)
        torch.testing.assert_close(out[rows].float(), ro, rtol=rtol, atol=atol, msg=f"request {b}")
        torch.testing.assert_close(lse[rows], rl, rtol=1e-3, atol=1e-3, msg=f"lse of request {b}")


ON_CPU_AND_CUDA = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
CUDA = [pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    "q_len,hq,hk",
    [(2, 8, 2), (3, 32, 8), (4, 8, 8), (7, 16, 4), (17, 4, 1), (40, 2, 2)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize(
    "device,kv_lens,page_size",
    [
        *[
            pytest.param(d.values[0], [40, 17, 300], 16, id=f"{d.id}-short", marks=d.marks)
            for d in ON_CPU_AND_CUDA
        ],
        *[
            pytest.param(d.values[0], [1500, 64], 5, id=f"{d.id}-split", marks=d.marks)
            for d in ON_CPU_AND_CUDA
        ],
        *[pytest.param(d.values[0], [4100], 32, id=f"{d.id}-long", marks=d.marks) for d in CUDA],
    ],
)
def test_multi_token_decode_matches_the_causal_reference(device, dtype, q_len, hq, hk, kv_lens, page_size):
    """Rows a CTA: heads x queries up to 16 (one or two n-tiles), query chunks past 16 (17, 40);
    split-KV items whose ranges hold the masked keys; the NHD and HND layouts."""
    gen = torch.Generator().manual_seed(q_len * 7 + hq)
    kv_lens = [max(n, q_len) for n in kv_lens]
    for layout in ("NHD", "HND"):
        batch = make_paged(kv_lens, page_size, hk, 64, dtype, device, layout=layout, gen=gen)
        q = torch.randn(len(kv_lens) * q_len, hq, 64, generator=gen).to(device=device, dtype=dtype)
        out, lse, _ = run(batch, q, q_len, device, hq, hk)
        check(batch, q, q_len, out, lse, TOL)


@pytest.mark.parametrize(
    "device,head_dim",
    [
        *[
            pytest.param("cpu", 128, id="cpu-128")
        ],  # one module pair on the CPU: the host code has no per-dim path
        *[pytest.param("cuda", d, id=f"cuda-{d}", marks=pytest.mark.gpu) for d in (64, 128, 256)],
    ],
)
@pytest.mark.parametrize("kv_dtype", ["same", "e4m3"])
def test_rope_llama_inside_attention(device, head_dim, kv_dtype):
    """pos_encoding_mode="ROPE_LLAMA": q at its position, every key at its index, rotated in the
    kernel (16-bit and fp8 caches, one and several queries a request, rope_scale / rope_theta)."""
    dtype = torch.float16
    gen = torch.Generator().manual_seed(head_dim)
    hq, hk, page = 8, 2, 16
    kv_lens = [37, 900] if device == "cpu" else [37, 900, 5000]
    for q_len, rope_args in ((1, (1.0, 1e4)), (3, (2.0, 5e5))):
        batch = make_paged(kv_lens, page, hk, head_dim, dtype, device, gen=gen)
        scale = 1.0
        if kv_dtype == "e4m3":  # an fp8 cache holding k / scale; the reference reads its values
            scale = 1.0 / 16  # a power of two: the dequantised copy is exact in f16
            batch.k_cache.copy_((batch.k_cache.float() / scale).to(torch.float8_e4m3fn).float() * scale)
            batch.v_cache.copy_((batch.v_cache.float() / scale).to(torch.float8_e4m3fn).float() * scale)
        q = torch.randn(len(kv_lens) * q_len, hq, head_dim, generator=gen).to(device=device, dtype=dtype)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
        cache = (batch.k_cache, batch.v_cache)
        kw = {}
        if kv_dtype == "e4m3":
            cache = tuple((c.float() / scale).to(torch.float8_e4m3fn) for c in cache)
            kw = {"k_scale": scale, "v_scale": scale}
        w.plan(
            batch.indptr,
            batch.indices,
            batch.last_page_len,
            hq,
            hk,
            head_dim,
            page,
            q_data_type=dtype,
            kv_data_type=cache[0].dtype,
            pos_encoding_mode="ROPE_LLAMA",
            rope_scale=rope_args[0],
            rope_theta=rope_args[1],
            q_len_per_req=q_len,
        )
        out, lse = w.run(q, cache, return_lse=True, **kw)
        check(batch, q, q_len, out, lse, ROPE_TOL, rope_args=rope_args)
    # single decode takes the same mode: position kv_len - 1
    k, v = batch.keys(1)
    one = (
        kiln.single_decode_with_kv_cache(q[1], k, v, pos_encoding_mode="ROPE_LLAMA")
        if kv_dtype == "same"
        else None
    )
    if one is not None:
        ro, _ = attention(rope(q[1:2], torch.tensor([k.shape[0] - 1])), rope(k, torch.arange(k.shape[0])), v)
        torch.testing.assert_close(one.float(), ro[0], rtol=ROPE_TOL[dtype][0], atol=ROPE_TOL[dtype][1])


@pytest.mark.parametrize("device", device_params())
def test_multi_token_window_and_soft_cap(device):
    """A sliding window counts back from each query's own position; soft-cap as for one query."""
    gen = torch.Generator().manual_seed(5)
    batch = make_paged([300, 45, 1200], 8, 2, 128, torch.bfloat16, device, gen=gen)
    q_len = 4
    q = torch.randn(3 * q_len, 8, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    for window in (0, 5, 100):
        out, lse, _ = run(batch, q, q_len, device, 8, 2, window_left=window)
        check(batch, q, q_len, out, lse, TOL, window_left=window)
    out, lse, _ = run(batch, q, q_len, device, 8, 2, logits_soft_cap=20.0)
    for b in range(3):
        k, v = batch.keys(b)
        ro, rl = attention(q[b * q_len : (b + 1) * q_len], k, v, causal=True, soft_cap=20.0)
        torch.testing.assert_close(out[b * q_len : (b + 1) * q_len].float(), ro, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", device_params())
def test_fixed_split_size_and_disable_split_kv(device):
    """fixed_split_size (pages) cuts every longer request into chunks of that size, whatever the
    batch (the same chunk for every batch: batch-invariant); disable_split_kv splits nothing. Both
    give the reference's results."""
    gen = torch.Generator().manual_seed(9)
    batch = make_paged([2000, 700, 33], 16, 2, 64, torch.float16, device, gen=gen)
    q = torch.randn(3, 8, 64, generator=gen).to(device=device, dtype=torch.float16)
    out, lse, w = run(batch, q, 1, device, 8, 2, fixed_split_size=8)
    assert w.plan_info["chunk"] == 8 * 16 and w.plan_info["work_items"] == 16 + 6 + 1
    check(batch, q, 1, out, lse, TOL)
    out2, lse2, w2 = run(batch, q, 1, device, 8, 2, disable_split_kv=True)
    assert w2.plan_info == {"chunk": 0, "work_items": 3, "partial_slots": 0}
    check(batch, q, 1, out2, lse2, TOL)
    out3, _, w3 = run(batch, q, 1, device, 8, 2, fixed_split_size=-1)  # FlashInfer's "none": the heuristic
    assert w3.plan_info["chunk"] != 8 * 16


@pytest.mark.parametrize("device", device_params())
def test_fast_decode_plan_and_the_cuda_graph_wrapper_class(device):
    """fast_decode_plan re-plans from a CPU indptr (wrapper.plan replaced by a partial, as engines
    bind it); CUDAGraphBatchDecodeWithPagedKVCacheWrapper is the use_cuda_graph=True wrapper."""
    from functools import partial

    gen = torch.Generator().manual_seed(11)
    batch = make_paged([100, 260], 16, 2, 64, torch.float16, device, gen=gen)
    q = torch.randn(2, 4, 64, generator=gen).to(device=device, dtype=torch.float16)
    cache = (batch.k_cache, batch.v_cache)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float16)
    expected = w.run(q, cache)
    w.plan = partial(kiln.fast_decode_plan, w)
    w.plan(
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        16,
        q_data_type=torch.float16,
        global_override_indptr_cpu=batch.indptr.cpu(),
    )
    assert torch.equal(w.run(q, cache), expected)

    bufs = (
        torch.empty(3, dtype=torch.int32, device=device),
        torch.empty(64, dtype=torch.int32, device=device),
        torch.empty(2, dtype=torch.int32, device=device),
    )
    g = kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(workspace(device), *bufs, "NHD")
    assert g.is_cuda_graph_enabled and isinstance(g, kiln.BatchDecodeWithPagedKVCacheWrapper)
    g.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float16)
    assert torch.equal(bufs[0], batch.indptr)  # the page table is in the fixed buffers
    assert torch.equal(g.run(q, cache), expected)
    # fast_decode_plan under CUDA graphs: the caller has written the buffers; no copy into them
    g.plan = partial(kiln.fast_decode_plan, g)
    bufs[2].copy_(batch.last_page_len)
    g.plan(
        bufs[0],
        bufs[1],
        bufs[2],
        4,
        2,
        64,
        16,
        q_data_type=torch.float16,
        global_override_indptr_cpu=batch.indptr.cpu(),
    )
    assert torch.equal(g.run(q, cache), expected)
    with pytest.raises(ValueError, match="q_len_per_req is part of the frozen CUDA-graph shape"):
        kiln.BatchDecodeWithPagedKVCacheWrapper.plan(
            g,
            batch.indptr,
            batch.indices,
            batch.last_page_len,
            4,
            2,
            64,
            16,
            q_data_type=torch.float16,
            q_len_per_req=2,
        )


@pytest.mark.parametrize("device", device_params())
def test_plan_takes_flashinfers_positional_order(device):
    """FlashInfer 0.7.2's deprecated positional form: pos_encoding_mode, window_left,
    logits_soft_cap, q_data_type, kv_data_type, o_data_type, data_type, sm_scale, ... after
    page_size; data_type fills only what is None (q_data_type keeps its given value)."""
    gen = torch.Generator().manual_seed(2)
    batch = make_paged([50, 20], 8, 2, 64, torch.float16, device, gen=gen)
    q = torch.randn(2, 4, 64, generator=gen).to(device=device, dtype=torch.float16)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    w.plan(
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        8,
        "NONE",
        -1,
        None,
        torch.float16,
        None,
        None,
        torch.float16,
        0.3,
    )
    out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    for b in range(2):
        k, v = batch.keys(b)
        ro, _ = attention(q[b : b + 1], k, v, sm_scale=0.3)
        torch.testing.assert_close(out[b].float(), ro[0], rtol=4e-3, atol=4e-3)
    fp8 = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    fp8.plan(
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        8,
        data_type=torch.float8_e4m3fn,
        q_data_type=torch.float16,
    )  # FlashInfer's tests: fp8 cache, f16 queries
    cache = tuple(c.to(torch.float8_e4m3fn) for c in (batch.k_cache, batch.v_cache))
    assert fp8.run(q, cache).dtype == torch.float16
    assert math.isfinite(float(fp8.run(q, cache).float().abs().max()))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    q_len=st.integers(1, 6),
    extra=st.lists(st.integers(0, 600), min_size=1, max_size=4),
    page_size=st.integers(1, 33),
    group=st.sampled_from([1, 2, 4, 8]),
    layout=st.sampled_from(["NHD", "HND"]),
    window_left=st.sampled_from([-1, 0, 3, 200]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_host(q_len, extra, page_size, group, layout, window_left, seed):
    """Any lengths >= q_len, page size, GQA group, layout and window: the host backend's
    multi-token decode (the CUDA kernel's schedule and merges) equals the causal reference."""
    gen = torch.Generator().manual_seed(seed)
    kv_lens = [q_len + n for n in extra]
    batch = make_paged(kv_lens, page_size, 2, 64, torch.float16, "cpu", layout, spare_pages=3, gen=gen)
    q = torch.randn(len(kv_lens) * q_len, 2 * group, 64, generator=gen).to(torch.float16)
    out, lse, _ = run(batch, q, q_len, "cpu", 2 * group, 2, window_left=window_left)
    check(batch, q, q_len, out, lse, TOL, window_left=window_left)
