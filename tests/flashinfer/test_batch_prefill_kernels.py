"""Re-creates FlashInfer 0.7's tests/attention/test_batch_prefill_kernels.py against kiln: the same
cases, calls (BatchPrefillWith{Paged,Ragged}KVCacheWrapper and single_prefill_with_kv_cache as the
per-request reference, as FlashInfer's file does) and tolerances.

Changed, and why:
- FlashInfer xfails its use_cuda_graph=True cases ("temporarily disable cuda graph"); kiln's
  wrappers keep every buffer a run reads fixed in CUDA graph mode, so those cases run FlashInfer's
  graph code: plan a warm-up batch, capture run(), plan the real batch, replay (CUDA only: on the
  CPU they are deselected).
- FlashInfer skips causal cases with qo_len > kv_len (and every custom-mask case with qo_len >
  kv_len) as unsupported; kiln defines them (a query before the first key sees none: out 0, lse
  -inf) and its batch wrappers are compared with its single prefill there too.
- The paged caches are drawn in float16 directly (FlashInfer draws float32 and keeps both): the
  same values for the kernel and the reference at half the memory (17 GB less at batch 128,
  kv_len 2048, 32 heads x 256).
- The multi-item scoring reference mask is built here in kiln's words from FlashInfer's
  definition: delimiters (position 0 in an item) split the queries into groups; a query sees the
  cached prefix, and the earlier non-delimiter tokens of its own group; a delimiter sees the
  prefix alone.

On the CPU, CPU_CASES and each test's cpu_cases keep one small batch (12 requests of 37 queries
over 54 keys, head_dim 128) and, across the tests, every page size, causal and not, NONE /
ROPE_LLAMA / ALIBI, a custom mask on paged and ragged caches, soft-cap 0 and 30, both return_lse
values, MHA and GQA, and both multi-item cases.
"""

from __future__ import annotations

import numpy
import pytest
import torch

import kiln as flashinfer

CPU_CASES = {"batch_size": (12, 1), "kv_len": (54,), "qo_len": (37,), "head_dim": (128,)}


def _workspace(device, nbytes=256 * 1024 * 1024):
    return torch.empty(nbytes, dtype=torch.int8, device=device)


def _request_kv(cache, kv_indptr_cpu, kv_last_page_len_cpu, i, kv_layout, num_kv_heads, head_dim):
    """Request i's keys (or values) [kv_len, num_kv_heads, head_dim] from one half of a paged
    cache [pages, page_size, heads, head_dim] (NHD) or [pages, heads, page_size, head_dim] (HND)."""
    perm_dims = [0, 2, 1, 3] if kv_layout == "HND" else [0, 1, 2, 3]
    perm_dims_last = [1, 0, 2] if kv_layout == "HND" else [0, 1, 2]
    last = int(kv_last_page_len_cpu[i])
    full = (
        cache[kv_indptr_cpu[i] : kv_indptr_cpu[i + 1] - 1]
        .permute(*perm_dims)
        .reshape(-1, num_kv_heads, head_dim)
    )
    tail = (
        cache[kv_indptr_cpu[i + 1] - 1, :, :last]
        if kv_layout == "HND"
        else cache[kv_indptr_cpu[i + 1] - 1, :last]
    )
    return torch.cat([full, tail.permute(*perm_dims_last).reshape(-1, num_kv_heads, head_dim)], dim=0)


def _paged_setup(
    device,
    batch_size,
    kv_len,
    qo_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    contiguous_kv,
    tuple_cache,
):
    q = torch.randn(batch_size * qo_len, num_qo_heads, head_dim, device=device, dtype=torch.float16)
    q_indptr_cpu = torch.arange(0, batch_size + 1).int() * qo_len
    num_pages_per_seq = (kv_len + page_size - 1) // page_size
    total_num_pages = num_pages_per_seq * batch_size
    shape = [page_size, num_kv_heads] if kv_layout == "NHD" else [num_kv_heads, page_size]
    shape = [total_num_pages, *([] if tuple_cache else [2]), *shape, head_dim]
    if not contiguous_kv:  # every dimension after the first doubled, the data in the odd slices
        shape = [shape[0]] + [x for v in shape[1:] for x in (2, v)]

    def draw():
        data = torch.randn(*shape, device=device, dtype=torch.float16)
        if not contiguous_kv:
            data = data[(slice(None), *([1, slice(None)] * (len(shape) // 2)))]
            assert data.stride(-4) != data.shape[-3] * data.shape[-2] * data.shape[-1]
        return data

    kv_data = (draw(), draw()) if tuple_cache else draw()
    kv_indptr_cpu = torch.arange(0, batch_size + 1).int() * num_pages_per_seq
    kv_indices_cpu = torch.arange(0, total_num_pages).int()
    kv_last_page_len_cpu = torch.full((batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32)
    return q, q_indptr_cpu, kv_data, kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu


def _check_against_single(
    o,
    q,
    kv_data,
    q_indptr_cpu,
    kv_indptr_cpu,
    kv_last_page_len_cpu,
    batch_size,
    kv_layout,
    num_kv_heads,
    head_dim,
    causal,
    pos_encoding_mode,
    logits_soft_cap,
):
    k_cache, v_cache = kv_data if isinstance(kv_data, tuple) else (kv_data[:, 0], kv_data[:, 1])
    for i in range(batch_size):
        qi = q[q_indptr_cpu[i] : q_indptr_cpu[i + 1]]
        ki = _request_kv(k_cache, kv_indptr_cpu, kv_last_page_len_cpu, i, kv_layout, num_kv_heads, head_dim)
        vi = _request_kv(v_cache, kv_indptr_cpu, kv_last_page_len_cpu, i, kv_layout, num_kv_heads, head_dim)
        o_ref_i = flashinfer.prefill.single_prefill_with_kv_cache(
            qi,
            ki,
            vi,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
        )
        o_i = o[q_indptr_cpu[i] : q_indptr_cpu[i + 1]]
        torch.testing.assert_close(o_i, o_ref_i, rtol=1e-3, atol=1e-3)


def _run_paged(
    device,
    batch_size,
    kv_len,
    qo_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    causal,
    kv_layout,
    pos_encoding_mode,
    use_cuda_graph,
    logits_soft_cap,
    return_lse,
    contiguous_kv,
    tuple_cache,
):
    q, q_indptr_cpu, kv_data, kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu = _paged_setup(
        device,
        batch_size,
        kv_len,
        qo_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        kv_layout,
        contiguous_kv,
        tuple_cache,
    )
    common = dict(causal=causal, pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap)
    heads = (num_qo_heads, num_kv_heads, head_dim, page_size)
    if not use_cuda_graph:
        wrapper = flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), kv_layout)
        wrapper.plan(
            q_indptr_cpu.to(device),
            kv_indptr_cpu.to(device),
            kv_indices_cpu.to(device),
            kv_last_page_len_cpu.to(device),
            *heads,
            **common,
        )
        if return_lse:
            o, _ = wrapper.run(q, kv_data, return_lse=True)
        else:
            o = wrapper.run(q, kv_data)
        if not tuple_cache:  # test with pre-allocated output
            o_buffer = torch.empty_like(o)
            wrapper.run(q, kv_data, out=o_buffer)
            torch.testing.assert_close(o, o_buffer, rtol=1e-3, atol=1e-3)
    else:
        total_num_pages = int(kv_indptr_cpu[-1])
        wrapper = flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(
            _workspace(device),
            kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=torch.empty(batch_size + 1, device=device, dtype=torch.int32),
            paged_kv_indptr_buf=torch.empty(batch_size + 1, device=device, dtype=torch.int32),
            paged_kv_indices_buf=torch.empty(total_num_pages, device=device, dtype=torch.int32),
            paged_kv_last_page_len_buf=torch.empty(batch_size, device=device, dtype=torch.int32),
        )
        q_indptr_warmup = torch.arange(0, batch_size + 1).int() * qo_len
        kv_indptr_warmup = torch.arange(0, batch_size + 1).int()
        kv_indices_warmup = torch.arange(0, batch_size).int()
        kv_last_page_len_warmup = torch.full((batch_size,), page_size, dtype=torch.int32)
        wrapper.plan(
            q_indptr_warmup, kv_indptr_warmup, kv_indices_warmup, kv_last_page_len_warmup, *heads, **common
        )

        def run():
            if return_lse:
                return wrapper.run(q, kv_data, return_lse=True)[0]
            return wrapper.run(q, kv_data)

        # warmup
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                o = run()
        torch.cuda.current_stream().wait_stream(s)
        # capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o = run()
        wrapper.plan(q_indptr_cpu, kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu, *heads, **common)
        g.replay()
    _check_against_single(
        o,
        q,
        kv_data,
        q_indptr_cpu,
        kv_indptr_cpu,
        kv_last_page_len_cpu,
        batch_size,
        kv_layout,
        num_kv_heads,
        head_dim,
        causal,
        pos_encoding_mode,
        logits_soft_cap,
    )


@pytest.mark.cpu_cases(
    page_size=(1, 5, 16), causal=(False, True), pos_encoding_mode=("NONE",), use_cuda_graph=(False,)
)
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("qo_len", [37, 17, 127, 577])
@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("num_kv_heads", [32])
@pytest.mark.parametrize("num_qo_heads", [32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("use_cuda_graph", [False, True])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_prefill_with_paged_kv_cache(
    device,
    batch_size,
    kv_len,
    qo_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    causal,
    kv_layout,
    pos_encoding_mode,
    use_cuda_graph,
    logits_soft_cap,
    return_lse,
    contiguous_kv,
):
    _run_paged(
        device,
        batch_size,
        kv_len,
        qo_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        causal,
        kv_layout,
        pos_encoding_mode,
        use_cuda_graph,
        logits_soft_cap,
        return_lse,
        contiguous_kv,
        False,
    )


@pytest.mark.cpu_cases(page_size=(1, 16), causal=(True,), num_qo_heads=(4, 32), use_cuda_graph=(False,))
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("qo_len", [37, 17, 127, 577])
@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("use_cuda_graph", [False, True])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_prefill_with_tuple_paged_kv_cache(
    device,
    batch_size,
    kv_len,
    qo_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    causal,
    kv_layout,
    pos_encoding_mode,
    use_cuda_graph,
    logits_soft_cap,
    return_lse,
    contiguous_kv,
):
    _run_paged(
        device,
        batch_size,
        kv_len,
        qo_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        causal,
        kv_layout,
        pos_encoding_mode,
        use_cuda_graph,
        logits_soft_cap,
        return_lse,
        contiguous_kv,
        True,
    )


@pytest.mark.cpu_cases(page_size=(5,), num_qo_heads=(4,), pos_encoding_mode=("NONE", "ROPE_LLAMA"))
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("qo_len", [37, 17, 127, 577])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_prefill_with_paged_kv_cache_custom_mask(
    device,
    batch_size,
    kv_len,
    qo_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
    contiguous_kv,
):
    q, q_indptr_cpu, kv_data, kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu = _paged_setup(
        device,
        batch_size,
        kv_len,
        qo_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        kv_layout,
        contiguous_kv,
        False,
    )
    q_indptr, kv_indptr = q_indptr_cpu.to(device), kv_indptr_cpu.to(device)
    kv_indices, kv_last_page_len = kv_indices_cpu.to(device), kv_last_page_len_cpu.to(device)
    wrapper = flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), kv_layout)
    custom_mask = torch.tril(
        torch.full((batch_size, qo_len, kv_len), True, device=device),
        diagonal=(kv_len - qo_len),
    ).reshape(-1)
    common = dict(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap)
    # use custom mask
    wrapper.plan(
        q_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        custom_mask=custom_mask,
        **common,
    )
    if return_lse:
        o_custom, _ = wrapper.run(q, kv_data, return_lse=True)
    else:
        o_custom = wrapper.run(q, kv_data)
    # use causal
    wrapper.plan(
        q_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=True,
        **common,
    )
    if return_lse:
        o_causal, _ = wrapper.run(q, kv_data, return_lse=True)
    else:
        o_causal = wrapper.run(q, kv_data)
    torch.testing.assert_close(o_custom, o_causal, rtol=1e-3, atol=1e-3)


def _ragged_setup(device, batch_size, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim):
    q = torch.randn(batch_size * qo_len, num_qo_heads, head_dim, device=device, dtype=torch.float16)
    q_indptr = torch.arange(0, batch_size + 1, device=device, dtype=torch.int32) * qo_len
    k = torch.randn(batch_size * kv_len, num_kv_heads, head_dim, device=device, dtype=torch.float16)
    v = torch.randn(batch_size * kv_len, num_kv_heads, head_dim, device=device, dtype=torch.float16)
    kv_indptr = torch.arange(0, batch_size + 1, device=device, dtype=torch.int32) * kv_len
    return q, q_indptr, k, v, kv_indptr


@pytest.mark.cpu_cases(num_qo_heads=(32,), pos_encoding_mode=("NONE", "ROPE_LLAMA"))
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("qo_len", [37, 17, 127, 577])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
def test_batch_prefill_with_ragged_kv_cache(
    device,
    batch_size,
    kv_len,
    qo_len,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    causal,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
):
    kv_layout = "NHD"
    q, q_indptr, k, v, kv_indptr = _ragged_setup(
        device, batch_size, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim
    )
    wrapper = flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), kv_layout)
    wrapper.plan(
        q_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        causal=causal,
        pos_encoding_mode=pos_encoding_mode,
        logits_soft_cap=logits_soft_cap,
    )
    if return_lse:
        o, _ = wrapper.run(q, k, v, return_lse=True)
    else:
        o = wrapper.run(q, k, v)
    for i in range(batch_size):
        o_ref_i = flashinfer.prefill.single_prefill_with_kv_cache(
            q[q_indptr[i] : q_indptr[i + 1]],
            k[kv_indptr[i] : kv_indptr[i + 1]],
            v[kv_indptr[i] : kv_indptr[i + 1]],
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
        )
        o_i = o[q_indptr[i] : q_indptr[i + 1]]
        torch.testing.assert_close(o_i, o_ref_i, rtol=1e-3, atol=1e-3)


@pytest.mark.cpu_cases(num_qo_heads=(4,))
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("qo_len", [37, 17, 127, 577])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
@pytest.mark.parametrize("logits_soft_cap", [0.0, 30.0])
@pytest.mark.parametrize("return_lse", [True, False])
def test_batch_prefill_with_ragged_kv_cache_custom_mask(
    device,
    batch_size,
    kv_len,
    qo_len,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
):
    kv_layout = "NHD"
    q, q_indptr, k, v, kv_indptr = _ragged_setup(
        device, batch_size, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim
    )
    wrapper = flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), kv_layout)
    custom_mask = torch.tril(
        torch.full((batch_size, qo_len, kv_len), True, device=device),
        diagonal=(kv_len - qo_len),
    ).reshape(-1)
    common = dict(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap)
    # use custom mask
    wrapper.plan(q_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, custom_mask=custom_mask, **common)
    if return_lse:
        o_custom, _ = wrapper.run(q, k, v, return_lse=True)
    else:
        o_custom = wrapper.run(q, k, v)
    # use causal
    wrapper.plan(q_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, causal=True, **common)
    if return_lse:
        o_causal, _ = wrapper.run(q, k, v, return_lse=True)
    else:
        o_causal = wrapper.run(q, k, v)
    torch.testing.assert_close(o_custom, o_causal, rtol=1e-3, atol=1e-3)


def multi_item_mask_dense(token_pos_in_items, prefix_cache_len):
    """The multi-item scoring mask of one request whose queries (one per entry of
    token_pos_in_items, 0 at each delimiter) follow a cached prefix of prefix_cache_len keys:
    [num_queries, prefix_cache_len + num_queries] booleans, flattened."""
    is_delimiter = token_pos_in_items == 0
    n = is_delimiter.numel()
    group = torch.cumsum(is_delimiter.int(), 0)  # the delimiter opens its group
    pos = torch.arange(n, device=token_pos_in_items.device)
    own_group = (group[:, None] == group[None, :]) & (pos[None, :] <= pos[:, None])
    first = int(torch.nonzero(is_delimiter)[0]) if bool(is_delimiter.any()) else n
    before_first = (pos[:, None] >= first) & (pos[None, :] < first)  # tokens ahead of the items
    visible = (own_group | before_first) & ~is_delimiter[None, :] & ~is_delimiter[:, None]
    prefix = torch.ones(n, prefix_cache_len, dtype=torch.bool, device=token_pos_in_items.device)
    return torch.cat([prefix, visible], dim=1).reshape(-1)


@pytest.mark.cpu_cases(
    kv_len=(54, 97),
    qo_len=(37, 81),
    page_size=(1, 5, 16),
    num_qo_heads=(4,),
    logits_soft_cap=(30.0,),
    return_lse=(True, False),
)
@pytest.mark.parametrize("batch_size", [1])
@pytest.mark.parametrize(
    "kv_len, qo_len, prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr",
    [
        (54, 37, 17, list(range(17)) + list(range(19)) + [0], 100, [18]),
        (97, 81, 16, list(range(80)) + [0], 97, [79]),
    ],
)
@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128])
@pytest.mark.parametrize("causal", [True])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0, 30.0])
@pytest.mark.parametrize("return_lse", [True, False])
def test_batch_prefill_with_paged_kv_cache_multi_item_scoring(
    device,
    batch_size,
    kv_len,
    qo_len,
    prefix_len_ptr,
    token_pos_in_items_ptr,
    token_pos_in_items_len,
    max_item_len_ptr,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    causal,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
):
    q, q_indptr_cpu, kv_data, kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu = _paged_setup(
        device,
        batch_size,
        kv_len,
        qo_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        kv_layout,
        True,
        False,
    )
    wrapper = flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(
        _workspace(device, 128 * 1024 * 1024), kv_layout
    )
    wrapper.plan(
        q_indptr_cpu.to(device),
        kv_indptr_cpu.to(device),
        kv_indices_cpu.to(device),
        kv_last_page_len_cpu.to(device),
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=causal,
        pos_encoding_mode=pos_encoding_mode,
        logits_soft_cap=logits_soft_cap,
        prefix_len_ptr=torch.tensor(prefix_len_ptr).to(dtype=torch.uint32).to(device),
        token_pos_in_items_ptr=torch.tensor(token_pos_in_items_ptr).to(dtype=torch.uint16).to(device),
        token_pos_in_items_len=token_pos_in_items_len,
        max_item_len_ptr=torch.tensor(max_item_len_ptr).to(dtype=torch.uint16).to(device),
    )
    if return_lse:
        o, _ = wrapper.run_return_lse(q, kv_data)
    else:
        o = wrapper.run(q, kv_data)
    for i in range(batch_size):
        qi = q[q_indptr_cpu[i] : q_indptr_cpu[i + 1]]
        ki = _request_kv(
            kv_data[:, 0], kv_indptr_cpu, kv_last_page_len_cpu, i, kv_layout, num_kv_heads, head_dim
        )
        vi = _request_kv(
            kv_data[:, 1], kv_indptr_cpu, kv_last_page_len_cpu, i, kv_layout, num_kv_heads, head_dim
        )
        custom_mask = multi_item_mask_dense(
            torch.tensor(token_pos_in_items_ptr, device=device), prefix_len_ptr
        )
        o_ref_i = flashinfer.prefill.single_prefill_with_kv_cache(
            qi,
            ki,
            vi,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
            custom_mask=custom_mask,
        )
        o_i_np = o[q_indptr_cpu[i] : q_indptr_cpu[i + 1]].cpu().numpy()
        o_ref_i_np = o_ref_i.cpu().numpy()
        numpy.testing.assert_allclose(o_i_np, o_ref_i_np, rtol=1e-3, atol=1e-3)
