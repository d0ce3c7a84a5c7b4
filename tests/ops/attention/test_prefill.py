"""Prefill attention (single, batch paged, batch ragged) against an independent float32 reference
(a materialised masked softmax), on the host backend always and on CUDA where present: odd
lengths, causal alignment when qo_len < kv_len, window edges, soft-cap, mixed-length batches with
empty and one-token requests, paged == ragged == single, property tests and bad inputs."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged import make_paged

import kiln
from kiln.runtime import env
from kiln.trace.attention import attention as reference

# The kernel rounds P to the dtype for P V and the output once; the reference is float32.
TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2.5e-2, 2.5e-2)}


def check(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = TOL[dtype]
    assert out.isfinite().all()
    torch.testing.assert_close(out.float(), ref_out, rtol=rtol, atol=atol)
    if lse is not None:
        finite = ref_lse.isfinite()
        assert torch.equal(lse.isfinite(), finite)
        torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-3, atol=1e-3)


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# The two kernels: fa2 (mma.sync, every family) and fa3 (wgmma + TMA, compute capability 9.0).
BACKENDS = ["fa2", "fa3"]


def need_backend(device, backend):
    if backend == "fa3" and (device != "cuda" or not _sm90()):
        pytest.skip("backend fa3 runs on compute capability 9.0 GPUs only")


@contextlib.contextmanager
def fa3_strict(backend):
    """For backend fa3, build the plan with KILN_PREFILL_FA3_STRICT=1: a silent fallback to fa2
    then fails the test instead of passing on the other kernel."""
    if backend != "fa3":
        yield
        return
    old = os.environ.get("KILN_PREFILL_FA3_STRICT")
    os.environ["KILN_PREFILL_FA3_STRICT"] = "1"
    env.reload()
    try:
        yield
    finally:
        if old is None:
            del os.environ["KILN_PREFILL_FA3_STRICT"]
        else:
            os.environ["KILN_PREFILL_FA3_STRICT"] = old
        env.reload()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    "qo,kv",
    [(1, 1), (7, 7), (63, 63), (127, 300), (257, 257), (1023, 1023), (4099, 4099), (5, 1023), (100, 40)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_single_prefill(device, dtype, qo, kv, causal, backend):
    need_backend(device, backend)
    if device == "cpu" and qo * kv > 300_000:
        pytest.skip("long sequences run on the GPU; the host backend is checked at shorter ones")
    gen = torch.Generator().manual_seed(qo * 7 + kv)
    q, k, v = (
        rand((qo, 8, 128), dtype, device, gen),
        rand((kv, 2, 128), dtype, device, gen),
        rand((kv, 2, 128), dtype, device, gen),
    )
    with fa3_strict(backend):
        out, lse = kiln.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True, backend=backend)
    check(out, lse, *reference(q, k, v, causal), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_single_prefill_hnd_and_sliced_heads(backend, head_dim):
    """HND single prefill, and q a slice of a wider tensor (strided heads, TMA-legal strides)."""
    need_backend("cuda", backend)
    gen = torch.Generator().manual_seed(head_dim)
    wide = rand((300, 12, head_dim), torch.bfloat16, "cuda", gen)
    q = wide[:, 2:10]
    k, v = (
        rand((2, 517, head_dim), torch.bfloat16, "cuda", gen),
        rand((2, 517, head_dim), torch.bfloat16, "cuda", gen),
    )
    for causal in (False, True):
        with fa3_strict(backend):
            out, lse = kiln.single_prefill_with_kv_cache(
                q, k, v, causal=causal, kv_layout="HND", return_lse=True, backend=backend
            )
        ref = reference(q, k.transpose(0, 1), v.transpose(0, 1), causal)
        check(out, lse, *ref, torch.bfloat16)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    "window_left,soft_cap,sm_scale",
    [(-1, None, 0.07), (0, None, None), (31, None, None), (64, 30.0, None), (-1, 50.0, None)],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_head_dims_window_soft_cap(device, head_dim, window_left, soft_cap, sm_scale, backend):
    need_backend(device, backend)
    gen = torch.Generator().manual_seed(head_dim + window_left)
    q = (2 * torch.randn(150, 4, head_dim, generator=gen)).to(device=device, dtype=torch.float16)
    k, v = (
        rand((180, 4, head_dim), torch.float16, device, gen),
        rand((180, 4, head_dim), torch.float16, device, gen),
    )
    with fa3_strict(backend):
        out, lse = kiln.single_prefill_with_kv_cache(
            q,
            k,
            v,
            causal=True,
            window_left=window_left,
            logits_soft_cap=soft_cap,
            sm_scale=sm_scale,
            return_lse=True,
            backend=backend,
        )
    check(out, lse, *reference(q, k, v, True, window_left, soft_cap, sm_scale), torch.float16)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page,d", [(16, 64), (16, 128), (32, 256), (128, 64), (1, 128), (7, 64)])
def test_paged_equals_ragged_equals_single_on_mixed_batches(device, layout, backend, page, d):
    """Mixed lengths with an empty request, a one-query request, qo_len < kv_len; shuffled pages.
    fa3 loads pages of 32 at head_dim 256 (two per KV tile) and 128 (a tile inside a page) by TMA
    boxes; its gather producer serves pages of 1, 7 and 16 at head_dim 64 and 128
    (test_prefill_small_pages.py), bit for bit the tiles TMA loads for the ragged and single
    calls."""
    need_backend(device, backend)
    if device == "cpu" and (page, d) != (16, 64):
        pytest.skip("the host backend has one kernel; one page size covers it")
    gen = torch.Generator().manual_seed(23)
    hq, hk = 8, 2
    qo_lens, kv_lens = [70, 1, 0, 200, 33], [90, 1, 0, 200, 130]
    batch = make_paged(kv_lens, page, hk, d, torch.bfloat16, device, layout, gen=gen)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), torch.bfloat16, device, gen)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    with fa3_strict(backend):
        paged = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend=backend)
    paged.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        hq,
        hk,
        d,
        page,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    out_p, lse_p = paged.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    ks = [batch.keys(b)[0] for b in range(5)]
    vs = [batch.keys(b)[1] for b in range(5)]
    kv_indptr = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0)), dtype=torch.int32)
    with fa3_strict(backend):
        ragged = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, backend=backend)
    ragged.plan(qo_indptr, kv_indptr, hq, hk, d, causal=True, q_data_type=torch.bfloat16)
    out_r = ragged.run(q, torch.cat(ks).contiguous(), torch.cat(vs).contiguous())
    assert torch.equal(out_p, out_r)  # the same kernel over the same keys
    for b in range(5):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if hi == lo:
            continue
        ref_out, ref_lse = reference(q[lo:hi], ks[b], vs[b], causal=True)
        check(out_p[lo:hi], lse_p[lo:hi], ref_out, ref_lse, torch.bfloat16)
        with fa3_strict(backend):
            single = kiln.single_prefill_with_kv_cache(q[lo:hi], ks[b], vs[b], causal=True, backend=backend)
        assert torch.equal(single, out_p[lo:hi])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_paged_stale_nan_slots_do_not_leak(backend, layout, head_dim):
    """Slots past a request's length in its last page, and unused pool pages, hold NaN: a kernel
    that lets them into P V (0 * NaN) or into the row max poisons the output. fa3 loads whole pages
    by TMA, so it must zero V's stale rows itself."""
    need_backend("cuda", backend)
    gen = torch.Generator().manual_seed(head_dim)
    kv_lens, qo_lens, page = [37, 130, 16, 1], [37, 20, 3, 1], 16
    batch = make_paged(kv_lens, page, 2, head_dim, torch.bfloat16, "cuda", layout, gen=gen)
    used = torch.zeros(batch.k_cache.shape[0], page, dtype=torch.bool)
    for b, n in enumerate(kv_lens):
        pages = batch.indices[batch.indptr[b] : batch.indptr[b + 1]].long().cpu()
        for j, pg in enumerate(pages.tolist()):
            used[pg, : min(page, n - j * page)] = True
    keep = {b: batch.keys(b) for b in range(len(kv_lens))}  # valid keys, before the poisoning
    stale = ~used.to("cuda")
    for cache in (batch.k_cache, batch.v_cache):
        view = cache if layout == "NHD" else cache.transpose(1, 2)  # [pool, page, heads, D]
        view[stale] = float("nan")
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = rand((sum(qo_lens), 4, head_dim), torch.bfloat16, "cuda", gen)
    with fa3_strict(backend):
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), layout, backend=backend
        )
    w.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        head_dim,
        page,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    for b in range(len(kv_lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        check(out[lo:hi], lse[lo:hi], *reference(q[lo:hi], *keep[b], causal=True), torch.bfloat16)


@pytest.mark.parametrize("tile", [128, 64])
def test_schedule_covers_every_query_once_longest_first(tile):
    from kiln.prefill import schedule

    qo, kv = torch.tensor([130, 0, 64, 1]), torch.tensor([130, 5, 1000, 1])
    request, q_start = schedule(qo, kv, True, tile)
    covered = sorted(
        (int(r), int(s) + i)
        for r, s in zip(request, q_start, strict=True)
        for i in range(tile)
        if int(s) + i < int(qo[int(r)])
    )
    assert covered == [(b, i) for b in range(4) for i in range(int(qo[b]))]
    assert int(request[0]) == 2  # the item that sees the most keys first


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.tuples(st.integers(0, 90), st.integers(0, 90)), min_size=1, max_size=4),
    page=st.integers(1, 20),
    causal=st.booleans(),
    window=st.sampled_from([-1, 0, 9]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_host(lens, page, causal, window, seed):
    qo_lens = [a for a, _ in lens]
    kv_lens = [max(a, b) if causal else b for a, b in lens]
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged(kv_lens, page, 2, 64, torch.float16, "cpu", gen=gen)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = rand((sum(qo_lens), 4, 64), torch.float16, "cpu", gen)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    w.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        4,
        2,
        64,
        page,
        causal=causal,
        window_left=window,
        q_data_type=torch.float16,
    )
    out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    for b in range(len(lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if hi > lo:
            k, v = batch.keys(b)
            check(out[lo:hi], lse[lo:hi], *reference(q[lo:hi], k, v, causal, window), torch.float16)


@pytest.mark.gpu
@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=5),
    page=st.sampled_from([1, 16, 7, 64]),
    causal=st.booleans(),
    head_dim=st.sampled_from([64, 128, 256]),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_property_cuda(backend, lens, page, causal, head_dim, seed):
    need_backend("cuda", backend)
    qo_lens = [a for a, _ in lens]
    kv_lens = [max(a, b) if causal else b for a, b in lens]
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged(kv_lens, page, 2, head_dim, torch.bfloat16, "cuda", gen=gen)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = rand((sum(qo_lens), 8, head_dim), torch.bfloat16, "cuda", gen)
    with fa3_strict(backend):  # page 64 (and 16 at head_dim 256) by TMA, the rest by the gather
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), backend=backend
        )
    w.plan(
        qo_indptr,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        8,
        2,
        head_dim,
        page,
        causal=causal,
        q_data_type=torch.bfloat16,
    )
    out, lse = w.run(q, (batch.k_cache, batch.v_cache), return_lse=True)
    for b in range(len(lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if hi > lo:
            k, v = batch.keys(b)
            check(out[lo:hi], lse[lo:hi], *reference(q[lo:hi], k, v, causal), torch.bfloat16)


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    gen = torch.Generator().manual_seed(0)
    q, k = rand((5, 4, 64), torch.float16, device, gen), rand((5, 2, 64), torch.float16, device, gen)
    with pytest.raises(ValueError, match=r"custom_mask has 20 elements \(shape \[4, 5\]\); .* sum to 25"):
        kiln.single_prefill_with_kv_cache(q, k, k, custom_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="head_dim 48 is not supported"):
        kiln.single_prefill_with_kv_cache(q[..., :48], k[..., :48], k[..., :48])
    with pytest.raises(ValueError, match=r"num_qo_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        kiln.single_prefill_with_kv_cache(
            q, rand((5, 3, 64), torch.float16, device, gen), rand((5, 3, 64), torch.float16, device, gen)
        )
    with pytest.raises(ValueError, match="pos_encoding_mode must be one of 'NONE', 'ROPE_LLAMA', 'ALIBI'"):
        kiln.single_prefill_with_kv_cache(q, k, k, pos_encoding_mode="rope")
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    w = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(RuntimeError, match="run called before plan"):
        w.run(q, k, k)
    w.plan(
        torch.tensor([0, 5], dtype=torch.int32),
        torch.tensor([0, 5], dtype=torch.int32),
        4,
        2,
        64,
        q_data_type=torch.float16,
    )
    with pytest.raises(ValueError, match=r"does not match its plan: k \[4, 2, 64\]"):
        w.run(q, k[:4], k[:4])
    with pytest.raises(ValueError, match="does not match its plan: q is"):
        w.run(q[:4], k, k)
    with pytest.raises(ValueError, match="qo_indptr must start at 0 and be non-decreasing"):
        w.plan(
            torch.tensor([0, 5, 2], dtype=torch.int32), torch.tensor([0, 5, 6], dtype=torch.int32), 4, 2, 64
        )


@pytest.mark.parametrize("device", device_params())
def test_backend_argument(device):
    """FlashInfer's backend names; fa3 only on compute capability 9.0, a clear error elsewhere."""
    gen = torch.Generator().manual_seed(1)
    q, k = rand((9, 4, 64), torch.float16, device, gen), rand((9, 2, 64), torch.float16, device, gen)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    ref = kiln.single_prefill_with_kv_cache(q, k, k, causal=True, backend="fa2")
    torch.testing.assert_close(
        kiln.single_prefill_with_kv_cache(q, k, k, causal=True), ref, rtol=4e-3, atol=4e-3
    )
    for make in (
        lambda b: kiln.single_prefill_with_kv_cache(q, k, k, backend=b),
        lambda b: kiln.BatchPrefillWithPagedKVCacheWrapper(ws, backend=b),
        lambda b: kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, backend=b),
    ):
        with pytest.raises(ValueError, match="backend must be one of 'auto', 'fa2', 'fa3', got 'cudnn'"):
            make("cudnn")
        if device == "cpu" or not _sm90():
            with pytest.raises(ValueError, match=r"backend='fa3' needs a compute capability 9\.0 GPU.*sm90a"):
                make("fa3")


def test_auto_backend_picks_fa3_on_sm90_only(monkeypatch, kiln_env):
    """backend="auto" asks for the sm90a kernel on compute capability 9.0 (faster there on every
    measured shape: docs/perf/prefill.md) and the fa2 kernel on every other device."""
    from kiln import _attention

    cuda = torch.device("cuda", 0)
    cpu = torch.device("cpu")
    kiln_env.unset("KILN_PREFILL_FA3_STRICT")
    for cc, expected in (
        ((9, 0), "fa3"),
        ((8, 0), "fa2"),
        ((8, 9), "fa2"),
        ((10, 0), "fa2"),
        ((12, 0), "fa2"),
    ):
        monkeypatch.setattr(_attention.utils, "compute_capability", lambda device, cc=cc: cc)
        _attention._is_sm90.cache_clear()
        assert _attention.prefill_kernel("auto", cuda, "api") == expected, cc
        assert _attention.prefill_kernel("fa2", cuda, "api") == "fa2"
    assert _attention.prefill_kernel("auto", cpu, "api") == "fa2"
    # KILN_PREFILL_FA3_STRICT turns auto's fallback on 9.0 into an error too (docs/env.md).
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    monkeypatch.setattr(_attention.utils, "compute_capability", lambda device: (9, 0))
    _attention._is_sm90.cache_clear()
    assert _attention.prefill_kernel("auto", cuda, "api") == "fa3_strict"
    assert _attention.prefill_kernel("fa2", cuda, "api") == "fa2"
    monkeypatch.undo()
    _attention._is_sm90.cache_clear()  # the real answer again for later tests
