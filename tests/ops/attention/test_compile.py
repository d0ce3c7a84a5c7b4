"""A decoder layer that calls kiln's attention ops compiles with torch.compile(fullgraph=True) (no
graph break: every attention launch is a torch custom op with a fake implementation) and gives
the eager result; on the GPU the compiled layer is also captured in a CUDA graph and replayed.

The layer: fused add + RMSNorm, a QKV projection, append the new keys and values to the paged
cache, decode attention over it, the merge of two attention states, and the output projection;
a prefill layer likewise over a batch of prompts."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params

import kiln

HQ, HK, D, PAGE = 4, 2, 64, 16
HIDDEN = 64


def _weights(gen, device, dtype):
    w_norm = torch.rand(HIDDEN, generator=gen).to(device, dtype)
    w_qkv = (torch.randn(HIDDEN, (HQ + 2 * HK) * D, generator=gen) / 8).to(device, dtype)
    w_o = (torch.randn(HQ * D, HIDDEN, generator=gen) / 8).to(device, dtype)
    return w_norm, w_qkv, w_o


def _decode_setup(device, dtype, gen):
    kv_lens = [37, 5, 64]  # after this step's append
    pages = [(n + PAGE - 1) // PAGE for n in kv_lens]
    pool = sum(pages) + 3
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.randperm(pool, generator=gen)[: sum(pages)].to(torch.int32)
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(kv_lens, pages, strict=True)], dtype=torch.int32)
    k_cache = torch.randn(pool, PAGE, HK, D, generator=gen).to(device, dtype)
    v_cache = torch.randn(pool, PAGE, HK, D, generator=gen).to(device, dtype)
    seq = torch.tensor(kv_lens, dtype=torch.int32)
    append_indptr = torch.arange(len(kv_lens) + 1, dtype=torch.int32)  # one new token each
    batch_indices, positions = kiln.get_batch_indices_positions(append_indptr.to(device), seq.to(device),
                                                               len(kv_lens))
    wrapper = kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8 << 20, dtype=torch.uint8, device=device))
    wrapper.plan(indptr, indices.to(device), last, HQ, HK, D, PAGE, q_data_type=dtype)
    table = (indices.to(device), indptr.to(device), last.to(device))
    return wrapper, (k_cache, v_cache), batch_indices, positions, table


def decode_layer(wrapper, x, residual, w_norm, w_qkv, w_o, cache, batch_indices, positions, table,
                 other_v, other_s):
    kiln.fused_add_rmsnorm(x, residual, w_norm)
    qkv = x @ w_qkv
    q = qkv[:, : HQ * D].reshape(-1, HQ, D)
    k = qkv[:, HQ * D: (HQ + HK) * D].reshape(-1, HK, D)
    v = qkv[:, (HQ + HK) * D:].reshape(-1, HK, D)
    indices, indptr, last = table
    kiln.append_paged_kv_cache(k, v, batch_indices, positions, cache, indices, indptr, last)
    o, lse = wrapper.run(q.contiguous(), cache, return_lse=True)
    o, lse = kiln.merge_state(o, lse, other_v, other_s)
    both_v, both_s = torch.stack([o, other_v], 1), torch.stack([lse, other_s], 1)
    o2, s2 = kiln.merge_states(both_v, both_s)
    kiln.merge_state_in_place(o, lse, o2, s2)
    return o.reshape(-1, HQ * D) @ w_o


def _run_decode(device, dtype, compile_backend):
    gen = torch.Generator().manual_seed(7)
    w_norm, w_qkv, w_o = _weights(gen, device, dtype)
    wrapper, cache, bi, pos, table = _decode_setup(device, dtype, gen)
    x = torch.randn(3, HIDDEN, generator=gen).to(device, dtype)
    r = torch.randn(3, HIDDEN, generator=gen).to(device, dtype)
    ov = torch.randn(3, HQ, D, generator=gen).to(device, dtype)
    os_ = torch.randn(3, HQ, generator=gen).to(device)
    fn = torch.compile(decode_layer, fullgraph=True, backend=compile_backend)
    eager_cache = tuple(c.clone() for c in cache)
    eager = decode_layer(wrapper, x.clone(), r.clone(), w_norm, w_qkv, w_o, eager_cache, bi, pos, table, ov,
                         os_)
    compiled = fn(wrapper, x.clone(), r.clone(), w_norm, w_qkv, w_o, cache, bi, pos, table, ov, os_)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for c, e in zip(cache, eager_cache, strict=True):  # the append went through the compiled graph
        assert torch.equal(c, e)
    return fn, wrapper, (x, r, w_norm, w_qkv, w_o, cache, bi, pos, table, ov, os_), eager


@pytest.mark.parametrize("device", device_params())
def test_a_decode_layer_compiles_fullgraph_and_matches_eager(device):
    backend = "inductor" if device == "cuda" else "aot_eager"
    _run_decode(device, torch.bfloat16, backend)


def prefill_layer(wrapper, ragged, q, k, v, cache):
    out = wrapper.run(q, cache)
    out2 = ragged.run(q, k, v)
    single = kiln.single_prefill_with_kv_cache(q[:9], k[:20], v[:20], causal=True)
    one, one_lse = kiln.single_decode_with_kv_cache(q[8], k[:20], v[:20], return_lse=True)
    return out + out2, single, one, one_lse


@pytest.mark.parametrize("device", device_params())
def test_a_prefill_layer_compiles_fullgraph_and_matches_eager(device):
    gen = torch.Generator().manual_seed(3)
    dtype = torch.float16
    qo, kv = [9, 4], [20, 31]
    qo_indptr = torch.tensor([0, 9, 13], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 20, 51], dtype=torch.int32)
    q = torch.randn(13, HQ, D, generator=gen).to(device, dtype)
    k = torch.randn(51, HK, D, generator=gen).to(device, dtype)
    v = torch.randn(51, HK, D, generator=gen).to(device, dtype)
    # The same keys as a paged cache of one-token pages.
    cache = (k.unsqueeze(1), v.unsqueeze(1))
    ws = torch.empty(8 << 20, dtype=torch.uint8, device=device)
    paged = kiln.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(qo_indptr, kv_indptr, torch.arange(51, dtype=torch.int32, device=device),
               torch.ones(2, dtype=torch.int32), HQ, HK, D, 1, causal=True, q_data_type=dtype)
    ragged = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan(qo_indptr, kv_indptr, HQ, HK, D, causal=True, q_data_type=dtype)
    backend = "inductor" if device == "cuda" else "aot_eager"
    fn = torch.compile(prefill_layer, fullgraph=True, backend=backend)
    eager = prefill_layer(paged, ragged, q, k, v, cache)
    compiled = fn(paged, ragged, q, k, v, cache)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert qo and kv


@pytest.mark.gpu
def test_the_compiled_decode_layer_replays_in_a_cuda_graph():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    fn, wrapper, args, _ = _run_decode("cuda", torch.bfloat16, "inductor")
    x, r, *rest = args
    static_x, static_r = x.clone(), r.clone()
    fn(wrapper, static_x, static_r, *rest)  # warm-up on the capture stream's allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    sx, sr = x.clone(), r.clone()
    with torch.cuda.graph(graph):
        out = fn(wrapper, sx, sr, *rest)
    sx.copy_(x)
    sr.copy_(r)
    graph.replay()
    torch.cuda.synchronize()
    w_norm, w_qkv, w_o, cache, *tail = rest
    expect = decode_layer(wrapper, x.clone(), r.clone(), w_norm, w_qkv, w_o, tuple(c.clone() for c in cache),
                          *tail)
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
