"""Building paged KV caches for tests. The reference the tests compare with is the one every
layer shares: kiln.trace.attention.attention (decode: attend)."""

from __future__ import annotations

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
