"""Split-KV scheduling for decode: which (request, token range) items run, and which requests
need their partial results merged. Pure host-side integer work on CPU tensors, done once per
batch by `plan` and reused by every layer's `run`.

The GPU runs one CTA per (item, kv head, head chunk). When the batch alone gives fewer CTAs than
one full wave (`slots` = SMs x resident CTAs per SM), long requests are cut into chunks of equal
size so the whole batch fills about one wave; each chunk writes a float32 partial state and the
last CTA of a request's chunks to finish merges them (flash-decoding, inside the one launch).
Chunks are at least `MIN_CHUNK` tokens so merging never dominates, and a multiple of
`CHUNK_ALIGN` tokens. Items are ordered longest first, so the tail of a skewed batch is short.
The same inputs always give the same schedule (deterministic results for the same plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_CHUNK = 256
CHUNK_ALIGN = 64


@dataclass(frozen=True)
class Schedule:
    request: torch.Tensor  # [items] int32
    token_begin: torch.Tensor  # [items] int32
    token_end: torch.Tensor  # [items] int32
    out_index: torch.Tensor  # [items] int32: -1 = write the output directly, else a partial slot
    merge_index: torch.Tensor  # [items] int32: -1 = not split, else the request's merge entry
    merge_request: torch.Tensor  # [merges] int32
    merge_indptr: torch.Tensor  # [merges + 1] int32: partial slot ranges
    num_slots: int
    chunk: int  # tokens per chunk (0: no request was split)


def chunk_size(spans: torch.Tensor, kv_units: int, slots: int) -> int:
    """The smallest aligned chunk (>= MIN_CHUNK) with sum(ceil(span / chunk)) * kv_units <= slots,
    or 0 when the batch fills a wave unsplit or nothing is long enough to split."""
    batch = spans.numel()
    longest = int(spans.max()) if batch else 0
    if batch * kv_units >= slots or longest <= MIN_CHUNK:
        return 0
    lo, hi = MIN_CHUNK, max(MIN_CHUNK, longest)
    while lo < hi:  # items(chunk) is non-increasing in chunk: binary search the smallest that fits
        mid = (lo + hi) // 2
        items = int(torch.clamp((spans + mid - 1) // mid, min=1).sum())
        if items * kv_units <= slots:
            hi = mid
        else:
            lo = mid + 1
    aligned = -(-lo // CHUNK_ALIGN) * CHUNK_ALIGN
    return aligned if aligned < longest else 0


def schedule(begin: torch.Tensor, end: torch.Tensor, kv_units: int, slots: int,
             chunk: int | None = None) -> Schedule:
    """Work items for requests whose keys are tokens [begin[b], end[b]) (int64 CPU tensors).
    `chunk`: None chooses by chunk_size; 0 splits nothing; > 0 cuts every longer request into
    chunks of that many tokens (FlashInfer's fixed_split_size: the same split whatever the batch)."""
    spans = (end - begin).clamp(min=0)
    if chunk is None:
        chunk = chunk_size(spans, kv_units, slots)
    elif chunk > 0 and not bool((spans > chunk).any()):
        chunk = 0  # nothing is longer than a chunk: nothing is split
    if chunk:
        pieces = torch.clamp((spans + chunk - 1) // chunk, min=1)
    else:
        pieces = torch.ones_like(spans)
    request = torch.repeat_interleave(torch.arange(spans.numel()), pieces)
    first_piece = torch.cumsum(pieces, 0) - pieces
    piece = torch.arange(request.numel()) - torch.repeat_interleave(first_piece, pieces)
    if chunk:
        token_begin = begin[request] + piece * chunk
        token_end = torch.minimum(token_begin + chunk, end[request])
    else:
        token_begin, token_end = begin[request], end[request]
    token_end = torch.maximum(token_end, token_begin)  # empty requests: an empty range
    split = pieces[request] > 1
    out_index = torch.full_like(request, -1)
    out_index[split] = torch.arange(int(split.sum()))
    merged = torch.nonzero(pieces > 1).flatten()
    merge_of = torch.full_like(pieces, -1)
    merge_of[merged] = torch.arange(merged.numel())
    merge_indptr = torch.zeros(merged.numel() + 1, dtype=torch.int64)
    merge_indptr[1:] = torch.cumsum(pieces[merged], 0)
    # Longest items first; stable, so equal lengths keep their (request, piece) order.
    order = torch.sort(token_end - token_begin, descending=True, stable=True).indices
    i32 = torch.int32
    return Schedule(
        request=request[order].to(i32), token_begin=token_begin[order].to(i32),
        token_end=token_end[order].to(i32), out_index=out_index[order].to(i32),
        merge_index=merge_of[request][order].to(i32),
        merge_request=merged.to(i32), merge_indptr=merge_indptr.to(i32),
        num_slots=int(split.sum()), chunk=chunk,
    )
