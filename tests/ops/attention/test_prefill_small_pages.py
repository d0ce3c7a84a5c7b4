"""Paged prefill on the sm90a kernel where its TMA boxes cannot tile the cache: pages under 16
tokens (1, 2, 4, 8), pages that neither divide nor are multiples of the KV tile (5, 24), and
strides a tensor map rejects (a cache broadcast over its kv heads: stride 0). The kernel's gather
producer serves them (ops/attention/prefill_sm90.cuh, docs/perf/prefill-sm90.md). The GPU tests
run with KILN_PREFILL_FA3_STRICT=1, which turns a fallback to the FA2 kernel into an error, so a
pass proves the sm90a kernel ran; each compares with the float32 reference on fresh random data,
GQA, mixed lengths with empty and one-token requests. Bad page ids are recorded and poison only
their request. On the CPU (host backend) the same layouts are checked against the reference, and
rows that are not 16-byte aligned are refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from paged import make_paged

import kiln
from kiln.trace.attention import attention as reference

F16, BF16 = torch.float16, torch.bfloat16
# P is rounded to the dtype for P V, the output once; the reference is float32 (as test_prefill.py).
TOL = {F16: (4e-3, 4e-3), BF16: (2.5e-2, 2.5e-2)}
HQ, HK = 8, 2  # GQA: 4 query heads per kv head


def need_sm90():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("backend fa3 runs on compute capability 9.0 GPUs only")


def ws(device):
    return torch.empty(1 << 20, dtype=torch.uint8, device=device)


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def check(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = TOL[dtype]
    assert out.isfinite().all()
    torch.testing.assert_close(out.float(), ref_out, rtol=rtol, atol=atol)
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-3, atol=1e-3)


def run_paged(
    device, backend, k_cache, v_cache, indptr, indices, last, qo_lens, q, page, layout, causal, dtype
):
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws(device), layout, backend=backend)
    w.plan(qo_indptr, indptr, indices, last, HQ, HK, q.shape[-1], page, causal=causal, q_data_type=dtype)
    out, lse = w.run(q, (k_cache, v_cache), return_lse=True)
    return qo_indptr, out, lse


def check_requests(batch_keys, qo_indptr, q, out, lse, causal, dtype, skip=()):
    for b in range(len(qo_indptr) - 1):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if hi > lo and b not in skip:
            k, v = batch_keys(b)
            check(out[lo:hi], lse[lo:hi], *reference(q[lo:hi], k, v, causal), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page", [1, 2, 4, 8, 5, 24])
def test_small_and_odd_pages_run_on_fa3(kiln_env, page, causal, head_dim, dtype):
    """Mixed lengths: a request longer than two KV tiles, one ending mid-page, qo_len < kv_len,
    an empty and a one-token request; pages shuffled over a pool with spare pages."""
    need_sm90()
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    layout = "HND" if page in (2, 5) else "NHD"
    gen = torch.Generator().manual_seed(1000 * page + head_dim + causal)
    qo_lens, kv_lens = [70, 1, 0, 300, 33, 129], [90, 1, 0, 300, 130, 129]
    batch = make_paged(kv_lens, page, HK, head_dim, dtype, "cuda", layout, gen=gen)
    q = rand((sum(qo_lens), HQ, head_dim), dtype, "cuda", gen)
    qo_indptr, out, lse = run_paged(
        "cuda",
        "fa3",
        batch.k_cache,
        batch.v_cache,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        qo_lens,
        q,
        page,
        layout,
        causal,
        dtype,
    )
    check_requests(batch.keys, qo_indptr, q, out, lse, causal, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 5])
def test_gathered_pages_equal_tma_tiles(kiln_env, page):
    """The gather writes the very tile layout TMA writes: a page-1 (or page-5) cache gives the same
    bits as the ragged call (TMA boxes) over the same keys."""
    need_sm90()
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    gen = torch.Generator().manual_seed(page)
    qo_lens, kv_lens = [200, 7, 333], [260, 7, 333]
    batch = make_paged(kv_lens, page, HK, 128, BF16, "cuda", gen=gen)
    q = rand((sum(qo_lens), HQ, 128), BF16, "cuda", gen)
    qo_indptr, out_p, _ = run_paged(
        "cuda",
        "fa3",
        batch.k_cache,
        batch.v_cache,
        batch.indptr,
        batch.indices,
        batch.last_page_len,
        qo_lens,
        q,
        page,
        "NHD",
        True,
        BF16,
    )
    keys = [batch.keys(b) for b in range(3)]
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    ragged = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws("cuda"), backend="fa3")
    ragged.plan(qo_indptr, kv_indptr, HQ, HK, 128, causal=True, q_data_type=BF16)
    out_r = ragged.run(
        q, torch.cat([k for k, _ in keys]).contiguous(), torch.cat([v for _, v in keys]).contiguous()
    )
    assert torch.equal(out_p, out_r)


def check_bad_page_poisons_its_request(batch, qo_lens, page, head_dim, bad, value, gen):
    """Plant page id `value` as request `bad`'s second page entry, run fa3 over the cache: the entry
    is recorded once for kiln.check_errors(), the request's outputs are NaN, the others exact."""
    pool = batch.k_cache.shape[0]
    at = int(batch.indptr[bad]) + 1
    indices = batch.indices.clone()
    indices[at] = value
    q = rand((sum(qo_lens), HQ, head_dim), BF16, "cuda", gen)
    qo_indptr, out, lse = run_paged(
        "cuda",
        "fa3",
        batch.k_cache,
        batch.v_cache,
        batch.indptr,
        indices,
        batch.last_page_len,
        qo_lens,
        q,
        page,
        "NHD",
        True,
        BF16,
    )
    torch.cuda.synchronize()
    message = rf"kv_indices\[{at}\] = {value} is not a page of the cache: valid page ids are \[0, {pool}\)"
    with pytest.raises(kiln.DeviceIndexError, match=message):
        kiln.check_errors()
    kiln.check_errors()  # reported once
    lo, hi = int(qo_indptr[bad]), int(qo_indptr[bad + 1])
    assert out[lo:hi].isnan().all() and lse[lo:hi].isnan().all()
    check_requests(batch.keys, qo_indptr, q, out, lse, True, BF16, skip=(bad,))


@pytest.mark.gpu
@pytest.mark.parametrize("page,bad_id", [(1, "past"), (1, "negative"), (5, "past"), (8, "negative")])
def test_bad_page_ids_are_recorded_and_poison_their_request(kiln_env, page, bad_id):
    """A page id outside the cache is never read: the gather zero-fills its rows, records the entry
    for kiln.check_errors() and writes NaN over its request's outputs; other requests are exact."""
    need_sm90()
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    gen = torch.Generator().manual_seed(77 + page)
    qo_lens, kv_lens = [40, 35, 150], [40, 35, 150]
    batch = make_paged(kv_lens, page, HK, 128, BF16, "cuda", gen=gen)
    value = batch.k_cache.shape[0] + 3 if bad_id == "past" else -5
    check_bad_page_poisons_its_request(batch, qo_lens, page, 128, 1, value, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page", [1, 16])
def test_gathered_batch_of_many_units_per_cta(kiln_env, page, head_dim):
    """More work units (items x query heads: 520 here) than an H100 or H200 has SMs (132), so each
    CTA of the persistent grid, which serves gathered caches at head_dim 64, walks several units of
    different lengths (empty and one-token requests among them): the K/V ring, the Q buffers and
    the consumers' turns run on across units (at 128 the one-CTA-a-unit kernel serves the same
    call). A bad page id in one request is recorded and poisons that request only, whichever CTA
    and unit reach it."""
    need_sm90()
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    gen = torch.Generator().manual_seed(500 + page + head_dim)
    qo_lens = [(97 * i) % 301 for i in range(40)]  # 0 to 300, so 0 to 3 items a request
    qo_lens[5], qo_lens[6] = 0, 1
    kv_lens = [n + (13 * i) % 40 for i, n in enumerate(qo_lens)]
    batch = make_paged(kv_lens, page, HK, head_dim, BF16, "cuda", gen=gen)
    # request 27 has several pages
    check_bad_page_poisons_its_request(batch, qo_lens, page, head_dim, 27, batch.k_cache.shape[0] + 1, gen)


def broadcast_cache(kv_lens, page, head_dim, dtype, device, gen):
    """A paged cache whose kv heads all view one stored head (stride 0 on the head axis, which a
    tensor map rejects): [pool, page, HK, D] NHD, as a cache shared by every kv head would be."""
    pages_per = [(n + page - 1) // page for n in kv_lens]
    pool = sum(pages_per) + 3
    one = rand((2, pool, page, 1, head_dim), dtype, device, gen)
    k_cache, v_cache = (t.expand(pool, page, HK, head_dim) for t in one)
    indices = torch.randperm(pool, generator=gen)[: sum(pages_per)].to(torch.int32).to(device)
    indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32, device=device)
    last = torch.tensor(
        [n - (p - 1) * page for n, p in zip(kv_lens, pages_per, strict=True)],
        dtype=torch.int32,
        device=device,
    )

    def keys(b):
        sel = indices[indptr[b] : indptr[b + 1]].long()
        k, v = (c[sel].reshape(-1, HK, head_dim)[: kv_lens[b]] for c in (k_cache, v_cache))
        return k, v

    return k_cache, v_cache, indptr, indices, last, keys


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("page", [1, 16])
def test_kv_broadcast_over_heads_stride_zero(kiln_env, device, page):
    """Page 16 tiles by TMA, but the stride-0 head axis does not take a tensor map: the gather
    serves it on 9.0 (strict), the host backend on the CPU."""
    backend = "auto"
    if device == "cuda":
        need_sm90()
        kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
        backend = "fa3"
    gen = torch.Generator().manual_seed(page + 3)
    qo_lens, kv_lens = [65, 1, 140], [100, 1, 140]
    k_cache, v_cache, indptr, indices, last, keys = broadcast_cache(kv_lens, page, 64, BF16, device, gen)
    assert k_cache.stride(2) == 0
    q = rand((sum(qo_lens), HQ, 64), BF16, device, gen)
    qo_indptr, out, lse = run_paged(
        device, backend, k_cache, v_cache, indptr, indices, last, qo_lens, q, page, "NHD", True, BF16
    )
    check_requests(keys, qo_indptr, q, out, lse, True, BF16)


@pytest.mark.gpu
def test_a_q_stride_tma_rejects_falls_back_or_fails_strict(kiln_env):
    """q is always loaded by TMA: q broadcast over its heads (stride 0) falls back to the FA2
    kernel, correctly, and under KILN_PREFILL_FA3_STRICT=1 is an error that says why."""
    need_sm90()
    gen = torch.Generator().manual_seed(11)
    kv_lens = [50, 129]
    batch = make_paged(kv_lens, 8, HK, 128, BF16, "cuda", gen=gen)
    q = rand((sum(kv_lens), 1, 128), BF16, "cuda", gen).expand(sum(kv_lens), HQ, 128)
    cache = (batch.k_cache, batch.v_cache, batch.indptr, batch.indices, batch.last_page_len)
    qo_indptr, out, lse = run_paged("cuda", "fa3", *cache, kv_lens, q, 8, "NHD", True, BF16)
    check_requests(batch.keys, qo_indptr, q, out, lse, True, BF16)
    kiln_env.set("KILN_PREFILL_FA3_STRICT", "1")
    with pytest.raises(
        RuntimeError,
        match=r"KILN_PREFILL_FA3_STRICT=1\): q is not 16-byte aligned or has a stride "
        r"TMA cannot take \(q_stride_n 128, q_stride_h 0 elements\)",
    ):
        run_paged("cuda", "fa3", *cache, kv_lens, q, 8, "NHD", True, BF16)


@pytest.mark.parametrize("device", device_params())
def test_rows_that_are_not_16_byte_aligned_are_refused_by_name(device):
    """The gather copies 16-byte units: a cache whose slot stride is 65 elements is refused before
    any launch, on every backend, with the argument and the remedy named."""
    gen = torch.Generator().manual_seed(2)
    wide = rand((4, 8, HK, 65), BF16, device, gen)
    k_cache = wide[..., :64]  # rows of 64 elements, 65 apart
    assert k_cache.stride(2) == 65
    qo_lens = [10]
    q = rand((10, HQ, 64), BF16, device, gen)
    indptr = torch.tensor([0, 2], dtype=torch.int32, device=device)
    indices = torch.tensor([3, 0], dtype=torch.int32, device=device)
    last = torch.tensor([2], dtype=torch.int32, device=device)
    with pytest.raises(
        ValueError, match=r"k_cache must be 16-byte aligned \(data pointer and every stride\)"
    ):
        run_paged(device, "fa2", k_cache, k_cache, indptr, indices, last, qo_lens, q, 8, "NHD", False, BF16)
