"""Building paged KV caches for tests, and an independent float32 reference for decode attention
(plain softmax(q k^T) v over the gathered pages; written without looking at the kernels)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    k_cache: torch.Tensor  # [pool, page_size, kv_heads, D] (NHD) or [pool, kv_heads, page_size, D]
    v_cache: torch.Tensor
    indptr: torch.Tensor  # int32
    indices: torch.Tensor  # int32, shuffled page ids inside a larger pool
    last_page_len: torch.Tensor  # int32
    kv_lens: list[int]
    page_size: int
    layout: str

    def keys(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request b's keys and values as [kv_len, kv_heads, D] (gathered independently)."""
        pages = self.indices[self.indptr[b]:self.indptr[b + 1]].long()
        k, v = self.k_cache[pages], self.v_cache[pages]
        if self.layout == "HND":  # [n, kv_heads, page_size, D] -> [n, page_size, kv_heads, D]
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        d, h = k.shape[-1], k.shape[-2]
        return k.reshape(-1, h, d)[: self.kv_lens[b]], v.reshape(-1, h, d)[: self.kv_lens[b]]


def make_paged(kv_lens, page_size, kv_heads, head_dim, dtype, device, layout="NHD", spare_pages=7,
               gen=None) -> PagedBatch:
    """A page pool larger than needed (spare pages hold garbage), pages handed out in random order,
    and the caches as strided slices of one [pool, 2, ...] allocation (non-contiguous)."""
    pages_per = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(pages_per)
    pool = total + spare_pages
    inner = (page_size, kv_heads, head_dim) if layout == "NHD" else (kv_heads, page_size, head_dim)
    both = torch.randn((pool, 2, *inner), generator=gen).to(device=device, dtype=dtype)
    indices = torch.randperm(pool, generator=gen)[:total].to(torch.int32)
    indptr = torch.tensor([0] + list(torch.tensor(pages_per, dtype=torch.int64).cumsum(0)), dtype=torch.int32)
    last = [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages_per, strict=True)]
    return PagedBatch(both[:, 0], both[:, 1], indptr.to(device), indices.to(device),
                      torch.tensor(last, dtype=torch.int32, device=device), list(kv_lens), page_size, layout)


def reference_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale=None, soft_cap=None,
                     window_left=-1):
    """q [Hq, D], k/v [L, Hk, D] -> (out [Hq, D] float32, lse [Hq] float32 in base 2)."""
    hq, d = q.shape
    length, hk = k.shape[0], k.shape[1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    kf = k.float().repeat_interleave(hq // hk, dim=1)
    vf = v.float().repeat_interleave(hq // hk, dim=1)
    logits = torch.einsum("hd,thd->ht", q.float(), kf) * sm_scale
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    if window_left >= 0:
        pos = torch.arange(length, device=q.device)
        logits = logits.masked_fill(pos[None, :] < length - 1 - window_left, -math.inf)
    if length == 0:
        return torch.zeros(hq, d, device=q.device), torch.full((hq,), -math.inf, device=q.device)
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.einsum("ht,thd->hd", torch.softmax(logits, dim=-1), vf)
    return out, lse / math.log(2)
