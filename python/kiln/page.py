"""Writing new tokens into a paged KV cache (//ops/attention:page and :positions), FlashInfer's
names:

    get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices=None, positions=None)
        -> (batch_indices, positions)
    get_seq_lens(kv_indptr, kv_last_page_len, page_size) -> seq_lens
    append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD",
                          k_scale=None, v_scale=None)

append_key/append_value [nnz, num_kv_heads, head_dim] are the new tokens of all requests, packed
(request b's are rows append_indptr[b]:append_indptr[b+1]); token i goes to request
batch_indices[i] at position positions[i], i.e. page kv_indices[kv_indptr[b] + pos // page_size],
slot pos % page_size. seq_lens are the requests' lengths after the append, so a request appending
n tokens writes positions seq_len - n ... seq_len - 1. nnz may exceed append_indptr[-1] (buffers
sized past the real tokens): the extra entries are padding, batch index -1 (position 0, or left as
given in a preallocated `positions`), and append_paged_kv_cache refuses them (a batch index -1 is
no request). The page table must already cover them:
position p of request b must be below its length (pages - 1) * page_size + kv_last_page_len[b].
The cache has the keys' dtype, or is torch.float8_e4m3fn: then it receives e4m3(key / k_scale) and
e4m3(value / v_scale) (per-tensor float scales, None is 1; rounded to nearest even and saturated at
+-448, i.e. torch's (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)), the cache decode reads
with the same scales.

Every index is checked where it is used (kiln/errors.py): on the CPU a bad one raises IndexError
before anything is written; on CUDA the kernels skip the token (append writes nothing for it,
get_batch_indices_positions returns -1 for it) and record the error for kiln.check_errors().
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
def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int,
                                batch_indices: torch.Tensor | None = None,
                                positions: torch.Tensor | None = None):
    """(batch_indices, positions), int32 [nnz], for packed appended tokens: one kernel, no host
    synchronisation. append_indptr [batch + 1] (from 0, non-decreasing, ending at most at nnz) and
    seq_lens [batch] (the lengths after the append) are int32 on one device. batch_indices /
    positions: FlashInfer's preallocated outputs (int32 [nnz] on that device), written and
    returned; tokens past append_indptr[-1] get batch index -1 and keep their position entry (0
    when this function allocates it)."""
    api = "kiln.get_batch_indices_positions"
    _attention.index_tensor(append_indptr, "append_indptr", api)
    _attention.index_tensor(seq_lens, "seq_lens", api)
    if isinstance(nnz, bool) or not isinstance(nnz, int) or nnz < 0:
        raise ValueError(f"{api}: nnz must be an int >= 0 (the number of appended tokens), got {nnz!r}")
    if seq_lens.numel() != append_indptr.numel() - 1:
        raise ValueError(f"{api}: seq_lens has {seq_lens.numel()} entries; append_indptr's "
                         f"{append_indptr.numel()} entries describe a batch of {append_indptr.numel() - 1}")
    device = append_indptr.device
    if seq_lens.device != device:
        raise ValueError(f"{api}: seq_lens is on {seq_lens.device}, append_indptr on {device}")
    outs = []
    for name, given in (("batch_indices", batch_indices), ("positions", positions)):
        if given is None:
            given = torch.zeros(nnz, dtype=torch.int32, device=device)
        elif not isinstance(given, torch.Tensor) or given.dtype != torch.int32 or given.shape != (nnz,) or \
                given.device != device:
            what = (f"{given.dtype} {list(given.shape)} on {given.device}" if isinstance(given, torch.Tensor)
                    else type(given).__name__)
            raise ValueError(f"{api}: {name} must be an int32 tensor of shape [{nnz}] on {device}, got "
                             f"{what}")
        outs.append(given)
    batch_indices, positions = outs
    _positions_op(append_indptr.to(torch.int32), seq_lens.to(torch.int32), batch_indices, positions)
    return batch_indices, positions


@logged_api
def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Each request's length from its page table (FlashInfer's function): (pages - 1) * page_size +
    kv_last_page_len, with pages = kv_indptr[b + 1] - kv_indptr[b] (a request with no pages gives
    kv_last_page_len). On the tensors' device, in their dtype; no kernel of kiln's."""
    api = "kiln.get_seq_lens"
    _attention.index_tensor(kv_indptr, "kv_indptr", api)
    _attention.index_tensor(kv_last_page_len, "kv_last_page_len", api)
    if kv_last_page_len.numel() != kv_indptr.numel() - 1:
        raise ValueError(f"{api}: kv_last_page_len has {kv_last_page_len.numel()} entries; kv_indptr's "
                         f"{kv_indptr.numel()} entries describe a batch of {kv_indptr.numel() - 1}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"{api}: page_size must be a positive int, got {page_size!r}")
    return torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + kv_last_page_len


@custom_op("get_batch_indices_positions", mutates=("batch_indices", "positions"))
def _positions_op(append_indptr: torch.Tensor, seq_lens: torch.Tensor, batch_indices: torch.Tensor,
                  positions: torch.Tensor) -> None:
    device = append_indptr.device
    mod = _jit.module(_attention.POSITIONS, device, "kiln.get_batch_indices_positions")
    dl = _jit.dl
    mod.batch_indices_positions(append_indptr=dl(append_indptr), seq_lens=dl(seq_lens),
                                batch_indices=dl(batch_indices), positions=dl(positions),
                                errors=_attention.error_record(device), stream=_jit.stream_of(device))
    _attention.errors.after_launch(device)


@logged_api(mutates=("paged_kv_cache",))
@traced(attention_traces.APPEND_PAGED_KV_CACHE)
def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                          positions: torch.Tensor, paged_kv_cache, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                          kv_layout: str = "NHD", k_scale: float | None = None,
                          v_scale: float | None = None) -> None:
    """Write each appended token's key and value into its page slot (in place); into an fp8 cache
    as e4m3(key / k_scale), e4m3(value / v_scale)."""
    api = "kiln.append_paged_kv_cache"
    _attention.check_layout(kv_layout, api)
    cache_k, _ = _attention.split_cache(paged_kv_cache, api)  # checks its form
    if isinstance(cache_k, torch.Tensor) and isinstance(append_key, torch.Tensor):
        _attention.kv_cache_dtype(append_key.dtype, cache_k.dtype, api)
        if cache_k.dtype != _attention.FP8_KV and (k_scale is not None or v_scale is not None):
            raise ValueError(f"{api}: k_scale / v_scale apply to fp8 caches only; this cache is "
                             f"{cache_k.dtype}")
    k_scale = _attention.kv_scale(k_scale, "k_scale", api)
    v_scale = _attention.kv_scale(v_scale, "v_scale", api)
    # One [pages, 2, ...] tensor is passed whole (the op writes through both halves of it).
    k_cache, v_cache = (paged_kv_cache[0], paged_kv_cache[1]) if isinstance(
        paged_kv_cache, (tuple, list)) else (paged_kv_cache, None)
    for name, t in (("batch_indices", batch_indices), ("positions", positions), ("kv_indices", kv_indices),
                    ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        _attention.index_tensor(t, name, api)
    _append_op(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
               kv_last_page_len, kv_layout, k_scale, v_scale)


@custom_op("append_paged_kv_cache", mutates=("k_cache", "v_cache"))
def _append_op(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
               positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
               kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
               kv_layout: str, k_scale: float, v_scale: float) -> None:
    """v_cache None: k_cache is the [pages, 2, ...] tensor holding both."""
    if v_cache is None:
        k_cache, v_cache = k_cache[:, 0], k_cache[:, 1]
    mod = _jit.module(_attention.PAGE, append_key.device, "kiln.append_paged_kv_cache",
                      dtype=append_key.dtype, kv_dtype=k_cache.dtype, head_dim=append_key.shape[-1],
                      names={"dtype": "append_key.dtype", "kv_dtype": "paged_kv_cache.dtype"})
    dl = _jit.dl
    mod.append_paged_kv(append_key=dl(append_key), append_value=dl(append_value),
                        batch_indices=dl(batch_indices), positions=dl(positions), k_cache=dl(k_cache),
                        v_cache=dl(v_cache), kv_layout=kv_layout, kv_indptr=dl(kv_indptr),
                        kv_indices=dl(kv_indices), kv_last_page_len=dl(kv_last_page_len), k_scale=k_scale,
                        v_scale=v_scale, errors=_attention.error_record(append_key.device),
                        stream=_jit.stream_of(append_key.device))
    _attention.errors.after_launch(append_key.device)
