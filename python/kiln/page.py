"""Writing new tokens into a paged KV cache (//ops:attention), FlashInfer's names:

    get_batch_indices_positions(append_indptr, seq_lens, nnz) -> (batch_indices, positions)
    append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD")

append_key/append_value [nnz, num_kv_heads, head_dim] are the new tokens of all requests, packed
(request b's are rows append_indptr[b]:append_indptr[b+1]); token i goes to request
batch_indices[i] at position positions[i], i.e. page kv_indices[kv_indptr[b] + pos // page_size],
slot pos % page_size. seq_lens are the requests' lengths after the append, so a request appending
n tokens writes positions seq_len - n ... seq_len - 1. The page table must already cover them.
"""

from __future__ import annotations

import torch

from . import _attention, _jit
from ._ops import custom_op
from .api_logging import logged_api
from .trace import attention as attention_traces
from .trace import traced


@logged_api
@traced(attention_traces.GET_BATCH_INDICES_POSITIONS)
def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int):
    """(batch_indices, positions), int32 [nnz], for packed appended tokens (no host sync)."""
    counts = append_indptr[1:] - append_indptr[:-1]
    batch = torch.arange(counts.numel(), device=append_indptr.device)
    batch_indices = torch.repeat_interleave(batch, counts, output_size=nnz)
    offset = torch.arange(nnz, device=append_indptr.device) - append_indptr[:-1].long()[batch_indices]
    positions = (seq_lens.long() - counts.long())[batch_indices] + offset
    return batch_indices.to(torch.int32), positions.to(torch.int32)


@logged_api(mutates=("paged_kv_cache",))
@traced(attention_traces.APPEND_PAGED_KV_CACHE)
def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                          positions: torch.Tensor, paged_kv_cache, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                          kv_layout: str = "NHD") -> None:
    """Write each appended token's key and value into its page slot (in place)."""
    api = "kiln.append_paged_kv_cache"
    _attention.check_layout(kv_layout, api)
    _attention.split_cache(paged_kv_cache, api)  # checks its form
    # One [pages, 2, ...] tensor is passed whole (the op writes through both halves of it).
    k_cache, v_cache = (paged_kv_cache[0], paged_kv_cache[1]) if isinstance(
        paged_kv_cache, (tuple, list)) else (paged_kv_cache, None)
    _append_op(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
               kv_layout)


@custom_op("append_paged_kv_cache", mutates=("k_cache", "v_cache"))
def _append_op(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
               positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
               kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_layout: str) -> None:
    """v_cache None: k_cache is the [pages, 2, ...] tensor holding both."""
    if v_cache is None:
        k_cache, v_cache = k_cache[:, 0], k_cache[:, 1]
    mod = _jit.module(_attention.PAGE, append_key.device, "kiln.append_paged_kv_cache",
                      dtype=append_key.dtype, head_dim=append_key.shape[-1])
    dl = _jit.dl
    mod.append_paged_kv(append_key=dl(append_key), append_value=dl(append_value),
                        batch_indices=dl(batch_indices), positions=dl(positions), k_cache=dl(k_cache),
                        v_cache=dl(v_cache), kv_layout=kv_layout, kv_indptr=dl(kv_indptr),
                        kv_indices=dl(kv_indices), stream=_jit.stream_of(append_key.device))
