"""The prefill wrappers' CUDA graph mode (use_cuda_graph=True, FlashInfer's): every tensor a run
reads stays at one address across plans, so a run captured after one plan replays the next plan's
batch. On the CPU the buffers' reuse and the plan checks (fixed batch size, at most the first
plan's rows, the same launch) run eagerly; on CUDA a captured run is replayed after re-planning,
against the float32 reference (custom mask and RoPE included)."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from paged import make_paged

import kiln
from kiln.trace.attention import prefill_attention

TOL = (4e-3, 4e-3)  # float16: P and the output rounded once (test_prefill.py)


def _buffers(device, batch, pages):
    i32 = dict(dtype=torch.int32, device=device)
    return dict(
        qo_indptr_buf=torch.empty(batch + 1, **i32),
        paged_kv_indptr_buf=torch.empty(batch + 1, **i32),
        paged_kv_indices_buf=torch.empty(pages, **i32),
        paged_kv_last_page_len_buf=torch.empty(batch, **i32),
        custom_mask_buf=torch.empty(4096, dtype=torch.uint8, device=device),
        mask_indptr_buf=torch.empty(batch + 1, **i32),
    )


def _batch(device, gen, qo_lens, kv_lens, page):
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), 4, 64, generator=gen).to(device, torch.float16)
    return qo_indptr, q, make_paged(kv_lens, page, 2, 64, torch.float16, device, gen=gen)


def _expect(q, qo_indptr, paged, masks=None, pos="NONE", causal=False):
    """The float32 reference of the whole batch (request b under masks[b], else causal or not)."""
    out = []
    for b in range(len(paged.kv_lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = paged.keys(b)
        mask = None if masks is None else masks[b]
        out.append(prefill_attention(q[lo:hi], k, v, causal, mask=mask, pos_encoding_mode=pos)[0])
    return torch.cat(out)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("pos", ["NONE", "ROPE_LLAMA"])
def test_graph_mode_plans_reuse_the_fixed_buffers(device, pos):
    """Two plans of one wrapper, the second with fewer rows, other lengths and masks: the run's
    tensors are the same buffers both times, and each run gives its own batch's result."""
    gen = torch.Generator().manual_seed(5)
    page = 16
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(8 << 20, dtype=torch.uint8, device=device),
        "NHD",
        use_cuda_graph=True,
        **_buffers(device, 3, 40),
    )
    addresses = None
    for qo_lens, kv_lens in (([40, 33, 7], [90, 33, 200]), ([5, 30, 1], [100, 31, 17])):
        qo_indptr, q, paged = _batch(device, gen, qo_lens, kv_lens, page)
        masks = [torch.rand(a, b, generator=gen) < 0.7 for a, b in zip(qo_lens, kv_lens, strict=True)]
        w.plan(
            qo_indptr,
            paged.indptr,
            paged.indices,
            paged.last_page_len,
            4,
            2,
            64,
            page,
            pos_encoding_mode=pos,
            custom_mask=torch.cat([m.reshape(-1) for m in masks]).to(device),
        )
        plan = w._plan
        now = [
            t.data_ptr() for t in (*plan.tensors.values(), *w._pages[0], plan.mask.packed, plan.mask.indptr)
        ]
        assert addresses is None or now == addresses
        addresses = now
        out = w.run(q, (paged.k_cache, paged.v_cache))
        torch.testing.assert_close(
            out.float(), _expect(q, qo_indptr, paged, masks, pos), rtol=TOL[0], atol=TOL[1]
        )


@pytest.mark.parametrize("device", device_params())
def test_graph_mode_refuses_what_a_replay_cannot_follow(device):
    gen = torch.Generator().manual_seed(6)
    qo_indptr, q, paged = _batch(device, gen, [20, 9], [50, 9], 8)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(8 << 20, dtype=torch.uint8, device=device),
        "NHD",
        use_cuda_graph=True,
        **_buffers(device, 2, 12),
    )
    table = (paged.indptr, paged.indices, paged.last_page_len)
    w.plan(qo_indptr, *table, 4, 2, 64, 8, causal=True)
    with pytest.raises(ValueError, match="every plan keeps the first plan's heads"):
        w.plan(qo_indptr, *table, 4, 2, 64, 8, causal=False)
    more = torch.tensor([0, 21, 30], dtype=torch.int32)
    with pytest.raises(
        ValueError, match="qo_indptr covers 30 query rows; in CUDA graph mode a plan has at most"
    ):
        w.plan(more, *table, 4, 2, 64, 8, causal=True)
    with pytest.raises(ValueError, match="page_size stays the first plan's"):
        w.plan(qo_indptr, *table, 4, 2, 64, 16, causal=True)
    with pytest.raises(ValueError, match="paged_kv_indptr_buf should be a torch.Tensor in CUDA graph mode"):
        kiln.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(8 << 20, dtype=torch.uint8, device=device),
            use_cuda_graph=True,
            qo_indptr_buf=torch.empty(3, dtype=torch.int32),
        )
    one = kiln.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(8 << 20, dtype=torch.uint8, device=device), use_cuda_graph=True, **_buffers(device, 1, 12)
    )
    with pytest.raises(
        ValueError, match="with use_cuda_graph=True the batch size is fixed by qo_indptr_buf at 1"
    ):
        one.plan(qo_indptr, *table, 4, 2, 64, 8)
    w.plan(qo_indptr, *table, 4, 2, 64, 8, causal=True)  # the refused plans changed nothing
    out = w.run(q, (paged.k_cache, paged.v_cache))
    torch.testing.assert_close(
        out.float(), _expect(q, qo_indptr, paged, causal=True), rtol=TOL[0], atol=TOL[1]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("pos", ["NONE", "ROPE_LLAMA"])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "mask"])
def test_captured_run_replays_the_next_plan(pos, masked):
    """Capture run() after a warm-up plan, plan the real batch, replay: the real batch's result
    (paged)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = "cuda"
    gen = torch.Generator().manual_seed(7)
    qo_lens, kv_lens, page = [60, 1, 130, 17], [60, 300, 200, 40], 16
    qo_indptr, q, paged = _batch(device, gen, qo_lens, kv_lens, page)
    masks = [torch.rand(a, b, generator=gen) < 0.6 for a, b in zip(qo_lens, kv_lens, strict=True)]
    mask_arg = lambda ms: (  # noqa: E731
        {"custom_mask": torch.cat([m.reshape(-1) for m in ms]).to(device)} if masked else {"causal": True}
    )
    ws = torch.empty(8 << 20, dtype=torch.uint8, device=device)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, **_buffers(device, len(qo_lens), int(paged.indptr[-1]))
    )
    warm_kv = [1] * len(qo_lens)
    warm = make_paged(warm_kv, page, 2, 64, torch.float16, device, gen=gen)
    warm_masks = [torch.ones(a, 1, dtype=torch.bool) for a in qo_lens]
    w.plan(
        qo_indptr,
        warm.indptr,
        warm.indices,
        warm.last_page_len,
        4,
        2,
        64,
        page,
        pos_encoding_mode=pos,
        **mask_arg(warm_masks),
    )
    cache = (paged.k_cache, paged.v_cache)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, cache)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, cache)
    w.plan(
        qo_indptr,
        paged.indptr,
        paged.indices,
        paged.last_page_len,
        4,
        2,
        64,
        page,
        pos_encoding_mode=pos,
        **mask_arg(masks),
    )
    g.replay()
    torch.cuda.synchronize()
    expect = _expect(q, qo_indptr, paged, masks if masked else None, pos, causal=not masked)
    torch.testing.assert_close(out.float(), expect, rtol=TOL[0], atol=TOL[1])
