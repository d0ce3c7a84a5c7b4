"""Re-creates FlashInfer 0.7's tests/attention/test_batch_decode_kernels.py against kiln: paged batch
decode (NHD caches as one [pages, 2, ...] tensor and as a (k, v) tuple; f16 queries over f16 and fp8
E4M3 caches; pos_encoding_mode NONE and ROPE_LLAMA; return_lse; user-allocated outputs),
fast_decode_plan, CUDAGraphBatchDecodeWithPagedKVCacheWrapper, multi-token decode
(plan(q_len_per_req=N)) under CUDA graphs, its plan/run contract, extreme logits and
torch.compile(mode="reduce-overhead") of single decode. FlashInfer's reference is its own
single_decode_with_kv_cache per request, and so is this one's (kiln's: tests/ops/attention checks
both against the float32 reference).

Sizes: FlashInfer's parametrisations on CUDA. Its first test draws a pairwise subset of its grid
by default and the whole product under ``--full``; this file runs the whole product. CPU runs keep
CPU_CASES: one batch size, length and head count, every page size, head_dim 128, both position
encodings and both cache dtypes (GQA on the host backend: tests/ops/attention).

Left out or adapted, with why:
- head_dim 512 and NVFP4 caches (kv_data_type=torch.uint8 with kv_cache_sf) are not_claimed:
  kiln's decode kernels take head_dim 64, 128 and 256, and 16-bit or fp8 E4M3 caches.
- FlashInfer's cuTile backend runner of the shared case is not re-created (test_batch_decode_cutile
  is another file); the shared case keeps its "fa2" backend argument, which kiln accepts.
- Where FlashInfer refuses a call kiln serves, the assertion checks that kiln serves it correctly
  instead: K and V pools with different strides (FlashInfer's CUDA-core kernel addresses V through
  K's strides; kiln reads each through its own), and multi-token decode with use_tensor_cores=False
  or backend="fa3" (kiln has one decode kernel for every call).
- test_tensor_core_decode_cuda_graph_padding_without_split_kv reads FlashInfer's plan_info fields
  and int workspace (PrefillPlanInfo::ToVector order); kiln has neither, so it keeps the outcome
  the test guards: a CUDA-graph wrapper planned with disable_split_kv=True gives the eager result.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

import kiln as flashinfer
from tests.flashinfer.conftest import not_claimed

CPU_CASES = {
    "batch_size": (12,),
    "kv_len": (97,),
    "num_qo_heads": (4,),
    "head_dim": (128,),
}
DECODE_HEAD_DIMS = (64, 128, 256)


def skip_if_head_dim_unsupported(head_dim: int):
    if head_dim not in DECODE_HEAD_DIMS:
        not_claimed(f"decode attention at head_dim {head_dim} (kiln's decode kernels take 64, 128 and 256)")


def _random(shape, dtype, device):
    """N(0, 1) values rounded to `dtype`, as FlashInfer's randn(float32).to(dtype), drawn in
    slices so a 16384-token cache never holds a float32 copy (the reference reads this tensor)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    flat = out.view(-1) if dtype.itemsize > 1 else out.view(torch.uint8).view(-1)
    step = 1 << 26
    for start in range(0, flat.numel(), step):
        chunk = torch.randn(min(step, flat.numel() - start), dtype=torch.float32, device=device).to(dtype)
        flat[start : start + chunk.numel()] = chunk if dtype.itemsize > 1 else chunk.view(torch.uint8)
    return out


def _request_kv(cache, i, kv_indptr, kv_last_page_len, kv_layout, num_kv_heads, head_dim):
    """Request i's keys (or values) [kv_len, num_kv_heads, head_dim] from one half of the cache:
    its full pages, then its last page's first kv_last_page_len[i] slots (gathered in float32 and
    rounded back: exact, and torch.cat takes no fp8)."""
    perm_dims = [0, 2, 1, 3] if kv_layout == "HND" else [0, 1, 2, 3]
    perm_dims_last = [1, 0, 2] if kv_layout == "HND" else [0, 1, 2]
    first, end, last = int(kv_indptr[i]), int(kv_indptr[i + 1]), int(kv_last_page_len[i])
    full = cache[first : end - 1].float().permute(*perm_dims).reshape(-1, num_kv_heads, head_dim)
    tail = cache[end - 1, :, :last] if kv_layout == "HND" else cache[end - 1, :last]
    tail = tail.float().permute(*perm_dims_last).reshape(-1, num_kv_heads, head_dim)
    return torch.cat([full, tail], dim=0).to(cache.dtype)


def _check_against_single_decode(
    o,
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_last_page_len,
    kv_layout,
    num_kv_heads,
    head_dim,
    pos_encoding_mode,
    logits_soft_cap=0.0,
):
    kv_indptr, kv_last_page_len = kv_indptr.cpu(), kv_last_page_len.cpu()
    for i in range(q.shape[0]):
        ki = _request_kv(k_cache, i, kv_indptr, kv_last_page_len, kv_layout, num_kv_heads, head_dim)
        vi = _request_kv(v_cache, i, kv_indptr, kv_last_page_len, kv_layout, num_kv_heads, head_dim)
        o_ref_i = flashinfer.decode.single_decode_with_kv_cache(
            q[i], ki, vi, pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap
        )
        torch.testing.assert_close(o[i], o_ref_i, rtol=1e-3, atol=1e-3)


def _paged_case(batch_size, kv_len, page_size, num_kv_heads, head_dim, kv_layout, kv_dtype, device, split):
    """FlashInfer's cache for these cases: every request kv_len long over consecutive pages;
    `split`: a (k, v) tuple of 4-D caches, else one [pages, 2, ...] tensor."""
    num_pages_per_seq = (kv_len + page_size - 1) // page_size
    total_num_pages = num_pages_per_seq * batch_size
    inner = [num_kv_heads, page_size, head_dim] if kv_layout == "HND" else [page_size, num_kv_heads, head_dim]
    if split:
        kv_data = tuple(_random([total_num_pages, *inner], kv_dtype, device) for _ in range(2))
    else:
        kv_data = _random([total_num_pages, 2, *inner], kv_dtype, device)
    kv_indptr = torch.arange(0, batch_size + 1, device=device, dtype=torch.int32) * num_pages_per_seq
    kv_indices = torch.arange(0, total_num_pages, device=device, dtype=torch.int32)
    kv_last_page_len = torch.full(
        (batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32, device=device
    )
    return kv_data, kv_indptr, kv_indices, kv_last_page_len


def _halves(kv_data):
    return kv_data if isinstance(kv_data, tuple) else (kv_data[:, 0], kv_data[:, 1])


def _run_batch_decode_with_paged_kv_cache_case(
    backend,
    batch_size,
    kv_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
    q_dtype,
    kv_dtype,
    contiguous_kv,
    device,
):
    """One paged-decode case against the single-decode reference."""
    skip_if_head_dim_unsupported(head_dim)
    assert contiguous_kv  # FlashInfer's grid keeps contiguous caches only
    q = torch.randn(batch_size, num_qo_heads, head_dim, device=device, dtype=q_dtype)
    kv_data, kv_indptr, kv_indices, kv_last_page_len = _paged_case(
        batch_size, kv_len, page_size, num_kv_heads, head_dim, kv_layout, kv_dtype, device, split=False
    )

    workspace_buffer = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(
        workspace_buffer, kv_layout, backend=backend
    )
    wrapper.plan(
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode,
        data_type=kv_dtype,
        q_data_type=q_dtype,
    )
    if return_lse:
        o, _ = wrapper.run(q, kv_data, return_lse=True)
    else:
        o = wrapper.run(q, kv_data)

    _check_against_single_decode(
        o,
        q,
        *_halves(kv_data),
        kv_indptr,
        kv_last_page_len,
        kv_layout,
        num_kv_heads,
        head_dim,
        pos_encoding_mode,
        logits_soft_cap,
    )

    # a user-allocated output
    o_buffer = torch.empty_like(o)
    wrapper.run(q, kv_data, out=o_buffer)
    torch.testing.assert_close(o, o_buffer, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("head_dim", [128, 256, 512])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048, 16384])
@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("q_dtype", [torch.float16])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_decode_with_paged_kv_cache(
    batch_size,
    kv_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
    q_dtype,
    kv_dtype,
    contiguous_kv,
    device,
):
    """Paged decode must match the single-decode reference."""
    _run_batch_decode_with_paged_kv_cache_case(
        "fa2",
        batch_size,
        kv_len,
        page_size,
        num_kv_heads,
        num_qo_heads,
        head_dim,
        kv_layout,
        pos_encoding_mode,
        logits_soft_cap,
        return_lse,
        q_dtype,
        kv_dtype,
        contiguous_kv,
        device,
    )


global_override_indptr_cpu = None
MAX_BATCH_SIZE = 128


@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048, 16384])
@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("q_dtype", [torch.float16])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_decode_with_paged_kv_cache_with_fast_plan(
    batch_size,
    kv_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
    q_dtype,
    kv_dtype,
    contiguous_kv,
    device,
):
    q = torch.randn(batch_size, num_qo_heads, head_dim, device=device, dtype=q_dtype)
    num_pages_per_seq = (kv_len + page_size - 1) // page_size

    global global_override_indptr_cpu
    global_override_indptr_cpu = (
        torch.arange(0, batch_size + 1, device="cpu", dtype=torch.int32) * num_pages_per_seq
    )

    kv_data, kv_indptr, kv_indices, kv_last_page_len = _paged_case(
        batch_size, kv_len, page_size, num_kv_heads, head_dim, kv_layout, kv_dtype, device, split=False
    )

    workspace_buffer = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, kv_layout)
    wrapper.plan(
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode,
        data_type=kv_dtype,
        q_data_type=q_dtype,
    )
    wrapper.plan = partial(flashinfer.fast_decode_plan, wrapper)
    wrapper.plan(
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode,
        data_type=kv_dtype,
        q_data_type=q_dtype,
        non_blocking=True,
        global_override_indptr_cpu=global_override_indptr_cpu,
    )
    if return_lse:
        o, _ = wrapper.run(q, kv_data, return_lse=True)
    else:
        o = wrapper.run(q, kv_data)

    _check_against_single_decode(
        o,
        q,
        *_halves(kv_data),
        kv_indptr,
        kv_last_page_len,
        kv_layout,
        num_kv_heads,
        head_dim,
        pos_encoding_mode,
        logits_soft_cap,
    )

    o_buffer = torch.empty_like(o)
    wrapper.run(q, kv_data, out=o_buffer)
    torch.testing.assert_close(o, o_buffer, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048, 16384])
@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("logits_soft_cap", [0.0])
@pytest.mark.parametrize("return_lse", [True])
@pytest.mark.parametrize("q_dtype", [torch.float16])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_batch_decode_with_tuple_paged_kv_cache(
    batch_size,
    kv_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    logits_soft_cap,
    return_lse,
    q_dtype,
    kv_dtype,
    contiguous_kv,
    device,
):
    q = torch.randn(batch_size, num_qo_heads, head_dim, device=device, dtype=q_dtype)
    kv_data, kv_indptr, kv_indices, kv_last_page_len = _paged_case(
        batch_size, kv_len, page_size, num_kv_heads, head_dim, kv_layout, kv_dtype, device, split=True
    )
    assert isinstance(kv_data, tuple)

    workspace_buffer = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, kv_layout)
    wrapper.plan(
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode,
        data_type=kv_dtype,
        q_data_type=q_dtype,
    )
    if return_lse:
        o, _ = wrapper.run(q, kv_data, return_lse=True)
    else:
        o = wrapper.run(q, kv_data)

    _check_against_single_decode(
        o,
        q,
        *kv_data,
        kv_indptr,
        kv_last_page_len,
        kv_layout,
        num_kv_heads,
        head_dim,
        pos_encoding_mode,
        logits_soft_cap,
    )


@pytest.mark.cuda_only
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 2048, 16384])
@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kv_layout", ["NHD"])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("q_dtype", [torch.float16])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("contiguous_kv", [True])
def test_cuda_graph_batch_decode_with_paged_kv_cache(
    batch_size,
    kv_len,
    page_size,
    num_kv_heads,
    num_qo_heads,
    head_dim,
    kv_layout,
    pos_encoding_mode,
    q_dtype,
    kv_dtype,
    contiguous_kv,
    device,
):
    q = torch.randn(batch_size, num_qo_heads, head_dim, device=device, dtype=q_dtype)
    num_pages_per_seq = (kv_len + page_size - 1) // page_size
    total_num_pages = num_pages_per_seq * batch_size
    kv_data, _, _, _ = _paged_case(
        batch_size, kv_len, page_size, num_kv_heads, head_dim, kv_layout, kv_dtype, device, split=False
    )
    kv_indptr_host_warmup = torch.arange(0, batch_size + 1, device=device, dtype=torch.int32)
    kv_indices_host_warmup = torch.arange(0, batch_size, device=device, dtype=torch.int32)
    kv_last_page_len_host_warmup = torch.full((batch_size,), page_size, dtype=torch.int32)

    # more space than the warm-up plan needs
    kv_indptr_device_buffer = torch.empty(batch_size + 1, device=device, dtype=torch.int32)
    kv_indices_device_buffer = torch.empty(total_num_pages, device=device, dtype=torch.int32)
    kv_last_page_device_buffer = torch.empty(batch_size, device=device, dtype=torch.int32)

    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.decode.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        workspace_buffer,
        kv_indptr_device_buffer,
        kv_indices_device_buffer,
        kv_last_page_device_buffer,
        kv_layout,
    )
    wrapper.plan(
        kv_indptr_host_warmup,
        kv_indices_host_warmup,
        kv_last_page_len_host_warmup,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        data_type=kv_dtype,
        pos_encoding_mode=pos_encoding_mode,
        q_data_type=q_dtype,
    )
    # warm up
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            o = wrapper.run(q, kv_data)
    torch.cuda.current_stream().wait_stream(s)

    # capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = wrapper.run(q, kv_data)

    # replay with other page tables
    for i in range(1, min(4, num_pages_per_seq)):
        kv_indptr_host = torch.arange(0, batch_size + 1).int() * i
        kv_indices_host = torch.arange(0, i * batch_size).int()
        kv_last_page_len_host = torch.full((batch_size,), page_size, dtype=torch.int32)
        wrapper.plan(
            kv_indptr_host,
            kv_indices_host,
            kv_last_page_len_host,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            data_type=kv_dtype,
            pos_encoding_mode=pos_encoding_mode,
            q_data_type=q_dtype,
        )
        g.replay()

    # replay again, with the whole cache
    kv_indptr_host = torch.arange(0, batch_size + 1).int() * num_pages_per_seq
    kv_indices_host = torch.arange(0, total_num_pages).int()
    kv_last_page_len_host = torch.full((batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32)
    wrapper.plan(
        kv_indptr_host,
        kv_indices_host,
        kv_last_page_len_host,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        data_type=kv_dtype,
        pos_encoding_mode=pos_encoding_mode,
        q_data_type=q_dtype,
    )
    g.replay()

    _check_against_single_decode(
        o,
        q,
        *_halves(kv_data),
        kv_indptr_host,
        kv_last_page_len_host,
        kv_layout,
        num_kv_heads,
        head_dim,
        pos_encoding_mode,
    )


@pytest.mark.cpu_cases(page_size=(16,), num_qo_heads=(4,), q_dtype=(torch.float16,))
@pytest.mark.parametrize("batch_size", [12, 17, 128])
@pytest.mark.parametrize("kv_len", [54, 97, 512, 2048])
@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("num_kv_heads", [4])
@pytest.mark.parametrize("num_qo_heads", [4, 32])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
def test_batch_decode_with_paged_kv_cache_nvfp4(
    batch_size, kv_len, page_size, num_kv_heads, num_qo_heads, head_dim, q_dtype, device
):
    not_claimed("NVFP4 KV caches (kv_data_type=torch.uint8 with kv_cache_sf block scales)")


def test_batch_decode_with_paged_kv_cache_nvfp4_large_head(device):
    not_claimed("NVFP4 KV caches (kv_data_type=torch.uint8 with kv_cache_sf block scales) at head_dim 512")


def test_batch_decode_rejects_unequal_kv_strides_nvfp4_contract(device):
    """K and V pools with the same shape and different strides: FlashInfer's CUDA-core kernel
    walks V through K's strides and so refuses them; kiln reads each through its own, so the
    positive control and the unequal pools both match the reference."""
    torch.manual_seed(42)
    batch_size, kv_len, page_size, num_kv_heads, num_qo_heads, head_dim = 4, 54, 8, 4, 4, 128
    dtype = torch.float16

    q = torch.randn(batch_size, num_qo_heads, head_dim, device=device, dtype=dtype)
    num_pages_per_seq = (kv_len + page_size - 1) // page_size
    total_num_pages = num_pages_per_seq * batch_size
    kv_indptr = torch.arange(0, batch_size + 1, device=device, dtype=torch.int32) * num_pages_per_seq
    kv_indices = torch.arange(0, total_num_pages, device=device, dtype=torch.int32)
    kv_last_page_len = torch.full(
        (batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32, device=device
    )

    def padded_pool(num_padding_heads):
        parent = torch.randn(
            total_num_pages, page_size, num_kv_heads + num_padding_heads, head_dim, device=device, dtype=dtype
        )
        return parent[:, :, :num_kv_heads, :]

    # positive control: separately allocated K/V pools with the same padding
    k_equal = padded_pool(1)
    v_equal = padded_pool(1)
    assert not k_equal.is_contiguous()
    assert k_equal.stride() == v_equal.stride()

    workspace_buffer = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, "NHD")
    wrapper.plan(
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        q_data_type=dtype,
        kv_data_type=dtype,
    )
    assert not wrapper.use_tensor_cores
    o = wrapper.run(q, (k_equal, v_equal))
    _check_against_single_decode(
        o, q, k_equal, v_equal, kv_indptr, kv_last_page_len, "NHD", num_kv_heads, head_dim, "NONE"
    )

    # a V pool with other padding: the same shape, other strides
    v_unequal = padded_pool(2)
    v_unequal.copy_(v_equal)
    assert v_unequal.shape == k_equal.shape
    assert v_unequal.stride() != k_equal.stride()
    torch.testing.assert_close(wrapper.run(q, (k_equal, v_unequal)), o, rtol=0, atol=0)


@pytest.mark.cuda_only
def test_single_decode_torch_compile_cuda_graph(device):
    """single_decode_with_kv_cache inside a torch.library op compiled with
    mode='reduce-overhead' (CUDA graphs): no error about pool pointers the graph does not own. In a
    subprocess, as FlashInfer's, since the op has to be registered at module level."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""\
        import torch
        from kiln import single_decode_with_kv_cache

        torch.library.define("kilnfi541d::op", "(Tensor q, Tensor k, Tensor v) -> Tensor")

        @torch.library.impl("kilnfi541d::op", "cuda")
        def _impl(q, k, v):
            return single_decode_with_kv_cache(q, k, v)

        @torch.library.register_fake("kilnfi541d::op")
        def _fake(q, k, v):
            return torch.empty_like(q)

        compiled_fn = torch.compile(lambda q, k, v: torch.ops.kilnfi541d.op(q, k, v),
                                    mode="reduce-overhead", fullgraph=True)

        KV_LEN, QH, KH, D = 256, 8, 8, 128
        for i in range(3):
            q = torch.randn(QH, D, device="cuda", dtype=torch.float16)
            k = torch.randn(KV_LEN, KH, D, device="cuda", dtype=torch.float16)
            v = torch.randn(KV_LEN, KH, D, device="cuda", dtype=torch.float16)
            o = compiled_fn(q, k, v)
            assert o.shape == (QH, D)
        torch.cuda.synchronize()
        print("PASS")
    """)
    env = os.environ.copy()
    env.setdefault("USER", "ci")  # inductor's cache directory asks getpass.getuser()
    # Compile the module in this process first, so the subprocess's timeout covers no JIT build.
    kv_len, qh, kh, d = 256, 8, 8, 128
    flashinfer.single_decode_with_kv_cache(
        torch.randn(qh, d, device=device, dtype=torch.float16),
        torch.randn(kv_len, kh, d, device=device, dtype=torch.float16),
        torch.randn(kv_len, kh, d, device=device, dtype=torch.float16),
    )
    torch.cuda.synchronize()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"Test failed:\nstdout: {result.stdout[-500:]}\nstderr: {result.stderr[-500:]}"
    )


def _uniform_kv_layout(kv_lens, page_size, device):
    pages_per = [(length + page_size - 1) // page_size for length in kv_lens]
    indptr = torch.tensor(
        [0] + list(torch.cumsum(torch.tensor(pages_per), 0)), dtype=torch.int32, device=device
    )
    indices = torch.arange(int(indptr[-1]), dtype=torch.int32, device=device)
    last_len = torch.tensor(
        [(length - 1) % page_size + 1 for length in kv_lens], dtype=torch.int32, device=device
    )
    return indptr, indices, last_len


@pytest.mark.cuda_only
@pytest.mark.parametrize("batch_size", [4, 8])
@pytest.mark.parametrize("q_len_per_req", [2, 3])
@pytest.mark.parametrize("num_kv_heads", [2, 8])
@pytest.mark.parametrize("gqa_group_size", [4, 8])
def test_cuda_graph_uniform_multi_token_decode_with_paged_kv_cache(
    batch_size, q_len_per_req, num_kv_heads, gqa_group_size, device
):
    """Speculative verification: every request carries q_len_per_req queries, causal among
    themselves. Decode must equal the causal prefill wrapper, eagerly and when the plan changes the
    kv lengths between CUDA-graph replays."""
    page_size, head_dim, dtype = 16, 128, torch.bfloat16
    num_qo_heads = num_kv_heads * gqa_group_size
    capture_kv_lens = [129] * batch_size
    # the tightest legal kv under the plan contract kv_len >= q_len_per_req
    replay_kv_lens_sets = [
        [[33, 17, 65, 129][i % 4] for i in range(batch_size)],
        [[q_len_per_req, 128, 64, 100][i % 4] for i in range(batch_size)],
    ]

    indptr, indices, last_len = _uniform_kv_layout(capture_kv_lens, page_size, device)
    total_pages = int(indptr[-1])
    kv_data = torch.randn(total_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    q = torch.randn(batch_size * q_len_per_req, num_qo_heads, head_dim, dtype=dtype, device=device)

    def reference(ref_indptr, ref_indices, ref_last_len):
        ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        qo_indptr = torch.arange(0, batch_size + 1, dtype=torch.int32, device=device) * q_len_per_req
        prefill.plan(
            qo_indptr,
            ref_indptr,
            ref_indices,
            ref_last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            causal=True,
            q_data_type=dtype,
            kv_data_type=dtype,
        )
        return prefill.run(q, kv_data)

    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace_buffer,
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.empty(batch_size + 1, dtype=torch.int32, device=device),
        paged_kv_indices_buffer=torch.empty(total_pages, dtype=torch.int32, device=device),
        paged_kv_last_page_len_buffer=torch.empty(batch_size, dtype=torch.int32, device=device),
    )

    def plan(plan_indptr, plan_indices, plan_last_len):
        wrapper.plan(
            plan_indptr,
            plan_indices,
            plan_last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            q_len_per_req=q_len_per_req,
        )

    plan(indptr, indices, last_len)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            o = wrapper.run(q, kv_data)
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = wrapper.run(q, kv_data, out=o)

    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(o, reference(indptr, indices, last_len), rtol=1e-2, atol=1e-2)

    for kv_lens in replay_kv_lens_sets:
        new_indptr, new_indices, new_last_len = _uniform_kv_layout(kv_lens, page_size, device)
        plan(new_indptr, new_indices, new_last_len)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, reference(new_indptr, new_indices, new_last_len), rtol=1e-2, atol=1e-2)


def test_tensor_core_decode_rejects_mismatched_q_len(device):
    batch_size, page_size = 4, 16
    num_qo_heads, num_kv_heads, head_dim = 8, 2, 128
    dtype = torch.bfloat16
    indptr = torch.arange(0, batch_size + 1, dtype=torch.int32, device=device)
    indices = torch.arange(batch_size, dtype=torch.int32, device=device)
    last_len = torch.full((batch_size,), page_size, dtype=torch.int32, device=device)
    kv_data = torch.randn(batch_size, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    wrapper.plan(
        indptr,
        indices,
        last_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        q_data_type=dtype,
        kv_data_type=dtype,
        q_len_per_req=2,
    )
    q = torch.randn(batch_size * 3, num_qo_heads, head_dim, dtype=dtype, device=device)
    with pytest.raises(ValueError, match="q_len_per_req"):
        wrapper.run(q, kv_data)

    # FlashInfer refuses multi-token decode without tensor cores and on its fa3 backend; kiln's one
    # decode kernel serves both, with the tensor-core wrapper's results.
    q2 = torch.randn(batch_size * 2, num_qo_heads, head_dim, dtype=dtype, device=device)
    expected = wrapper.run(q2, kv_data)
    for kwargs in ({"use_tensor_cores": False}, {"use_tensor_cores": True, "backend": "fa3"}):
        other = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", **kwargs)
        other.plan(
            indptr,
            indices,
            last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            q_len_per_req=2,
        )
        torch.testing.assert_close(other.run(q2, kv_data), expected, rtol=0, atol=0)

    short_kv_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    short_last_len = torch.ones(batch_size, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="empty KV range"):
        short_kv_wrapper.plan(
            indptr,
            indices,
            short_last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            q_len_per_req=2,
        )

    graph_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.empty(batch_size + 1, dtype=torch.int32, device=device),
        paged_kv_indices_buffer=torch.empty(batch_size, dtype=torch.int32, device=device),
        paged_kv_last_page_len_buffer=torch.empty(batch_size, dtype=torch.int32, device=device),
    )

    def plan_graph(q_len):
        graph_wrapper.plan(
            indptr,
            indices,
            last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            q_len_per_req=q_len,
        )

    plan_graph(2)
    plan_graph(2)  # the same value re-plans
    with pytest.raises(ValueError, match="frozen"):
        plan_graph(3)

    unplanned = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    with pytest.raises(ValueError, match="prior plan"):
        flashinfer.decode.fast_decode_plan(
            unplanned,
            indptr,
            indices,
            last_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            q_len_per_req=2,
        )


# Masked logits are -inf, never a finite sentinel: a finite logit far below any sentinel still wins
# over masked positions.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_decode_extreme_negative_logits(dtype, device):
    # decode with two valid keys whose raw scores (-524288) sit far below a -5e4 sentinel
    num_qo_heads, num_kv_heads, head_dim = 32, 4, 128
    page_size, num_pages = 1, 17
    sm_scale = 1.0 / math.sqrt(head_dim)
    q = torch.full((1, num_qo_heads, head_dim), 64.0, dtype=dtype, device=device)
    k_cache = torch.full((num_pages, page_size, num_kv_heads, head_dim), -64.0, dtype=dtype, device=device)
    v_cache = torch.ones_like(k_cache)

    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout="NHD", use_tensor_cores=False
    )
    wrapper.plan(
        indptr=torch.tensor([0, 2], dtype=torch.int32, device=device),
        indices=torch.tensor([15, 16], dtype=torch.int32, device=device),
        last_page_len=torch.tensor([1], dtype=torch.int32, device=device),
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        pos_encoding_mode="NONE",
        sm_scale=sm_scale,
        q_data_type=dtype,
        kv_data_type=dtype,
    )
    o, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)

    k_gqa = k_cache[[15, 16], 0].repeat_interleave(num_qo_heads // num_kv_heads, dim=1)
    logits = torch.einsum("hd,khd->hk", q[0].float(), k_gqa.float()) * sm_scale
    ref_lse = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).unsqueeze(0)
    assert not o.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(o, torch.ones_like(o), rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-3)


@pytest.mark.cuda_only
def test_tensor_core_decode_cuda_graph_padding_without_split_kv(device):
    """A CUDA-graph wrapper planned with disable_split_kv=True (SGLang's deterministic mode) gives
    the eager wrapper's result (FlashInfer's plan_info / int-workspace checks: see the docstring
    above)."""
    batch_size, page_size = 16, 1
    num_qo_heads, num_kv_heads, head_dim = 32, 8, 128
    dtype = torch.float16
    torch.manual_seed(0)
    kv_lens = torch.randint(64, 2049, (batch_size,)).tolist()
    indptr = torch.tensor([0] + kv_lens).cumsum(0).int().to(device)
    indices = torch.arange(sum(kv_lens)).int().to(device)
    last_page_len = torch.ones(batch_size, dtype=torch.int32, device=device)
    q = torch.randn(batch_size, num_qo_heads, head_dim, dtype=dtype, device=device)
    kv_data = torch.randn(sum(kv_lens), 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)

    def workspace():
        return torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)

    def plan(wrapper):
        wrapper.plan(
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
            disable_split_kv=True,
        )

    ref_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    plan(ref_wrapper)
    o_ref = ref_wrapper.run(q, kv_data)
    assert ref_wrapper.plan_info["chunk"] == 0  # (kiln's form of "not split_kv")

    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace(),
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=indptr.clone(),
        paged_kv_indices_buffer=indices.clone(),
        paged_kv_last_page_len_buffer=last_page_len.clone(),
    )
    plan(wrapper)
    assert wrapper.plan_info["chunk"] == 0
    o = wrapper.run(q, kv_data)
    torch.testing.assert_close(o, o_ref, rtol=1e-3, atol=1e-3)
