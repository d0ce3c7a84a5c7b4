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
    layout = _attention.layout_code(kv_layout, api)
    k_cache, v_cache = _attention.split_cache(paged_kv_cache, api)
    mod = _attention.module(append_key.dtype, append_key.shape[-1], False, append_key.device, api)
    mod.append_paged_kv(_jit.dl(append_key), _jit.dl(append_value), _jit.dl(batch_indices),
                        _jit.dl(positions),
                        _jit.dl(k_cache), _jit.dl(v_cache), layout, _jit.dl(kv_indptr), _jit.dl(kv_indices),
                        _jit.stream_of(append_key.device))
