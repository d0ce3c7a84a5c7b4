"""Re-creates FlashInfer 0.7's tests/attention/test_page.py against kiln: get_batch_indices_positions
(its positions: token i of request b at seq_lens[b] - count_b + (i - append_indptr[b])), get_seq_lens
and append_paged_kv_cache, as FlashInfer's tests call them.

Adapted, with why:
- FlashInfer's newer tests call its page module's raw binding
  (``get_page_module().get_batch_indices_positions(append_indptr, seq_lens, batch_indices,
  positions)``), which FlashInfer 0.7.2 does not have; 0.7.2's public five-argument form
  ``get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices, positions)`` takes
  the same preallocated outputs, and is what these cases call.
- The raw binding's "rejects int64 inputs" case becomes the public form's check of its
  preallocated outputs (0.7.2's check_shape_dtype_device: int32 [nnz] on the inputs' device):
  0.7.2's public function, like kiln's, accepts int64 seq_lens.
"""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln as flashinfer


def _make_indptr(lengths, device):
    lengths = torch.as_tensor(lengths, dtype=torch.int32, device=device)
    indptr = torch.empty(lengths.numel() + 1, dtype=torch.int32, device=device)
    indptr[0] = 0
    indptr[1:] = torch.cumsum(lengths, dim=0)
    return lengths, indptr


def _batch_indices_positions_ref(append_indptr, seq_lens):
    """Written from the definition: request b's tokens are rows append_indptr[b] .. [b + 1], the
    last of them at position seq_lens[b] - 1."""
    indptr, lens = append_indptr.cpu().tolist(), seq_lens.cpu().tolist()
    batch_indices, positions = [], []
    for b, seq_len in enumerate(lens):
        count = indptr[b + 1] - indptr[b]
        batch_indices += [b] * count
        positions += list(range(seq_len - count, seq_len))
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=append_indptr.device)  # noqa: E731
    return as_tensor(batch_indices), as_tensor(positions)


def _get_batch_indices_positions_preallocated(append_indptr, seq_lens):
    nnz = int(append_indptr[-1].item())
    batch_indices = torch.full((nnz,), -1, dtype=torch.int32, device=append_indptr.device)
    positions = torch.full((nnz,), -2, dtype=torch.int32, device=append_indptr.device)
    flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices, positions)
    return batch_indices, positions


@pytest.mark.parametrize(
    ("append_lengths", "seq_lens"),
    [
        ([1, 2, 3, 4], [5, 5, 5, 5]),
        ([45, 8, 25, 22], [45, 8, 25, 22]),
        ([0, 3, 0, 5, 1], [7, 10, 2, 8, 6]),
        ([7], [11]),
        ([0, 0, 0], [3, 4, 5]),
        ([], []),
    ],
)
def test_get_batch_indices_positions_page_module(append_lengths, seq_lens, device):
    _, append_indptr = _make_indptr(append_lengths, device)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)

    batch_indices, positions = _get_batch_indices_positions_preallocated(append_indptr, seq_lens)
    ref_batch_indices, ref_positions = _batch_indices_positions_ref(append_indptr, seq_lens)

    torch.testing.assert_close(batch_indices, ref_batch_indices)
    torch.testing.assert_close(positions, ref_positions)


def test_get_batch_indices_positions_page_module_many_rows(device):
    append_lengths = torch.arange(1024, dtype=torch.int32, device=device) % 9
    seq_lens = append_lengths + (torch.arange(1024, dtype=torch.int32, device=device) % 17)
    _, append_indptr = _make_indptr(append_lengths, device)

    batch_indices, positions = _get_batch_indices_positions_preallocated(append_indptr, seq_lens)
    ref_batch_indices, ref_positions = _batch_indices_positions_ref(append_indptr, seq_lens)

    torch.testing.assert_close(batch_indices, ref_batch_indices)
    torch.testing.assert_close(positions, ref_positions)


def test_get_batch_indices_positions_page_module_rejects_int64_inputs(device):
    append_lengths, append_indptr = _make_indptr([1, 2, 3], device)
    seq_lens = append_lengths.to(torch.int64)
    nnz = int(append_indptr[-1].item())
    batch_indices = torch.empty((nnz,), dtype=torch.int64, device=device)
    positions = torch.empty((nnz,), dtype=torch.int32, device=device)

    with pytest.raises(Exception):  # noqa: B017 (FlashInfer's assertion: any error)
        flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices, positions)


def test_append_paged_kv_cache_with_page_module_batch_indices_positions(device):
    torch.manual_seed(0)
    append_lengths, append_indptr = _make_indptr([5, 2, 7], device)
    seq_lens = append_lengths.clone()
    page_size = 4
    num_kv_heads = 2
    head_dim = 64
    nnz = int(append_indptr[-1].item())

    num_pages_per_req = (seq_lens + page_size - 1) // page_size
    kv_indptr = torch.empty(seq_lens.numel() + 1, dtype=torch.int32, device=device)
    kv_indptr[0] = 0
    kv_indptr[1:] = torch.cumsum(num_pages_per_req, dim=0)
    num_pages = int(kv_indptr[-1].item())
    kv_indices = torch.arange(num_pages, dtype=torch.int32, device=device)
    kv_last_page_len = ((seq_lens - 1) % page_size + 1).to(torch.int32)

    append_key = torch.randn(nnz, num_kv_heads, head_dim, dtype=torch.float16, device=device)
    append_value = torch.randn_like(append_key)
    paged_kv_cache = torch.zeros(
        num_pages, 2, page_size, num_kv_heads, head_dim, dtype=torch.float16, device=device
    )
    batch_indices, positions = _get_batch_indices_positions_preallocated(append_indptr, seq_lens)

    flashinfer.append_paged_kv_cache(
        append_key,
        append_value,
        batch_indices,
        positions,
        paged_kv_cache,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
    )

    batch_indices_cpu = batch_indices.cpu()
    positions_cpu = positions.cpu()
    kv_indptr_cpu = kv_indptr.cpu()
    kv_indices_cpu = kv_indices.cpu()
    for i in range(nnz):
        batch_idx = int(batch_indices_cpu[i].item())
        pos = int(positions_cpu[i].item())
        page_iter = int(kv_indptr_cpu[batch_idx].item()) + pos // page_size
        page = int(kv_indices_cpu[page_iter].item())
        entry = pos % page_size
        torch.testing.assert_close(paged_kv_cache[page, 0, entry], append_key[i])
        torch.testing.assert_close(paged_kv_cache[page, 1, entry], append_value[i])


@pytest.mark.parametrize("contiguous", [True, False])
def test_append_paged_kv_cache(contiguous, device):
    nnz_kv = 100
    num_kv_heads = 32
    head_dim = 128

    if contiguous:
        k_append = torch.randn(nnz_kv, num_kv_heads, head_dim).half().to(device)
        v_append = torch.randn(nnz_kv, num_kv_heads, head_dim).half().to(device)
    else:
        kv_append = torch.randn(nnz_kv, 2, num_kv_heads, head_dim).half().to(device)
        k_append = kv_append[:, 0]
        v_append = kv_append[:, 1]
    # 45 + 8 + 25 + 22 = nnz_kv
    kv_append_length = torch.tensor([45, 8, 25, 22], dtype=torch.int32, device=device)
    kv_append_indptr = torch.cat(
        [torch.zeros(1).int().to(device), torch.cumsum(kv_append_length, dim=0)]
    ).int()

    max_num_pages = 1000
    page_size = 16
    paged_kv_cache = torch.randn(max_num_pages, 2, page_size, num_kv_heads, head_dim).half().to(device)
    num_pages_per_req = torch.tensor([3, 1, 2, 2], dtype=torch.int32, device=device)
    kv_page_indptr = torch.cat(
        [torch.zeros(1).int().to(device), torch.cumsum(num_pages_per_req, dim=0)]
    ).int()
    # the first 8 pages of the pool; 45 = (3 - 1) * 16 + 13, 8 = 8, 25 = 16 + 9, 22 = 16 + 6
    kv_page_indices = torch.arange(8, dtype=torch.int32, device=device)
    kv_last_page_len = torch.tensor([13, 8, 9, 6], dtype=torch.int32, device=device)
    batch_indices, positions = flashinfer.get_batch_indices_positions(
        kv_append_indptr,
        flashinfer.get_seq_lens(kv_page_indptr, kv_last_page_len, page_size),
        nnz_kv,
    )

    flashinfer.append_paged_kv_cache(
        k_append,
        v_append,
        batch_indices,
        positions,
        paged_kv_cache,
        kv_page_indices,
        kv_page_indptr,
        kv_last_page_len,
    )
    kiln.check_errors()  # (kiln's addition) no index error was recorded on the device
