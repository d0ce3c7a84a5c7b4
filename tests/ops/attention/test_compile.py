"""A decoder layer that calls kiln's attention ops compiles with torch.compile(fullgraph=True) (no
graph break: every attention launch is a torch custom op with a fake implementation) and gives
the eager result; on the GPU the compiled layer is also captured in a CUDA graph and replayed.

The layer: fused add + RMSNorm, a QKV projection, append the new keys and values to the paged
cache, decode attention over it, the merge of two attention states, and the output projection;
a prefill layer likewise over a batch of prompts.

torch.compile(mode="reduce-overhead") (CUDA graph trees): the single-request ops plan on their
first call of a shape, which may be the graph's warm-up, whose thread allocates from the graph's
pool; what they keep is made elsewhere (kiln/_persistent.py), checked on the CPU with a per-thread
dispatch mode that sees every tensor this thread makes, and on the GPU end to end."""

from __future__ import annotations

import gc
import os
import textwrap
import threading

import pytest
import torch
from helpers import device_params, run_python
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln import _persistent

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


# ---- what the single-request ops keep, made outside a warming CUDA graph's pool -----------------

class _MadeOnThisThread(TorchDispatchMode):
    """The storage of every tensor an op on this thread makes while active. A dispatch mode is
    per thread, as the allocation routing of a CUDA graph tree's warm-up is."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [StorageWeakRef(t.untyped_storage()) for t in pytree.tree_leaves(out)
                      if isinstance(t, torch.Tensor)]
        return out

    def alive(self, *tensors) -> set[int]:
        """What this thread made that is still alive, besides the storages of `tensors` (the
        outputs, and the inputs that views were made of)."""
        gc.collect()
        known = {StorageWeakRef(t.untyped_storage()).cdata for t in tensors}
        return {s.cdata for s in self.made if not s.expired()} - known


_kept = []


def test_outside_graph_pools_builds_on_its_own_thread():
    """The build runs on kiln's worker (a nested call inline there) and its result and errors come
    back; a tensor it makes is not this thread's, one this thread keeps is (the check can fail)."""
    cpu = torch.device("cpu")

    def build(x):
        return threading.get_ident(), _persistent.outside_graph_pools(cpu, threading.get_ident), x

    worker, nested, x = _persistent.outside_graph_pools(cpu, build, 5)
    assert worker != threading.get_ident() and nested == worker and x == 5

    def fails():
        raise ValueError("bad build")

    with pytest.raises(ValueError, match="bad build"):
        _persistent.outside_graph_pools(cpu, fails)
    # The build's own keywords pass through, `device` too (the error record builds with it).
    made = _persistent.outside_graph_pools(cpu, torch.zeros, 3, dtype=torch.int64, device=cpu)
    assert made.dtype == torch.int64 and made.shape == (3,)
    with _MadeOnThisThread() as mode:
        _kept.append(_persistent.outside_graph_pools(cpu, torch.zeros, 4))
        _kept.append(torch.ones(4))
    assert mode.alive() == {StorageWeakRef(_kept[-1].untyped_storage()).cdata}
    _kept.clear()


@pytest.mark.parametrize("device", device_params())
def test_single_ops_keep_nothing_made_on_the_calling_thread(device):
    """single_decode and single_prefill (causal, custom mask) on their first call of a shape: their
    plans, page tables, workspace and mask table are kept (a second call reuses them), and nothing
    the calling thread made is alive afterwards but the outputs. (In a CUDA graph tree's warm-up,
    a kept tensor from this thread would sit in the graph's pool, and the tree stops.)"""
    from kiln import _prefill_mask, decode, prefill

    gen = torch.Generator().manual_seed(11)
    dtype = torch.float16
    k, v = (torch.randn(300, HK, D, generator=gen).to(device, dtype) for _ in range(2))
    q = torch.randn(HQ, D, generator=gen).to(device, dtype)
    qp = torch.randn(9, HQ, D, generator=gen).to(device, dtype)
    mask = (torch.rand(9, 300, generator=gen) > 0.3).to(device)
    decode._single_plans.clear()
    decode._single_workspaces.pop(q.device, None)
    prefill._single_plan.cache_clear()
    _prefill_mask._BIT_WEIGHTS.pop(q.device, None)
    with _MadeOnThisThread() as mode:
        out, lse = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)
        again = kiln.single_decode_with_kv_cache(q, k, v)
        causal = kiln.single_prefill_with_kv_cache(qp, k, v, causal=True)
        masked = kiln.single_prefill_with_kv_cache(qp, k, v, custom_mask=mask)
    assert len(decode._single_plans) == 1 and q.device in decode._single_workspaces
    assert prefill._single_plan.cache_info().currsize == 2 and q.device in _prefill_mask._BIT_WEIGHTS
    assert mode.alive(out, lse, again, causal, masked, q, k, v, qp, mask) == set()
    assert torch.equal(again, out)


_GRAPH_TREE_SCRIPT = textwrap.dedent("""\
    import torch
    import kiln

    torch.library.define("kilntest::single_ops",
                         "(Tensor q, Tensor k, Tensor v, Tensor qp, Tensor mask) -> Tensor[]")

    @torch.library.impl("kilntest::single_ops", "cuda")
    def single_ops(q, k, v, qp, mask):  # opaque to torch.compile: kiln runs eagerly in the warm-up
        out, lse = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)
        causal = kiln.single_prefill_with_kv_cache(qp, k, v, causal=True)
        masked = kiln.single_prefill_with_kv_cache(qp, k, v, custom_mask=mask)
        return [out, lse, causal, masked]

    @torch.library.register_fake("kilntest::single_ops")
    def _(q, k, v, qp, mask):
        return [torch.empty_like(q), q.new_empty(q.shape[:1], dtype=torch.float32), torch.empty_like(qp),
                torch.empty_like(qp)]

    def traced(q, k, v, qp):  # kiln's own custom ops in the graph
        out, lse = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)
        return out, lse, kiln.single_prefill_with_kv_cache(qp, k, v, causal=True)

    opaque = torch.compile(lambda *a: torch.ops.kilntest.single_ops(*a), mode="reduce-overhead",
                           fullgraph=True)
    inside = torch.compile(traced, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator().manual_seed(5)
    HQ, HK, D = 8, 2, 128
    for kv_len, fn in ((300, opaque), (2100, inside)):
        for _ in range(3):  # warm-up, recording, replay
            k, v = (torch.randn(kv_len, HK, D, generator=gen).to("cuda", torch.float16) for _ in range(2))
            q = torch.randn(HQ, D, generator=gen).to("cuda", torch.float16)
            qp = torch.randn(9, HQ, D, generator=gen).to("cuda", torch.float16)
            mask = (torch.rand(9, kv_len, generator=gen) > 0.3).cuda()
            args = (q, k, v, qp, mask) if fn is opaque else (q, k, v, qp)
            got = [t.clone() for t in fn(*args)]
            want = single_ops(q, k, v, qp, mask)[: len(got)]
            for g, w in zip(got, want):
                assert torch.equal(g, w), (kv_len, (g.float() - w.float()).abs().max())
    torch.cuda.synchronize()
    kiln.check_errors()
    print("PASS")
""")


@pytest.mark.gpu
def test_single_ops_in_cuda_graph_trees_from_a_fresh_process():
    """torch.compile(mode="reduce-overhead") over the single ops, their first calls in the process
    inside the graph's warm-up (the error record's too): kiln's custom ops traced into the graph
    and, as FlashInfer's test does, called from an opaque torch.library op; warm-up, recording
    and replay each equal an eager call, and the tree finds no kept tensor in its pool."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    gen = torch.Generator().manual_seed(0)  # compile every module here, outside the child's timeout
    k = torch.randn(40, 2, 128, generator=gen).to("cuda", torch.float16)
    q, qp = k[0].repeat(4, 1), k[:5].repeat(1, 4, 1)
    kiln.single_decode_with_kv_cache(q, k, k, return_lse=True)
    kiln.single_prefill_with_kv_cache(qp, k, k, causal=True)
    kiln.single_prefill_with_kv_cache(qp, k, k, custom_mask=torch.ones(5, 40, dtype=torch.bool).cuda())
    torch.cuda.synchronize()
    env = {"USER": os.environ.get("USER", "ci")}  # inductor's cache directory asks getpass.getuser()
    proc = run_python(_GRAPH_TREE_SCRIPT, env=env, check=False, timeout=600)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
