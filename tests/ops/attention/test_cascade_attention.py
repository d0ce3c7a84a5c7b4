"""MultiLevelCascadeAttentionWrapper against the attention over all of a request's keys: a shared
prefix and per-request pages (the decode form FlashInfer documents), three levels with prompts and
a causal last level, one level (= plain decode or prefill), and the plan's checks. The shared
level's key-range cut (key_splits) runs on the CPU too: the host backend plans as an H200."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params

import kiln
from kiln.cascade import key_splits
from kiln.trace.attention import attention

PAGE = 16
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def ws(device):
    return torch.empty(8 << 20, dtype=torch.uint8, device=device)


class Pool:
    """One paged cache [pages, 2, PAGE, kv_heads, D] of random data; spans of tokens get fresh
    pages in random order (a garbage page lies between them)."""

    def __init__(self, pages, kv_heads, head_dim, dtype, device, gen):
        self.cache = torch.randn(pages, 2, PAGE, kv_heads, head_dim, generator=gen).to(device, dtype)
        self.free = torch.randperm(pages, generator=gen).tolist()

    def span(self, tokens):
        n = -(-tokens // PAGE)
        ids = [self.free.pop() for _ in range(n + 1)][:n]  # one page left unused: garbage between
        return ids, tokens - (n - 1) * PAGE

    def keys(self, ids, last):
        """A span's keys and values, [tokens, kv_heads, D] each (gathered page by page)."""
        tokens = (len(ids) - 1) * PAGE + last
        kv = self.cache[torch.tensor(ids, dtype=torch.long, device=self.cache.device)]  # [n, 2, PAGE, H, D]
        return (kv[:, i].reshape(-1, *kv.shape[3:])[:tokens] for i in (0, 1))


def level(spans, device):
    """(paged_kv_indptr, indices, last_page_len) of a level from its requests' spans."""
    indptr = [0]
    for ids, _ in spans:
        indptr.append(indptr[-1] + len(ids))
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return t(indptr), t([i for ids, _ in spans for i in ids]), t([last for _, last in spans])


def check(out, ref, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_shared_prefix_and_unique_pages_decode(device, dtype):
    gen = torch.Generator().manual_seed(11)
    batch, hq, hk, d, shared = 9, 8, 2, 64, 211
    unique = [1, 17, 40, 3, 64, 16, 29, 5, 90]
    pool = Pool(60, hk, d, dtype, device, gen)
    prefix = pool.span(shared)
    own = [pool.span(n) for n in unique]
    i0, x0, l0 = level([prefix], device)
    i1, x1, l1 = level(own, device)
    qo = [torch.tensor([0, batch], dtype=torch.int32), torch.arange(batch + 1, dtype=torch.int32)]
    q = torch.randn(batch, hq, d, generator=gen).to(device, dtype)
    w = kiln.MultiLevelCascadeAttentionWrapper(2, ws(device))
    w.plan(qo, [i0, i1], [x0, x1], [l0, l1], hq, hk, d, PAGE, q_data_type=dtype)
    assert w._levels[0].splits > 1  # the shared level is cut along its keys (14 pages)
    out = w.run(q, pool.cache)
    kp, vp = pool.keys(*prefix)
    for b in range(batch):
        ku, vu = pool.keys(*own[b])
        ref = attention(q[b : b + 1], torch.cat([kp, ku]), torch.cat([vp, vu]))[0]
        check(out[b : b + 1], ref, dtype)


@pytest.mark.parametrize("device", device_params())
def test_three_levels_of_prompts_with_a_causal_last_level(device):
    """Level 0 shared by all, level 1 by two groups, level 2 each request's own; each request
    brings several queries, causal over its own keys (which are at least as many)."""
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(12)
    hq, hk, d = 4, 4, 128
    qo_lens, own_lens, group = [3, 1, 7, 5], [3, 20, 33, 5], [0, 0, 1, 1]
    pool = Pool(40, hk, d, dtype, device, gen)
    top = pool.span(70)
    groups = [pool.span(19), pool.span(48)]
    own = [pool.span(n) for n in own_lens]
    total = sum(qo_lens)
    ends = torch.tensor([0, *qo_lens]).cumsum(0).to(torch.int32)
    group_ends = torch.tensor([0, qo_lens[0] + qo_lens[1], total], dtype=torch.int32)
    levels = [level([top], device), level(groups, device), level(own, device)]
    w = kiln.MultiLevelCascadeAttentionWrapper(3, ws(device))
    qo = [torch.tensor([0, total], dtype=torch.int32), group_ends, ends]
    w.plan(qo, *map(list, zip(*levels, strict=True)), hq, hk, d, PAGE, causal=True, q_data_type=dtype)
    q = torch.randn(total, hq, d, generator=gen).to(device, dtype)
    out = w.run(q, pool.cache)
    k0, v0 = pool.keys(*top)
    for r, n in enumerate(qo_lens):
        kg, vg = pool.keys(*groups[group[r]])
        ko, vo = pool.keys(*own[r])
        lo = int(ends[r])
        ref = attention(q[lo : lo + n], torch.cat([k0, kg, ko]), torch.cat([v0, vg, vo]), causal=True)[0]
        check(out[lo : lo + n], ref, dtype)


@pytest.mark.parametrize("device", device_params())
def test_one_level_is_plain_paged_attention(device):
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(13)
    hq, hk, d = 8, 1, 64
    pool = Pool(20, hk, d, dtype, device, gen)
    own = [pool.span(n) for n in (5, 31, 77)]
    indptr, indices, last = level(own, device)
    q = torch.randn(3, hq, d, generator=gen).to(device, dtype)
    w = kiln.MultiLevelCascadeAttentionWrapper(1, ws(device))
    w.plan([torch.arange(4, dtype=torch.int32)], [indptr], [indices], [last], hq, hk, d, PAGE,
           q_data_type=dtype)
    dec = kiln.BatchDecodeWithPagedKVCacheWrapper(ws(device))
    dec.plan(indptr, indices, last, hq, hk, d, PAGE, q_data_type=dtype)
    torch.testing.assert_close(w.run(q, pool.cache), dec.run(q, pool.cache), rtol=0, atol=0)


def test_key_splits_fill_the_gpu_and_keep_a_page_per_range():
    one = torch.tensor([64])
    assert key_splits(one, torch.tensor([256]), 32, 132, 128) == 4  # 32 CTAs -> 4 ranges: one wave of 128
    assert key_splits(one, torch.tensor([3]), 32, 132, 128) == 3  # never an empty range
    assert key_splits(torch.tensor([128] * 5), torch.tensor([256] * 5), 32, 132, 128) == 1  # 160 CTAs
    assert key_splits(torch.tensor([0]), torch.tensor([4]), 8, 132, 128) == 1


def test_plan_and_run_say_what_is_wrong():
    device = "cpu"
    w = kiln.MultiLevelCascadeAttentionWrapper(2, ws(device))
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.zeros(1, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 2, PAGE, 1, 64))
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    with pytest.raises(ValueError, match="list of 2 tensors"):
        w.plan([t([0, 2])], [t([0, 1])], [t([0])], [t([3])], 1, 1, 64, PAGE)
    with pytest.raises(ValueError, match="every level holds every query"):
        w.plan([t([0, 2]), t([0, 1, 2, 3])], [t([0, 1]), t([0, 1, 2, 3])], [t([0]), t([1, 2, 3])],
               [t([3]), t([1, 1, 1])], 1, 1, 64, PAGE)
    with pytest.raises(ValueError, match="2 requests in qo_indptr but 1 in paged_kv_indptr"):
        w.plan([t([0, 2]), t([0, 1, 2])], [t([0, 1]), t([0, 1])], [t([0]), t([1])], [t([3]), t([1])],
               1, 1, 64, PAGE)
    with pytest.raises(ValueError, match="use_cuda_graph"):
        kiln.MultiLevelCascadeAttentionWrapper(2, ws(device), use_cuda_graph=True)
    with pytest.raises(ValueError, match="num_levels"):
        kiln.MultiLevelCascadeAttentionWrapper(0, ws(device))
    w.plan([t([0, 2]), t([0, 1, 2])], [t([0, 1]), t([0, 1, 2])], [t([0]), t([1, 2])], [t([3]), t([1, 2])],
           1, 1, 64, PAGE, q_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match=r"q must be \[2, num_qo_heads, head_dim\]"):
        w.run(torch.zeros(3, 1, 64, dtype=torch.bfloat16),
              torch.zeros(3, 2, PAGE, 1, 64, dtype=torch.bfloat16))


# ---- the shared-prefix wrappers (FlashInfer's older cascade API) -----------------------------------


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_shared_prefix_wrappers_match_the_attention_over_prefix_and_pages(device, layout):
    """BatchDecode/BatchPrefillWithSharedPrefixPagedKVCacheWrapper: the prefix in contiguous
    k_shared / v_shared, each request's own tokens paged; out = attention over both (prefill:
    causal among a request's own keys, the prefix before every query), GQA 8/2."""
    gen = torch.Generator().manual_seed(21)
    dtype, hq, hk, d = torch.float16, 8, 2, 128
    shared_len, unique = 300, [40, 1, 77]
    k_shared = torch.randn(shared_len, hk, d, generator=gen).to(device, dtype)
    v_shared = torch.randn(shared_len, hk, d, generator=gen).to(device, dtype)
    pool = Pool(64, hk, d, dtype, device, gen)
    if layout == "HND":
        pool.cache = pool.cache.transpose(2, 3).contiguous().transpose(2, 3)  # same values, HND strides below
    spans = [pool.span(n) for n in unique]
    indptr, indices, last = level(spans, device)
    cache = pool.cache if layout == "NHD" else pool.cache.transpose(2, 3)
    shared = (k_shared, v_shared) if layout == "NHD" else (k_shared.transpose(0, 1), v_shared.transpose(0, 1))

    def whole(b):
        k, v = pool.keys(*spans[b])
        return torch.cat([k_shared, k]), torch.cat([v_shared, v])

    q = torch.randn(len(unique), hq, d, generator=gen).to(device, dtype)
    w = kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(ws(device), layout)
    w.begin_forward(indptr, indices, last, hq, hk, d, PAGE)
    out = w.forward(q, *shared, cache)
    for b in range(len(unique)):
        ref, _ = attention(q[b:b + 1], *whole(b))
        check(out[b:b + 1], ref, dtype)

    qo_lens = [5, 1, 30]
    qo_indptr = torch.tensor([0, 5, 6, 36], dtype=torch.int32, device=device)
    q = torch.randn(sum(qo_lens), hq, d, generator=gen).to(device, dtype)
    p = kiln.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(ws(device), layout)
    p.begin_forward(qo_indptr, indptr, indices, last, hq, hk, d, PAGE)
    for causal in (False, True):
        out = p.forward(q, *shared, cache, causal=causal)
        for b in range(len(unique)):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            k, v = whole(b)
            ref, _ = attention(q[rows], k, v)
            if causal:  # the prefix is visible to all; a request's own keys causally (aligned to the end)
                ku, _ = pool.keys(*spans[b])
                n = qo_lens[b]
                pos = torch.arange(n, device=device)[:, None] + ku.shape[0] - n
                kf, vf = (x.float().repeat_interleave(hq // hk, 1) for x in (k, v))
                logits = torch.einsum("ihd,jhd->hij", q[rows].float(), kf)
                logits = logits / d**0.5
                visible = torch.arange(k.shape[0], device=device)[None, :] < shared_len + pos + 1
                logits = logits.masked_fill(~visible, float("-inf"))
                ref = torch.einsum("hij,jhd->ihd", logits.softmax(-1), vf)
            check(out[rows], ref, dtype)
    with pytest.raises(RuntimeError, match="forward called before begin_forward"):
        kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(ws(device)).forward(q, *shared, cache)
    with pytest.raises(ValueError, match="k_shared must be a 3-D tensor"):
        w.forward(q[:3], k_shared[None], v_shared[None], cache)
