"""Re-creates FlashInfer 0.7's tests/attention/test_shared_prefix_kernels.py (cascade attention:
MultiLevelCascadeAttentionWrapper against BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
BatchPrefillWithSharedPrefixPagedKVCacheWrapper, and merge_state_in_place with masks) and
tests/attention/test_cascade_mask.py (merge_state_in_place with strided, offset and broadcast
masks, eagerly and replayed from a CUDA graph; the one pair FlashInfer skips, a broadcast mask
with an alternating pattern, is not generated) against kiln.

Sizes: FlashInfer's on CUDA; CPU runs keep CPU_CASES (one batch size, unique length, shared length,
head count and head_dim, both stages and page sizes) and the eager mask cases.

Left out, with why: FlashInfer's tests/attention/test_cascade_support_checks.py asks the merge
functions for is_compute_capability_supported / has_backend_choices, which FlashInfer 0.7.2's
merge_state, merge_state_in_place and merge_states do not have.
"""

from __future__ import annotations

import pytest
import torch

import kiln as flashinfer

CPU_CASES = {
    "batch_size": (12,),
    "unique_kv_len": (17,),
    "shared_kv_len": (128,),
    "num_heads": (8,),
    "head_dim": (128,),
    "use_cuda_graph": (False,),
}


def ceil_div(a, b):
    return (a + b - 1) // b


@pytest.mark.parametrize("stage", ["decode", "append"])
@pytest.mark.parametrize("batch_size", [12, 17])
@pytest.mark.parametrize("unique_kv_len", [37, 17])
@pytest.mark.parametrize("shared_kv_len", [128, 512, 2048])
@pytest.mark.parametrize("num_heads", [8, 16])
@pytest.mark.parametrize("causal", [False])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_attention_with_shared_prefix_paged_kv_cache(
    stage, batch_size, unique_kv_len, shared_kv_len, num_heads, causal, head_dim, page_size, device
):
    assert not (stage == "decode" and causal)  # FlashInfer skips those: the grid has causal=False only
    assert shared_kv_len % page_size == 0
    kv_layout = "NHD"
    if stage == "append":
        q = torch.randn(batch_size * unique_kv_len, num_heads, head_dim).to(device).half()
        q_indptr = torch.arange(0, batch_size + 1).to(device).int() * unique_kv_len
    else:
        q = torch.randn(batch_size, num_heads, head_dim).to(device).half()
        q_indptr = torch.arange(0, batch_size + 1).to(device).int()
    k_shared = torch.randn(shared_kv_len, num_heads, head_dim).to(device).half()
    v_shared = torch.randn(shared_kv_len, num_heads, head_dim).to(device).half()
    k_unique = torch.randn(batch_size * unique_kv_len, num_heads, head_dim).to(device).half()
    v_unique = torch.randn(batch_size * unique_kv_len, num_heads, head_dim).to(device).half()

    kv_data = (
        torch.zeros(
            ceil_div(shared_kv_len, page_size) + batch_size * ceil_div(unique_kv_len, page_size),
            2,
            page_size,
            num_heads,
            head_dim,
        )
        .to(device)
        .half()
    )
    shared_kv_indices = torch.arange(0, ceil_div(shared_kv_len, page_size)).to(device).int()
    shared_append_indptr = torch.arange(0, 2).to(device).int() * shared_kv_len
    shared_kv_indptr = torch.arange(0, 2).to(device).int() * ceil_div(shared_kv_len, page_size)
    shared_last_page_len = torch.full((1,), (shared_kv_len - 1) % page_size + 1, dtype=torch.int32).to(device)
    flashinfer.append_paged_kv_cache(
        k_shared,
        v_shared,
        *flashinfer.get_batch_indices_positions(
            shared_append_indptr,
            flashinfer.get_seq_lens(shared_kv_indptr, shared_last_page_len, page_size),
            k_shared.shape[0],
        ),
        kv_data,
        shared_kv_indices,
        shared_kv_indptr,
        shared_last_page_len,
        kv_layout,
    )
    unique_kv_indices = torch.arange(0, batch_size * ceil_div(unique_kv_len, page_size)).to(
        device
    ).int() + ceil_div(shared_kv_len, page_size)
    unique_append_indptr = torch.arange(0, batch_size + 1).to(device).int() * unique_kv_len
    unique_kv_indptr = torch.arange(0, batch_size + 1).to(device).int() * ceil_div(unique_kv_len, page_size)
    unique_last_page_len = torch.full(
        (batch_size,), (unique_kv_len - 1) % page_size + 1, dtype=torch.int32
    ).to(device)
    flashinfer.append_paged_kv_cache(
        k_unique,
        v_unique,
        *flashinfer.get_batch_indices_positions(
            unique_append_indptr,
            flashinfer.get_seq_lens(unique_kv_indptr, unique_last_page_len, page_size),
            k_unique.shape[0],
        ),
        kv_data,
        unique_kv_indices,
        unique_kv_indptr,
        unique_last_page_len,
        kv_layout,
    )

    multi_level_wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(32 * 1024 * 1024, dtype=torch.int8).to(device), kv_layout
    )
    if stage == "decode":
        shared_prefix_decode_wrapper = flashinfer.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(
            torch.empty(32 * 1024 * 1024, dtype=torch.int8).to(device), kv_layout
        )
    else:
        shared_prefix_prefill_wrapper = flashinfer.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(
            torch.empty(32 * 1024 * 1024, dtype=torch.int8).to(device), kv_layout
        )

    qo_indptr_top = torch.tensor([0, q.shape[0]], dtype=torch.int32).to(device)
    if stage == "decode":
        qo_indptr_bottom = torch.arange(0, batch_size + 1, dtype=torch.int32).to(device)
        multi_level_wrapper.plan(
            [qo_indptr_top, qo_indptr_bottom],
            [shared_kv_indptr, unique_kv_indptr],
            [shared_kv_indices, unique_kv_indices],
            [shared_last_page_len, unique_last_page_len],
            num_heads,
            num_heads,
            head_dim,
            page_size,
        )
        o_multi_level = multi_level_wrapper.run(q, kv_data)
    else:
        qo_indptr_bottom = torch.arange(0, batch_size + 1, dtype=torch.int32).to(device) * unique_kv_len
        multi_level_wrapper.plan(
            [qo_indptr_top, qo_indptr_bottom],
            [shared_kv_indptr, unique_kv_indptr],
            [shared_kv_indices, unique_kv_indices],
            [shared_last_page_len, unique_last_page_len],
            num_heads,
            num_heads,
            head_dim,
            page_size,
            causal=causal,
        )
        o_multi_level = multi_level_wrapper.run(q, kv_data)

    if stage == "decode":
        shared_prefix_decode_wrapper.begin_forward(
            unique_kv_indptr,
            unique_kv_indices,
            unique_last_page_len,
            num_heads,
            num_heads,
            head_dim,
            page_size,
        )
        o_two_level = shared_prefix_decode_wrapper.forward(q, k_shared, v_shared, kv_data)
    else:
        shared_prefix_prefill_wrapper.begin_forward(
            q_indptr,
            unique_kv_indptr,
            unique_kv_indices,
            unique_last_page_len,
            num_heads,
            num_heads,
            head_dim,
            page_size,
        )
        o_two_level = shared_prefix_prefill_wrapper.forward(q, k_shared, v_shared, kv_data, causal=causal)

    torch.testing.assert_close(o_multi_level, o_two_level, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("num_tries", [50])
def test_merge_state_in_place_with_mask(seed, num_tries, device):
    seq_len = 512
    num_heads = 32
    head_dim = 128
    va = torch.randn(seq_len, num_heads, head_dim).half().to(device)
    sa = torch.randn(seq_len, num_heads, dtype=torch.float32).to(device)
    vb = torch.randn(seq_len, num_heads, head_dim).half().to(device)
    sb = torch.randn(seq_len, num_heads, dtype=torch.float32).to(device)
    va_orginal = va.clone()
    sa_original = sa.clone()

    # no mask
    flashinfer.merge_state_in_place(va, sa, vb, sb)
    va_merged_ref = va.clone()
    sa_merged_ref = sa.clone()
    assert not torch.allclose(va_merged_ref, va_orginal)
    assert not torch.allclose(sa_merged_ref, sa_original)

    # a mask of all ones: the same as no mask
    mask = torch.ones(seq_len, dtype=torch.bool).to(device)
    va = va_orginal.clone()
    sa = sa_original.clone()
    flashinfer.merge_state_in_place(va, sa, vb, sb, mask=mask)
    torch.testing.assert_close(va, va_merged_ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(sa, sa_merged_ref, rtol=1e-3, atol=1e-3)

    # a mask of all zeros: every row as it was
    mask = torch.zeros(seq_len, dtype=torch.bool).to(device)
    va = va_orginal.clone()
    sa = sa_original.clone()
    flashinfer.merge_state_in_place(va, sa, vb, sb, mask=mask)
    torch.testing.assert_close(va, va_orginal, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(sa, sa_original, rtol=1e-3, atol=1e-3)

    # random masks
    randgen = torch.Generator(device=device)
    randgen.manual_seed(seed)
    for _ in range(num_tries):
        rand_mask = (torch.rand(seq_len, generator=randgen, dtype=torch.float32, device=device) > 0.5).to(
            dtype=torch.bool
        )
        true_indices = rand_mask.nonzero()
        false_indices = (rand_mask == 0).nonzero()
        va = va_orginal.clone()
        sa = sa_original.clone()
        flashinfer.merge_state_in_place(va, sa, vb, sb, mask=rand_mask)

        torch.testing.assert_close(va[false_indices], va_orginal[false_indices], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(sa[false_indices], sa_original[false_indices], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(va[true_indices], va_merged_ref[true_indices], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(sa[true_indices], sa_merged_ref[true_indices], rtol=1e-3, atol=1e-3)


# --- tests/attention/test_cascade_mask.py ---------------------------------------------------------


# FlashInfer skips (mask_stride 0, "alternating"): a broadcast mask has one value for every row.
# Here that pair is not generated.
MASK_CASES = [
    (stride, pattern)
    for stride in (0, 1, 2, 3)
    for pattern in ("all_true", "all_false", "alternating")
    if not (stride == 0 and pattern == "alternating")
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("use_cuda_graph", [False, True])  # True: CUDA only (CPU_CASES)
@pytest.mark.parametrize(("mask_stride", "pattern"), MASK_CASES)
def test_merge_state_in_place_mask_stride(dtype, use_cuda_graph, mask_stride, pattern, device):

    seq_len = 17
    # padding the opposite of the selected entries, and a nonzero storage offset
    storage = torch.full(
        (1 + seq_len * max(mask_stride, 1),), pattern == "all_false", dtype=torch.bool, device=device
    )
    if mask_stride == 0:
        storage[1] = pattern == "all_true"
        mask = storage[1:2].expand(seq_len)
    else:
        mask = storage[1::mask_stride]
        if pattern == "alternating":
            mask.copy_(torch.arange(seq_len, device=device) % 2 == 0)
        else:
            mask.fill_(pattern == "all_true")
    assert mask.stride(0) == mask_stride
    assert mask.storage_offset() == 1

    v = torch.zeros((seq_len, 2, 64), dtype=dtype, device=device)
    s = torch.zeros((seq_len, 2), dtype=torch.float32, device=device)
    v_other = torch.ones_like(v)
    s_other = torch.zeros_like(s)

    # the JIT before capture
    flashinfer.merge_state_in_place(v, s, v_other, s_other, mask)
    v.zero_()
    s.zero_()
    if use_cuda_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            flashinfer.merge_state_in_place(v, s, v_other, s_other, mask)

    for _ in range(2):
        v.zero_()
        s.zero_()
        if use_cuda_graph:
            graph.replay()
        else:
            flashinfer.merge_state_in_place(v, s, v_other, s_other, mask)
        # equal log-sum-exps average the states and add one in base 2; unselected rows stay as
        # they were, exactly
        expected_v = (mask.to(dtype) * 0.5)[:, None, None].expand_as(v)
        expected_s = mask.to(s.dtype)[:, None].expand_as(s)
        torch.testing.assert_close(v, expected_v, rtol=0, atol=0)
        torch.testing.assert_close(s, expected_s, rtol=0, atol=0)
        # replays read the mask's current values through the original view
        storage.logical_not_()
