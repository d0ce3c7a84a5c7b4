"""fp8 E4M3 KV caches: decode (batch and single) and paged prefill (through its staged 16-bit copy,
both kernels) against the float32 reference on the dequantised cache, appends that quantise
bf16/f16 keys with the per-tensor scales (bit-exact against torch), k_scale / v_scale on 16-bit
caches (FlashInfer's semantics), CUDA graphs, and bad inputs. Host backend always, CUDA where a
device is present.

Tolerance. The reference reads the same fp8 values times the scales, in float32, so the cache's
own quantisation error is not in the comparison. What remains is the kernel's rounding: E4M3
values are exact in f16, the query times sm_scale * k_scale is rounded to f16 once (2^-11
relative), P is rounded to f16 for the P V product (2^-11), and the output once to its dtype
(2^-11 for f16, 2^-8 for bf16): the 16-bit decode tolerances (test_decode.py) cover all three."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from paged import make_paged

import kiln
from kiln.trace.attention import attend as reference_decode
from kiln.trace.attention import attention as reference_attention

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What an fp8 cache holds for x: e4m3(x / scale), saturated (torch's own cast overflows to NaN)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def fp8_batch(kv_lens, page_size, hk, d, device, layout="NHD", gen=None, amplitude=(3.0, 1.0)):
    """A paged batch whose caches are fp8, quantised from random float32 with scales that map each
    cache's absmax to 448 (so the whole E4M3 range, subnormals included, is used)."""
    batch = make_paged(kv_lens, page_size, hk, d, torch.float32, device, layout, gen=gen)
    k = batch.k_cache * amplitude[0]
    v = batch.v_cache * amplitude[1]
    k_scale, v_scale = float(k.abs().max()) / E4M3_MAX, float(v.abs().max()) / E4M3_MAX
    both = torch.stack([quantize(k, k_scale), quantize(v, v_scale)], dim=1)  # one pool, strided halves
    batch.k_cache, batch.v_cache = both[:, 0], both[:, 1]
    return batch, k_scale, v_scale


def dequantised(batch, b, k_scale, v_scale):
    k, v = batch.keys(b)
    return k.float() * k_scale, v.float() * v_scale


def run_fp8(batch, q, device, k_scale, v_scale, **plan_kw):
    hq, d = q.shape[1], q.shape[2]
    hk = batch.k_cache.shape[2] if batch.layout == "NHD" else batch.k_cache.shape[1]
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device=device), batch.layout
    )
    w.plan(
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        hq,
        hk,
        d,
        batch.page_size,
        q_data_type=q.dtype,
        kv_data_type=FP8,
        **plan_kw,
    )
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
    w.run(
        q, (batch.k_cache, batch.v_cache), out=out, lse=lse, return_lse=True, k_scale=k_scale, v_scale=v_scale
    )
    return out, lse, w


def lse_bound(q, k, sm_scale):
    """How far the kernel's lse may be from the reference's: each logit is sum_d q_d k_d scaled,
    with q_d * scale rounded to f16 (relative 2^-11), so it moves by at most 2^-11 sum_d |q_d k_d|
    scaled (and the soft-cap only shrinks differences); the lse by at most the largest such move.
    Twice that, for the float32 sums in another order. Per query head, base 2."""
    group = q.shape[0] // k.shape[1]
    scale = (sm_scale or 1.0 / math.sqrt(q.shape[-1])) / math.log(2)
    terms = torch.einsum("hd,thd->ht", q.float().abs(), k.abs().repeat_interleave(group, 1))
    return 2.0**-10 * scale * terms.amax(1) if terms.numel() else torch.zeros(q.shape[0], device=q.device)


def check(batch, q, out, lse, k_scale, v_scale, soft_cap=None, window_left=-1, sm_scale=None):
    rtol, atol = TOL[q.dtype]
    assert out.isfinite().all(), "unwritten or non-finite output"
    for b in range(q.shape[0]):
        k, v = dequantised(batch, b, k_scale, v_scale)
        ref, ref_lse = reference_decode(q[b], k, v, sm_scale, soft_cap, window_left)
        torch.testing.assert_close(out[b].float(), ref, rtol=rtol, atol=atol, msg=f"request {b}")
        err = (lse[b] - ref_lse).abs().nan_to_num(0.0)  # -inf == -inf for an empty request
        bound = lse_bound(q[b], k, sm_scale) + 1e-4
        assert bool((err <= bound).all()), (
            f"lse of request {b}: error {err.max():.3g} > bound {bound.min():.3g}"
        )
        assert torch.equal(lse[b].isinf(), ref_lse.isinf()), f"lse of request {b}: -inf mismatch"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_decode_grid(device, dtype, head_dim, layout):
    """Every head_dim (each has its own fp8 fragment layout in shared memory), both layouts, GQA,
    empty and one-token requests, page sizes that do not divide the lengths."""
    gen = torch.Generator().manual_seed(head_dim + (layout == "HND"))
    batch, ks, vs = fp8_batch([300, 1, 0, 45], 16, 2, head_dim, device, layout, gen=gen)
    q = torch.randn(4, 8, head_dim, generator=gen).to(device=device, dtype=dtype)
    out, lse, _ = run_fp8(batch, q, device, ks, vs)
    check(batch, q, out, lse, ks, vs)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(
    "hq,hk,page_size", [(32, 8, 16), (64, 8, 5), (6, 2, 1), (16, 1, 32)], ids=lambda v: str(v)
)
def test_fp8_decode_group_sizes_and_pages(device, hq, hk, page_size):
    gen = torch.Generator().manual_seed(hq * 100 + page_size)
    batch, ks, vs = fp8_batch([97, 130], page_size, hk, 128, device, gen=gen)
    q = torch.randn(2, hq, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    out, lse, _ = run_fp8(batch, q, device, ks, vs)
    check(batch, q, out, lse, ks, vs)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("soft_cap,window_left,sm_scale", [(30.0, -1, None), (None, 63, 0.05)])
def test_fp8_decode_soft_cap_window_scale(device, soft_cap, window_left, sm_scale):
    gen = torch.Generator().manual_seed(11)
    batch, ks, vs = fp8_batch([200, 64], 16, 4, 128, device, gen=gen)
    q = (3 * torch.randn(2, 16, 128, generator=gen)).to(device=device, dtype=torch.float16)
    out, lse, _ = run_fp8(
        batch, q, device, ks, vs, logits_soft_cap=soft_cap, window_left=window_left, sm_scale=sm_scale
    )
    check(batch, q, out, lse, ks, vs, soft_cap, window_left, sm_scale)


@pytest.mark.parametrize("device", device_params())
def test_fp8_decode_split_kv(device):
    """A long single request is split over the GPU: the partials and their merge carry v_scale."""
    gen = torch.Generator().manual_seed(5)
    batch, ks, vs = fp8_batch([4100], 16, 8, 128, device, gen=gen)
    q = torch.randn(1, 32, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    out, lse, w = run_fp8(batch, q, device, ks, vs)
    assert w.plan_info["partial_slots"] > 1, "batch 1 must be split"
    check(batch, q, out, lse, ks, vs)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_single_decode(device, layout):
    gen = torch.Generator().manual_seed(7)
    hq, hk, d, kv_len = 16, 4, 128, 333
    shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
    kf, vf = torch.randn(shape, generator=gen) * 2, torch.randn(shape, generator=gen)
    ks, vs = float(kf.abs().max()) / E4M3_MAX, float(vf.abs().max()) / E4M3_MAX
    k, v = quantize(kf, ks).to(device), quantize(vf, vs).to(device)
    q = torch.randn(hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    out, lse = kiln.single_decode_with_kv_cache(
        q, k, v, kv_layout=layout, k_scale=ks, v_scale=vs, return_lse=True
    )
    kn, vn = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    ref, ref_lse = reference_decode(q, kn.float() * ks, vn.float() * vs)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    assert bool(((lse - ref_lse).abs() <= lse_bound(q, kn.float() * ks, None) + 1e-4).all())


@pytest.mark.parametrize("device", device_params())
def test_scales_on_a_16_bit_cache(device):
    """FlashInfer applies k_scale and v_scale to any cache: logits use k * k_scale, out v * v_scale."""
    gen = torch.Generator().manual_seed(2)
    batch = make_paged([77, 300], 16, 2, 128, torch.bfloat16, device, gen=gen)
    q = torch.randn(2, 8, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=device))
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 128, 16, q_data_type=torch.bfloat16)
    out = w.run(q, (batch.k_cache, batch.v_cache), k_scale=0.5, v_scale=3.0)
    for b in range(2):
        k, v = batch.keys(b)
        ref, _ = reference_decode(q[b], k.float() * 0.5, v.float() * 3.0)
        torch.testing.assert_close(out[b].float(), ref, rtol=2e-2, atol=6e-2, msg=f"request {b}")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_append_quantises_like_torch(device, dtype, layout):
    """Appending bf16/f16 keys to an fp8 cache writes e4m3(x / scale), saturated, bit for bit as
    torch computes it (values beyond 448 * scale, negative ones and subnormals included); slots
    not appended to keep their bytes. Then decode over the appended cache."""
    gen = torch.Generator().manual_seed(13 + (layout == "HND"))
    hk, d, page = 2, 128, 8
    old, new = [9, 0, 20], [3, 6, 1]
    final = [a + b for a, b in zip(old, new, strict=True)]
    batch, _, _ = fp8_batch(final, page, hk, d, device, layout, gen=gen)
    ks, vs = 0.01, 0.005
    expect_k = [batch.keys(b)[0].clone() for b in range(3)]
    expect_v = [batch.keys(b)[1].clone() for b in range(3)]
    key = (torch.randn(10, hk, d, generator=gen) * 2).to(device=device, dtype=dtype)
    value = (torch.randn(10, hk, d, generator=gen) * 2).to(device=device, dtype=dtype)
    key[0, 0, :4] = torch.tensor([1e4, -1e4, 1e-5, -3e-6], dtype=dtype)  # saturate; subnormal
    seq_lens = torch.tensor(final, dtype=torch.int32, device=device)
    append_indptr = torch.tensor([0, 3, 9, 10], dtype=torch.int32, device=device)
    bi, pos = kiln.get_batch_indices_positions(append_indptr, seq_lens, 10)
    kiln.append_paged_kv_cache(
        key,
        value,
        bi,
        pos,
        (batch.k_cache, batch.v_cache),
        batch.indices,
        batch.indptr,
        batch.last_page_len,
        kv_layout=layout,
        k_scale=ks,
        v_scale=vs,
    )
    for i in range(10):
        expect_k[int(bi[i])][int(pos[i])] = quantize(key[i], ks)
        expect_v[int(bi[i])][int(pos[i])] = quantize(value[i], vs)
    for b in range(3):
        k, v = batch.keys(b)
        assert torch.equal(k.view(torch.uint8), expect_k[b].view(torch.uint8)), b
        assert torch.equal(v.view(torch.uint8), expect_v[b].view(torch.uint8)), b
    assert float(batch.keys(0)[0][old[0], 0, 0].float()) == E4M3_MAX  # saturated, not NaN
    q = torch.randn(3, 4, d, generator=gen).to(device=device, dtype=dtype)
    out, lse, _ = run_fp8(batch, q, device, ks, vs)
    check(batch, q, out, lse, ks, vs)


@pytest.mark.gpu
def test_fp8_cuda_graph_replay():
    """A captured fp8 run() replays a re-planned batch, equal to an eager run bit for bit."""
    gen = torch.Generator().manual_seed(3)
    hq, hk, d, page, bsz = 32, 8, 128, 16, 4
    pool, ks, vs = fp8_batch([2000, 1000, 700, 300], page, hk, d, "cuda", gen=gen)
    bufs = dict(
        paged_kv_indptr_buffer=torch.empty(bsz + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(pool.k_cache.shape[0], dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty(bsz, dtype=torch.int32, device="cuda"),
    )
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True, **bufs
    )
    q = torch.randn(bsz, hq, d, generator=gen).to("cuda", torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(bsz, hq, dtype=torch.float32, device="cuda")
    cache = (pool.k_cache, pool.v_cache)

    def plan(batch):
        w.plan(
            batch.indptr,
            batch.indices,
            batch.last_page_len,
            hq,
            hk,
            d,
            page,
            q_data_type=torch.bfloat16,
            kv_data_type=FP8,
        )

    plan(pool)
    w.run(q, cache, out=out, lse=lse, return_lse=True, k_scale=ks, v_scale=vs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, cache, out=out, lse=lse, return_lse=True, k_scale=ks, v_scale=vs)
    second = make_paged([5, 1990, 17, 300], page, hk, d, torch.float32, "cuda", gen=gen)
    second.k_cache, second.v_cache = cache
    used = torch.randperm(pool.k_cache.shape[0], generator=gen)[: int(second.indptr[-1])]
    second.indices = used.to(device="cuda", dtype=torch.int32)
    plan(second)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(second, q, out, lse, ks, vs)
    eager_out, eager_lse = w.run(q, cache, return_lse=True, k_scale=ks, v_scale=vs)
    assert torch.equal(eager_out, out) and torch.equal(eager_lse, lse)


@pytest.mark.parametrize("device", device_params())
def test_bad_fp8_inputs(device):
    gen = torch.Generator().manual_seed(1)
    batch, ks, vs = fp8_batch([40], 16, 2, 64, device, gen=gen)
    q = torch.randn(1, 4, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ws = torch.empty(8 << 20, dtype=torch.uint8, device=device)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
    args = (batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16)
    with pytest.raises(TypeError, match="KV cache of torch.float8_e5m2 is not supported"):
        w.plan(*args, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e5m2)
    with pytest.raises(TypeError, match="KV cache of torch.float16 is not supported with torch.bfloat16"):
        w.plan(*args, q_data_type=torch.bfloat16, kv_data_type=torch.float16)
    w.plan(*args, q_data_type=torch.bfloat16, kv_data_type=FP8)
    cache = (batch.k_cache, batch.v_cache)
    for bad in (0.0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="k_scale must be a finite number > 0"):
            w.run(q, cache, k_scale=bad, v_scale=vs)
    # q_scale folds into the softmax scale (FlashInfer's run does the same): run(q_scale=0.5) is the
    # plan with sm_scale halved, bit for bit.
    halved = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
    halved.plan(*args, q_data_type=torch.bfloat16, kv_data_type=FP8, sm_scale=0.5 / math.sqrt(64))
    assert torch.equal(w.run(q, cache, q_scale=0.5, k_scale=ks, v_scale=vs),
                       halved.run(q, cache, k_scale=ks, v_scale=vs))
    with pytest.raises(ValueError, match="q_scale must be a finite number > 0"):
        w.run(q, cache, q_scale=-1.0, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="cache dtype: planned torch.float8_e4m3fn, got torch.bfloat16"):
        w.run(q, (batch.k_cache.to(torch.bfloat16), batch.v_cache.to(torch.bfloat16)), k_scale=ks)
    assert torch.equal(
        w.run(q, cache, k_scale=torch.tensor(ks), v_scale=vs), w.run(q, cache, k_scale=ks, v_scale=vs)
    )  # a one-element CPU tensor is read
    if device == "cuda":
        with pytest.raises(TypeError, match="k_scale must be a float"):
            w.run(q, cache, k_scale=torch.tensor(ks, device="cuda"), v_scale=vs)
    key = torch.randn(1, 2, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="append_key.dtype float32 is not supported"):
        kiln.append_paged_kv_cache(
            key.float(), key.float(), idx, idx, cache, batch.indices, batch.indptr, batch.last_page_len
        )
    b16 = make_paged([40], 16, 2, 64, torch.bfloat16, device, gen=gen)
    with pytest.raises(ValueError, match="k_scale / v_scale apply to fp8 caches only"):
        kiln.append_paged_kv_cache(
            key,
            key,
            idx,
            idx,
            (b16.k_cache, b16.v_cache),
            b16.indices,
            b16.indptr,
            b16.last_page_len,
            k_scale=0.5,
        )
    with pytest.raises(ValueError, match="v_scale must be a finite number > 0"):
        kiln.append_paged_kv_cache(
            key,
            key,
            idx,
            idx,
            cache,
            batch.indices,
            batch.indptr,
            batch.last_page_len,
            k_scale=ks,
            v_scale=-2.0,
        )


# ---- paged prefill over an fp8 cache ----------------------------------------------------------


def _prefill_backends(device):
    sm90 = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    return ["fa2", "fa3"] if sm90 else ["fa2"]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [True, False])
def test_fp8_paged_prefill(device, layout, causal):
    """Chunked prefill over a cached fp8 prefix (qo_len < kv_len), mixed lengths with an empty
    request: every kernel the device has, against the float32 attention over the dequantised
    cache. The kernels read the fp8 values exactly (E4M3 is exact in 16 bits) and scale in float32:
    the 16-bit prefill tolerance (test_prefill.py) holds, and lse within the same bound."""
    gen = torch.Generator().manual_seed(21 + causal + 2 * (layout == "HND"))
    hq, hk, d, page = 8, 2, 128, 16
    kv_lens, qo_lens = [300, 0, 45, 130], [20, 0, 45, 7]
    batch, ks, vs = fp8_batch(kv_lens, page, hk, d, device, layout, gen=gen)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    for backend in _prefill_backends(device):
        ws = torch.empty(16 << 20, dtype=torch.uint8, device=device)
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend=backend)
        w.plan(
            qo_indptr,
            batch.indptr,
            batch.indices,
            batch.last_page_len,
            hq,
            hk,
            d,
            page,
            causal=causal,
            q_data_type=torch.bfloat16,
            kv_data_type=FP8,
        )
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
        for _ in range(2):  # the staging buffers are reused by a second call (a second layer)
            w.run(
                q, (batch.k_cache, batch.v_cache), k_scale=ks, v_scale=vs, out=out, lse=lse, return_lse=True
            )
        for b, n in enumerate(qo_lens):
            lo = int(qo_indptr[b])
            if n == 0:
                continue
            k, v = dequantised(batch, b, ks, vs)
            ref, ref_lse = reference_attention(q[lo : lo + n], k, v, causal=causal)
            torch.testing.assert_close(
                out[lo : lo + n].float(), ref, rtol=2.5e-2, atol=2.5e-2, msg=f"{backend} request {b}"
            )
            torch.testing.assert_close(
                lse[lo : lo + n], ref_lse, rtol=1e-3, atol=1e-3, msg=f"{backend} lse {b}"
            )


@pytest.mark.parametrize("device", device_params())
def test_prefill_scales_on_16_bit_caches(device):
    """k_scale and v_scale apply to any cache in prefill too (paged and ragged), as in decode."""
    gen = torch.Generator().manual_seed(4)
    batch = make_paged([40, 70], 16, 2, 64, torch.float16, device, gen=gen)
    qo_indptr = torch.tensor([0, 9, 19], dtype=torch.int32)
    q = torch.randn(19, 4, 64, generator=gen).to(device=device, dtype=torch.float16)
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=device)
    paged = kiln.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        16,
        causal=True,
        q_data_type=torch.float16,
    )
    out = paged.run(q, (batch.k_cache, batch.v_cache), k_scale=0.5, v_scale=2.0)
    ragged = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan(
        qo_indptr,
        torch.tensor([0, 40, 110], dtype=torch.int32),
        4,
        2,
        64,
        causal=True,
        q_data_type=torch.float16,
    )
    keys = [batch.keys(b) for b in range(2)]
    out_r = ragged.run(
        q, torch.cat([k for k, _ in keys]), torch.cat([v for _, v in keys]), k_scale=0.5, v_scale=2.0
    )
    for b in range(2):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = keys[b]
        ref, _ = reference_attention(q[lo:hi], k.float() * 0.5, v.float() * 2.0, causal=True)
        torch.testing.assert_close(out[lo:hi].float(), ref, rtol=8e-3, atol=8e-3)
        torch.testing.assert_close(out_r[lo:hi].float(), ref, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("device", device_params())
def test_bad_fp8_prefill_inputs(device):
    """A page id past the cache is an IndexError before the staging gather reads through it; the
    cache must be the planned dtype; single and ragged prefill refuse an fp8 kv_data_type."""
    gen = torch.Generator().manual_seed(8)
    batch, ks, vs = fp8_batch([40], 16, 2, 64, device, gen=gen)
    qo_indptr = torch.tensor([0, 5], dtype=torch.int32)
    q = torch.randn(5, 4, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=device)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws)
    bad = batch.indices.clone()
    bad[1] = batch.k_cache.shape[0] + 3
    w.plan(
        qo_indptr,
        batch.indptr,
        bad,
        batch.last_page_len,
        4,
        2,
        64,
        16,
        q_data_type=torch.bfloat16,
        kv_data_type=FP8,
    )
    with pytest.raises(
        IndexError, match=rf"paged_kv_indices\[1\] = {int(bad[1])} is not a page of the cache"
    ):
        w.run(q, (batch.k_cache, batch.v_cache), k_scale=ks, v_scale=vs)
    w.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        16,
        q_data_type=torch.bfloat16,
        kv_data_type=FP8,
    )
    with pytest.raises(ValueError, match="the cache is torch.bfloat16, planned torch.float8_e4m3fn"):
        w.run(q, (batch.k_cache.to(torch.bfloat16), batch.v_cache.to(torch.bfloat16)))
    with pytest.raises(ValueError, match="q_scale"):
        w.run(q, (batch.k_cache, batch.v_cache), q_scale=2.0)
    ragged = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(ValueError, match="must equal q_data_type"):
        ragged.plan(
            qo_indptr,
            torch.tensor([0, 40], dtype=torch.int32),
            4,
            2,
            64,
            q_data_type=torch.bfloat16,
            kv_data_type=FP8,
        )
