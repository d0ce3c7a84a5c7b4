"""Decode attention against an independent float32 reference, on the host backend always and on
CUDA where a device is present: batch sizes, kv lengths and page sizes from 1 up, both layouts,
GQA/MQA, sm_scale, soft-cap, sliding window, return_lse, split-KV, non-contiguous caches,
property tests, plan/run mismatches and bad inputs, CUDA graphs."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged import make_paged

import kiln
from kiln._decode_schedule import MIN_CHUNK, schedule
from kiln.trace.attention import attend as reference_decode

DTYPES = [torch.float16, torch.bfloat16]
# Output rounded once to the dtype (half an ulp relative: 2^-11, 2^-8) on top of float32
# accumulation in a different order than the reference; lse is float32.
TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}


def workspace(device):
    return torch.empty(64 << 20, dtype=torch.uint8, device=device)


def run_batch(batch, q, device, soft_cap=None, window_left=-1, sm_scale=None, return_lse=True,
              use_cuda_graph=False):
    hq, d = q.shape[1], q.shape[2]
    hk = batch.k_cache.shape[2] if batch.layout == "NHD" else batch.k_cache.shape[1]
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device), batch.layout)
    w.plan(batch.indptr, batch.indices, batch.last_page_len, hq, hk, d, batch.page_size,
           logits_soft_cap=soft_cap, window_left=window_left, sm_scale=sm_scale, q_data_type=q.dtype)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
    w.run(q, (batch.k_cache, batch.v_cache), out=out, lse=lse, return_lse=return_lse)
    return out, lse, w


def check(batch, q, out, lse, soft_cap=None, window_left=-1, sm_scale=None):
    rtol, atol = TOL[q.dtype]
    assert out.isfinite().all(), "unwritten or non-finite output"
    for b in range(q.shape[0]):
        k, v = batch.keys(b)
        ref, ref_lse = reference_decode(q[b], k, v, sm_scale, soft_cap, window_left)
        torch.testing.assert_close(out[b].float(), ref, rtol=rtol, atol=atol, msg=f"request {b}")
        if lse is not None:
            torch.testing.assert_close(lse[b], ref_lse, rtol=1e-4, atol=1e-4, msg=f"lse of request {b}")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("kv_lens,page_size", [
    ([1], 1), ([7], 8), ([54, 1, 97], 16), ([513, 2048, 7, 1, 54], 32), ([97] * 7, 5), ([16384], 16),
    ([2048, 0, 13], 16),
], ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_decode_grid(device, dtype, kv_lens, page_size, layout):
    gen = torch.Generator().manual_seed(sum(kv_lens) + page_size)
    hq, hk, d = 32, 8, 128
    batch = make_paged(kv_lens, page_size, hk, d, dtype, device, layout, gen=gen)
    q = torch.randn(len(kv_lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    out, lse, _ = run_batch(batch, q, device)
    check(batch, q, out, lse)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("hq,hk", [(8, 8), (16, 8), (32, 8), (64, 8), (12, 4), (24, 1), (6, 2)],
                         ids=lambda v: str(v))
def test_head_dims_and_group_sizes(device, head_dim, hq, hk):
    gen = torch.Generator().manual_seed(hq * 1000 + hk * 10 + head_dim)
    batch = make_paged([300, 33], 16, hk, head_dim, torch.bfloat16, device, gen=gen)
    q = torch.randn(2, hq, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    out, lse, _ = run_batch(batch, q, device)
    check(batch, q, out, lse)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("soft_cap,window_left,sm_scale", [
    (30.0, -1, None), (None, 0, None), (None, 63, None), (None, 200, 0.05), (50.0, 100, 0.2),
    (None, 10_000, None),
])
def test_soft_cap_window_and_scale(device, soft_cap, window_left, sm_scale):
    gen = torch.Generator().manual_seed(17)
    batch = make_paged([513, 64, 1, 200], 16, 4, 128, torch.float16, device, gen=gen)
    q = (3 * torch.randn(4, 16, 128, generator=gen)).to(device=device, dtype=torch.float16)
    out, lse, _ = run_batch(batch, q, device, soft_cap, window_left, sm_scale)
    check(batch, q, out, lse, soft_cap, window_left, sm_scale)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_len", [1, 97, 4096])
def test_single_decode(device, layout, kv_len):
    gen = torch.Generator().manual_seed(kv_len)
    hq, hk, d = 32, 8, 128
    shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
    k = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
    q = torch.randn(hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    out, lse = kiln.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True)
    kn, vn = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    ref, ref_lse = reference_decode(q, kn, vn)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-4, atol=1e-4)
    assert torch.equal(kiln.single_decode_with_kv_cache(q, k, v, kv_layout=layout), out)


@pytest.mark.parametrize("device", device_params())
def test_single_decode_reuses_its_plan_per_shape(device):
    """A repeated call of the same shape and options plans once (no host work, no copies); another
    kv_len or option gets its own plan, and new data through a reused plan is still right."""
    from kiln import decode

    decode._single_plans.clear()
    gen = torch.Generator().manual_seed(3)
    hq, hk, d = 8, 2, 64
    results = []
    for kv_len, soft_cap in [(300, None), (300, None), (301, None), (300, 30.0)]:
        k = torch.randn(kv_len, hk, d, generator=gen).to(device=device, dtype=torch.float16)
        v = torch.randn(kv_len, hk, d, generator=gen).to(device=device, dtype=torch.float16)
        q = torch.randn(hq, d, generator=gen).to(device=device, dtype=torch.float16)
        out = kiln.single_decode_with_kv_cache(q, k, v, logits_soft_cap=soft_cap)
        results.append(len(decode._single_plans))
        if soft_cap is None:
            torch.testing.assert_close(out.float(), reference_decode(q, k, v)[0], rtol=1e-2, atol=1e-2)
    assert results == [1, 1, 2, 3]


@pytest.mark.parametrize("device", device_params())
def test_split_kv_is_deterministic_and_matches_unsplit(device):
    """The same plan gives bitwise-identical results; a split plan agrees with the reference."""
    gen = torch.Generator().manual_seed(5)
    batch = make_paged([5000], 16, 8, 128, torch.bfloat16, device, gen=gen)
    q = torch.randn(1, 32, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    out1, lse1, w = run_batch(batch, q, device)
    info = w.plan_info
    assert info["chunk"] >= MIN_CHUNK and info["partial_slots"] > 1, "batch 1 must be split"
    out2 = w.run(q, (batch.k_cache, batch.v_cache))
    assert torch.equal(out1, out2)
    check(batch, q, out1, lse1)


@pytest.mark.parametrize("device", device_params())
def test_a_workspace_at_an_odd_address_serves_a_split_plan(device):
    """The partial slots are read in 16-byte vectors: the wrapper aligns them inside the buffer."""
    gen = torch.Generator().manual_seed(11)
    batch = make_paged([3000], 16, 8, 128, torch.bfloat16, device, gen=gen)
    q = torch.randn(1, 32, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    buf = torch.empty((64 << 20) + 3, dtype=torch.uint8, device=device)[3:]
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(buf, "NHD")
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 32, 8, 128, 16, q_data_type=torch.bfloat16)
    assert w.plan_info["partial_slots"] > 1
    out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    check(batch, q, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hk,kv_lens", [(32, 8, [9000]), (48, 2, [7000, 300, 1]), (64, 8, [4096, 4096])],
                         ids=["gqa4", "two_head_chunks", "two_requests"])
def test_split_kv_merges_in_the_launch_and_leaves_its_counters_zero(hq, hk, kv_lens):
    """The last CTA of a split request merges its partial slots inside the decode launch; its
    arrival counters return to zero, so every later run (and graph replay) starts clean: repeated
    runs agree bit for bit with each other and with the reference."""
    gen = torch.Generator().manual_seed(hq + hk + len(kv_lens))
    batch = make_paged(kv_lens, 16, hk, 128, torch.bfloat16, "cuda", gen=gen)
    q = torch.randn(len(kv_lens), hq, 128, generator=gen).to("cuda", torch.bfloat16)
    out1, lse1, w = run_batch(batch, q, "cuda")
    assert w.plan_info["partial_slots"] > 1, "the plan must split"
    counters = w._merge_counter
    assert counters is not None and int(counters.abs().sum()) == 0
    for _ in range(3):
        out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
        assert torch.equal(out, out1) and torch.equal(lse, lse1)
    assert int(counters.abs().sum()) == 0
    check(batch, q, out1, lse1)


@pytest.mark.parametrize("device", device_params())
def test_combined_cache_tensor_and_plan_reuse_across_layers(device):
    gen = torch.Generator().manual_seed(9)
    hq, hk, d, page = 8, 2, 64, 8
    batch = make_paged([40, 9, 100], page, hk, d, torch.float16, device, gen=gen)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    w.plan(batch.indptr, batch.indices, batch.last_page_len, hq, hk, d, page, q_data_type=torch.float16)
    for _ in range(3):  # one plan, several layers with different caches and queries
        layer_batch = make_paged([40, 9, 100], page, hk, d, torch.float16, device, gen=gen)
        layer_batch.indices, layer_batch.indptr = batch.indices, batch.indptr
        combined = torch.stack([layer_batch.k_cache, layer_batch.v_cache], dim=1)
        layer_batch.k_cache, layer_batch.v_cache = combined[:, 0], combined[:, 1]
        q = torch.randn(3, hq, d, generator=gen).to(device=device, dtype=torch.float16)
        check(layer_batch, q, w.run(q, combined), None)


def test_schedule_properties():
    """Every token of every request is covered exactly once; split requests get contiguous
    partial slots; items are longest-first; small batches fill about one wave."""
    begin = torch.tensor([0, 0, 10, 0, 500])
    end = torch.tensor([4096, 0, 11, 32768, 700])
    s = schedule(begin, end, kv_units=8, slots=400)
    assert s.chunk % 64 == 0 and s.chunk >= MIN_CHUNK
    for b in range(5):
        mine = (s.request == b).nonzero().flatten()
        ranges = sorted((int(s.token_begin[i]), int(s.token_end[i])) for i in mine)
        covered = [t for lo, hi in ranges for t in range(lo, hi)]
        assert covered == list(range(int(begin[b]), int(end[b]))), b
    lengths = (s.token_end - s.token_begin).tolist()
    assert lengths == sorted(lengths, reverse=True)
    assert s.request.numel() * 8 <= 400 + 5 * 8
    for m, b in enumerate(s.merge_request.tolist()):
        slots = sorted(int(x) for x in s.out_index[s.request == b])
        assert slots == list(range(int(s.merge_indptr[m]), int(s.merge_indptr[m + 1])))
        assert (s.merge_index[s.request == b] == m).all()  # the entry the request's CTAs count in
    assert int(s.out_index.max()) + 1 == s.num_slots
    assert torch.equal(s.merge_index < 0, s.out_index < 0)  # unsplit items merge nothing
    big = schedule(torch.zeros(64, dtype=torch.int64), torch.full((64,), 4096), kv_units=8, slots=396)
    assert big.chunk == 0 and big.num_slots == 0  # a full batch is never split


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_lens=st.lists(st.integers(0, 700), min_size=1, max_size=6), page_size=st.integers(1, 33),
       group=st.sampled_from([1, 2, 3, 4, 8]), hk=st.sampled_from([1, 2]),
       layout=st.sampled_from(["NHD", "HND"]),
       window_left=st.sampled_from([-1, 0, 5, 300]), seed=st.integers(0, 2**31 - 1))
def test_property_host(kv_lens, page_size, group, hk, layout, window_left, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged(kv_lens, page_size, hk, 64, torch.float16, "cpu", layout, spare_pages=3, gen=gen)
    q = torch.randn(len(kv_lens), hk * group, 64, generator=gen).to(torch.float16)
    out, lse, _ = run_batch(batch, q, "cpu", window_left=window_left)
    check(batch, q, out, lse, window_left=window_left)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None)
@given(kv_lens=st.lists(st.integers(0, 5000), min_size=1, max_size=9),
       page_size=st.sampled_from([1, 7, 16, 32]),
       group=st.sampled_from([1, 3, 4, 8]), layout=st.sampled_from(["NHD", "HND"]),
       head_dim=st.sampled_from([64, 128, 256]), seed=st.integers(0, 2**31 - 1))
def test_property_cuda(kv_lens, page_size, group, layout, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged(kv_lens, page_size, 2, head_dim, torch.bfloat16, "cuda", layout, gen=gen)
    q = torch.randn(len(kv_lens), 2 * group, head_dim, generator=gen).to("cuda", torch.bfloat16)
    out, lse, _ = run_batch(batch, q, "cuda")
    check(batch, q, out, lse)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_matches_eager():
    """Capture run() once; re-plan other lengths (same batch size) into the fixed buffers and
    replay: the replay computes the new batch, and equals an eager run bit for bit."""
    gen = torch.Generator().manual_seed(3)
    hq, hk, d, page, bsz = 32, 8, 128, 16, 4
    pool = make_paged([2000, 1000, 700, 300], page, hk, d, torch.bfloat16, "cuda", gen=gen)
    indptr_buf = torch.empty(bsz + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.empty(pool.k_cache.shape[0], dtype=torch.int32, device="cuda")
    last_buf = torch.empty(bsz, dtype=torch.int32, device="cuda")
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(
        workspace("cuda"), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    q = torch.randn(bsz, hq, d, generator=gen).to("cuda", torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(bsz, hq, dtype=torch.float32, device="cuda")
    cache = (pool.k_cache, pool.v_cache)

    def plan(batch):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, hq, hk, d, page, q_data_type=torch.bfloat16)

    plan(pool)
    w.run(q, cache, out=out, lse=lse, return_lse=True)  # loads the module before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, cache, out=out, lse=lse, return_lse=True)
    # A second batch over the same page pool: shorter and reordered requests, one split one.
    second = make_paged([5, 1990, 17, 300], page, hk, d, torch.bfloat16, "cuda", gen=gen)
    second.k_cache, second.v_cache = cache
    used = torch.randperm(pool.k_cache.shape[0], generator=gen)[: int(second.indptr[-1])]
    second.indices = used.to(device="cuda", dtype=torch.int32)
    plan(second)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(second, q, out, lse)
    eager_out, eager_lse = w.run(q, cache, return_lse=True)
    assert torch.equal(eager_out, out) and torch.equal(eager_lse, lse)


# ---- plan/run mismatches and bad inputs ---------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    gen = torch.Generator().manual_seed(1)
    batch = make_paged([20, 30], 16, 2, 64, torch.float16, device, gen=gen)
    ws = workspace(device)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
    with pytest.raises(RuntimeError, match="run called before plan"):
        w.run(torch.zeros(2, 4, 64, dtype=torch.float16, device=device), (batch.k_cache, batch.v_cache))
    with pytest.raises(ValueError, match=r"num_qo_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 6, 4, 64, 16)
    with pytest.raises(ValueError, match="head_dim 96 is not supported; supported: 64, 128, 256"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 96, 16)
    with pytest.raises(TypeError, match="float32 is not supported; supported dtypes: float16, bfloat16"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float32)
    with pytest.raises(ValueError, match=r"last_page_len\[1\] = 17 is outside \[1, page_size=16\]"):
        w.plan(batch.indptr, batch.indices, torch.tensor([4, 17], dtype=torch.int32), 4, 2, 64, 16)
    with pytest.raises(ValueError, match="indptr must start at 0 and be non-decreasing"):
        w.plan(torch.tensor([0, 3, 2], dtype=torch.int32), batch.indices, batch.last_page_len, 4, 2, 64, 16)
    with pytest.raises(ValueError, match="pos_encoding_mode must be one of 'NONE', 'ROPE_LLAMA', got 'ALI"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, pos_encoding_mode="ALIBI")
    with pytest.raises(ValueError, match="q_len_per_req=3 needs kv_len >= q_len_per_req .* empty KV range"):
        w.plan(torch.tensor([0, 1, 3], dtype=torch.int32), batch.indices,
               torch.tensor([2, 14], dtype=torch.int32), 4, 2, 64, 16, q_len_per_req=3)
    with pytest.raises(NotImplementedError, match="is_causal=False with q_len_per_req=2"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, q_len_per_req=2,
               is_causal=False)
    with pytest.raises(NotImplementedError, match="window_right must be 0"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, window_right=-1)
    with pytest.raises(TypeError, match="o_data_type torch.float32 is not supported"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, o_data_type=torch.float32)
    with pytest.raises(ValueError, match=r"seq_lens \[20, 31\] differ from the page table's lengths \[20, "):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
               seq_lens=torch.tensor([20, 31], dtype=torch.int32))
    with pytest.raises(ValueError, match="jit_args .* is not supported"):
        kiln.BatchDecodeWithPagedKVCacheWrapper(ws, jit_args=[])
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float16)
    q = torch.randn(2, 4, 64, generator=gen).to(device=device, dtype=torch.float16)
    with pytest.raises(ValueError,
                       match=r"does not match its plan: q.shape: planned \[2, 4, 64\], got \[2, 8, 64\]"):
        w.run(torch.zeros(2, 8, 64, dtype=torch.float16, device=device), (batch.k_cache, batch.v_cache))
    with pytest.raises(ValueError, match="q.dtype: planned torch.float16, got torch.bfloat16"):
        w.run(q.bfloat16(), (batch.k_cache.bfloat16(), batch.v_cache.bfloat16()))
    other = make_paged([20, 30], 8, 2, 64, torch.float16, device, gen=gen)
    with pytest.raises(ValueError, match="page_size: planned 16, got 8"):
        w.run(q, (other.k_cache, other.v_cache))
    with pytest.raises(ValueError, match="paged_kv_cache must be"):
        w.run(q, (batch.k_cache,))
    raw = torch.zeros(batch.k_cache.numel() + 8, dtype=torch.float16, device=device)
    misaligned = raw[4:4 + batch.k_cache.numel()].view(batch.k_cache.shape)  # 8 bytes off 16
    with pytest.raises(ValueError, match="k_cache must be 16-byte aligned"):
        w.run(q, (misaligned, batch.v_cache))
    with pytest.raises(ValueError, match="extra positional arguments .* are not supported"):
        w.run(q, (batch.k_cache, batch.v_cache), None)
    with pytest.raises(ValueError, match="sinks is not supported"):
        w.run(q, (batch.k_cache, batch.v_cache), sinks=torch.zeros(4, device=device))
    with pytest.raises(ValueError, match=r"q has 4 rows; the plan's batch of 2 x q_len_per_req 1 needs 2"):
        w.run(torch.zeros(4, 4, 64, dtype=torch.float16, device=device), (batch.k_cache, batch.v_cache))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs fixed page-table buffers"):
        kiln.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True)
    with pytest.raises(ValueError, match="kv_layout must be 'NHD' or 'HND'"):
        kiln.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NDH")
    with pytest.raises(ValueError, match="float_workspace_buffer has 16 bytes; kiln needs at least 1048576"):
        kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8, device=device))
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.uint8 or torch.int8 tensor"):
        kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="logits_soft_cap must be None, 0 .* got -5"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, logits_soft_cap=-5.0)
    with pytest.raises(ValueError, match="window_left must be -1 .* got -5"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, window_left=-5)
    with pytest.raises(TypeError, match="indptr must be an int32 tensor .* got torch.float32"):
        w.plan(batch.indptr.float(), batch.indices, batch.last_page_len, 4, 2, 64, 16)
    with pytest.raises(ValueError, match="sm_scale must be None .* got nan"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16, sm_scale=float("nan"))
    # A plan whose split-KV partials need more than the buffer holds fails at plan, naming both.
    graph_ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    bufs = {n: torch.zeros(k, dtype=torch.int32, device=device) for n, k in (
        ("paged_kv_indptr_buffer", 5), ("paged_kv_indices_buffer", 64), ("paged_kv_last_page_len_buffer", 4))}
    small = kiln.BatchDecodeWithPagedKVCacheWrapper(graph_ws, use_cuda_graph=True, **bufs)
    big = make_paged([30] * 4, 16, 1, 256, torch.float16, device, gen=gen)
    with pytest.raises(ValueError, match="float_workspace_buffer has 1048576 bytes; this plan's split-KV "
                                         "partials need"):
        small.plan(big.indptr, big.indices, big.last_page_len, 64, 1, 256, 16, q_data_type=torch.float16)


@pytest.mark.parametrize("device", device_params())
def test_out_of_range_page_ids_are_an_index_error_naming_the_entry(device, kiln_env):
    """The host backend refuses at once; CUDA records it and raises at check_errors(), or at once
    under KILN_VALIDATE_INDICES=1; the request's outputs are NaN, never a read past the cache."""
    gen = torch.Generator().manual_seed(2)
    batch = make_paged([20, 30], 16, 2, 64, torch.float16, device, gen=gen)
    pages = batch.k_cache.shape[0]
    bad = batch.indices.clone()
    bad[1] = pages + 3
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    w.plan(batch.indptr, bad, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float16)
    q = torch.randn(2, 4, 64, generator=gen).to(device=device, dtype=torch.float16)
    message = rf"kv_indices\[1\] = {pages + 3} is not a page of the cache: valid page ids are \[0, {pages}\)"
    if device == "cpu":
        with pytest.raises(IndexError, match=message):
            w.run(q, (batch.k_cache, batch.v_cache))
        return
    out = w.run(q, (batch.k_cache, batch.v_cache))
    torch.cuda.synchronize()
    assert out[0].isnan().all() and out[1].isfinite().all()  # request 0 read the bad page
    with pytest.raises(kiln.DeviceIndexError, match=message):
        kiln.check_errors()
    kiln.check_errors()  # reported once
    kiln_env.set("KILN_VALIDATE_INDICES", "1")
    w.plan(batch.indptr, bad, batch.last_page_len, 4, 2, 64, 16, q_data_type=torch.float16)
    with pytest.raises(kiln.DeviceIndexError, match=message):
        w.run(q, (batch.k_cache, batch.v_cache))


def test_lse_is_base_two_of_the_natural_logsumexp():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(4, 64, generator=gen).half()
    k, v = torch.randn(50, 4, 64, generator=gen).half(), torch.randn(50, 4, 64, generator=gen).half()
    _, lse = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)
    logits = torch.einsum("hd,thd->ht", q.float(), k.float()) / math.sqrt(64)
    torch.testing.assert_close(lse * math.log(2), torch.logsumexp(logits, -1), rtol=1e-4, atol=1e-4)
