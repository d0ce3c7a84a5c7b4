"""The MoE layer's backend= (kiln.fused_moe, kiln.cutlass_fused_moe): "triton" runs both projections
through kiln.grouped_mm(backend="triton") at every batch size, never the small-batch expert kernels;
"cuda" and "auto" keep the CUDA grouped GEMMs and the small-batch kernels. On the CPU every backend
runs the host backend (with "triton", its grouped path at every size): checked against a float32
reference written per token, on fresh random data at odd sizes, with the GEMM calls recorded; and
on fake CUDA tensors (torch.compile's graph, no GPU) which custom ops each backend reaches. GPU
tests (marked gpu, skipped without triton): backend="triton" against the same reference, fp8
weights, torch.compile(fullgraph=True) and a CUDA-graph replay with new routing."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
from moe_helpers import per_token_reference

import kiln
from kiln.trace.moe import layer_weights, moe_topk_float

BF16 = torch.bfloat16
# As tests/ops/moe/test_moe.py: the up and down projections and the activation product are rounded
# to the activation dtype (2^-9 relative in bf16), the k-way sum is float32, outputs are ~N(0, 1).
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}
_needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="the triton backend needs triton==3.6.0 (pip install -e '.[test]')",
)


def gpu(test):
    return pytest.mark.gpu(_needs_triton(test))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def check(out, ref, dtype=BF16):
    assert out.dtype == dtype and out.isfinite().all()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref, rtol=rtol, atol=atol)


def case(e, k, h, i, t, device, seed, dtype=BF16):
    g = gen(seed)
    w13, w2 = layer_weights(e, h, i, dtype, "cpu", g)
    x = torch.randn((t, h), generator=g).to(dtype)
    w, ids = moe_topk_float(torch.randn((t, e), generator=g), k)
    return [v.to(device) for v in (x, w13, w2, w, ids.to(torch.int32))]


def up_first(w13):
    """fused_moe's w13 (gate rows, then up) as cutlass_fused_moe's fc1 (up rows, then gate)."""
    i = w13.shape[1] // 2
    return torch.cat([w13[:, i:], w13[:, :i]], dim=1)


def layer(which, x, w13, w2, w, ids, backend, **kw):
    if which == "cutlass_fused_moe":
        return kiln.cutlass_fused_moe(x, ids, w, up_first(w13), w2, x.dtype, backend=backend, **kw)[0]
    return kiln.fused_moe(x, w13, w2, w, ids, backend=backend, **kw)


@pytest.fixture
def calls(monkeypatch):
    """What the layer ran: ("experts", gated) per small-batch kernel, ("grouped_mm", backend) per GEMM."""
    seen = []
    experts, grouped = kiln.moe._experts_op, kiln.moe.grouped_mm

    def experts_op(*a):
        seen.append(("experts", a[4]))
        return experts(*a)

    def grouped_mm(*a, **kw):
        seen.append(("grouped_mm", kw.get("backend", "auto")))
        return grouped(*a, **kw)

    monkeypatch.setattr(kiln.moe, "_experts_op", experts_op)
    monkeypatch.setattr(kiln.moe, "grouped_mm", grouped_mm)
    return seen


# ---- on the CPU: the host fallback -------------------------------------------------------------


@pytest.mark.parametrize("which", ["fused_moe", "cutlass_fused_moe"])
@pytest.mark.parametrize("t", [9, 70], ids=["decode-size", "grouped-size"])
def test_triton_backend_on_cpu_runs_the_grouped_host_path_and_matches_the_reference(which, t, calls):
    """T = 9 (36 rows <= 8 x 16 experts) is where the CUDA backend takes the small-batch kernels;
    backend="triton" takes the grouped GEMMs there too, each called with backend="triton" (which
    on CPU tensors runs the host backend). H 72 and I 40: no multiple of 16."""
    x, w13, w2, w, ids = case(16, 4, 72, 40, t, "cpu", 100 + t)
    ids[0, 1] = -1  # an expert of another rank
    ref = per_token_reference(x, w13, w2, w, ids)
    out = torch.full_like(x, float("nan"))
    got = layer(
        which, x, w13, w2, w, ids, "triton", **({"output": out} if which != "fused_moe" else {"out": out})
    )
    assert got is out
    check(out, ref)
    gemms = 3 if which == "cutlass_fused_moe" else 2  # (cutlass: gate and up halves, then down)
    assert calls == [("grouped_mm", "triton")] * gemms


@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_cuda_and_auto_keep_the_small_batch_kernels(backend, calls):
    x, w13, w2, w, ids = case(16, 4, 72, 40, 9, "cpu", 7)
    check(kiln.fused_moe(x, w13, w2, w, ids, backend=backend), per_token_reference(x, w13, w2, w, ids))
    assert calls == [("experts", True), ("experts", False)]
    del calls[:]
    x, w13, w2, w, ids = case(16, 4, 72, 40, 70, "cpu", 8)  # 280 rows > 8 x 16: the grouped GEMMs
    check(kiln.fused_moe(x, w13, w2, w, ids, backend=backend), per_token_reference(x, w13, w2, w, ids))
    assert calls == [("grouped_mm", backend)] * 2


def test_triton_backend_on_cpu_with_fp8_weights_and_float16():
    """fp8 weights with backend="triton" are dequantised at every size (the small-batch kernels,
    which read fp8, are the CUDA backend's): the result is the dequantised weights' layer."""
    from kiln.trace.moe import dequantize

    g = gen(3)
    x, w13, w2, w, ids = case(8, 2, 64, 48, 5, "cpu", 4)
    q13, q2 = w13.float().to(torch.float8_e4m3fn), w2.float().to(torch.float8_e4m3fn)
    s13, s2 = torch.rand(8, generator=g) + 0.5, torch.rand(8, generator=g) + 0.5
    out = kiln.fused_moe(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, backend="triton")
    ref = per_token_reference(x, dequantize(q13, s13).to(BF16), dequantize(q2, s2).to(BF16), w, ids)
    check(out, ref)
    xh, w13h, w2h, wh, idsh = case(8, 2, 64, 48, 33, "cpu", 5, torch.float16)
    check(
        kiln.fused_moe(xh, w13h, w2h, wh, idsh, activation="gelu", backend="triton"),
        per_token_reference(xh, w13h, w2h, wh, idsh, "gelu"),
        torch.float16,
    )


@pytest.mark.parametrize("which", ["fused_moe", "cutlass_fused_moe"])
@pytest.mark.parametrize("bad", ["Triton", "flashinfer", "", None, 1])
def test_an_unknown_backend_is_refused_with_the_valid_values(which, bad, calls):
    x, w13, w2, w, ids = case(4, 2, 16, 8, 3, "cpu", 1)
    api = f"kiln.{which}"
    valid = "cutlass, auto, cuda, triton" if which == "cutlass_fused_moe" else "auto, cuda, triton"
    with pytest.raises(ValueError, match=rf"{api}: backend must be one of {valid}, got {bad!r}"):
        layer(which, x, w13, w2, w, ids, bad)
    assert calls == []  # refused before anything ran


def test_backend_is_keyword_only():
    x, w13, w2, w, ids = case(4, 2, 16, 8, 3, "cpu", 2)
    with pytest.raises(TypeError):
        kiln.fused_moe(x, w13, w2, w, ids, "silu", None, None, None, "triton")
    # cutlass_fused_moe: FlashInfer's 36 positional parameters, then keyword-only ones (backend too)
    backend = inspect.signature(kiln.cutlass_fused_moe).parameters["backend"]
    assert backend.kind == inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize(("backend", "gemm"), [("triton", "grouped_gemm_triton"), ("cuda", "moe_experts")])
def test_on_cuda_tensors_triton_reaches_the_triton_grouped_gemm_at_decode_size(backend, gemm):
    """With no GPU: torch.compile(fullgraph=True) traces the layer on fake CUDA tensors at a
    decode size (T 4, 16 rows <= 8 x 8 experts), and the graph's kiln ops say which GEMMs run:
    backend="triton" the triton grouped GEMM twice and never the small-batch expert kernels;
    backend="cuda" the small-batch expert kernels (up with the activation fused, then down)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w13, w2, w, ids = case(8, 2, 64, 32, 4, "cpu", 40)
    kiln.fused_moe(x, w13, w2, w, ids, backend=backend)  # imports whatever the call imports lazily
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda *a: kiln.fused_moe(*a, backend=backend), fullgraph=True, backend=capture)
    with FakeTensorMode():
        fake = [torch.empty(v.shape, dtype=v.dtype, device="cuda") for v in (x, w13, w2, w, ids)]
        got = f(*fake)
    torch._dynamo.reset()
    assert got.shape == x.shape and got.device.type == "cuda"
    (gm,) = graphs
    ops = [
        n.target._opname
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target.namespace == "kiln"
    ]
    assert ops.count(gemm) == 2, ops
    assert ("moe_experts" in ops) == (backend == "cuda") and ("grouped_gemm_triton" in ops) == (
        backend == "triton"
    )


# ---- on the GPU ------------------------------------------------------------------------------------

# (E, k, H, I): the test_moe.py shapes, cut down; H 72 / I 40 run the triton fallback kernel (no
# multiple of 16), the others its fast kernels.
GPU_SHAPES = [(8, 2, 64, 112), (16, 4, 48, 24), (32, 8, 72, 40)]


@gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "e{}k{}h{}i{}".format(*s))
@pytest.mark.parametrize("t", [1, 9, 64, 333])
def test_triton_backend_matches_the_per_token_reference(shape, t, calls):
    e, k, h, i = shape
    x, w13, w2, w, ids = case(e, k, h, i, t, "cuda", t + e)
    out = kiln.fused_moe(x, w13, w2, w, ids, backend="triton")
    check(out, per_token_reference(x, w13, w2, w, ids))
    assert calls == [("grouped_mm", "triton")] * 2


@gpu
@pytest.mark.parametrize("t", [5, 200])
def test_triton_backend_cutlass_up_first_and_minus_one_ids(t, calls):
    x, w13, w2, w, ids = case(16, 4, 128, 64, t, "cuda", 50 + t)
    ids[::3, 0] = -1
    out = torch.full_like(x, float("nan"))
    kiln.cutlass_fused_moe(x, ids, w, up_first(w13), w2, BF16, output=out, backend="triton")
    check(out, per_token_reference(x, w13, w2, w, ids))
    assert calls == [("grouped_mm", "triton")] * 3


@gpu
def test_triton_backend_fp8_weights_on_the_gpu():
    from kiln.trace.moe import dequantize

    g = gen(11)
    x, w13, w2, w, ids = case(16, 4, 256, 128, 9, "cuda", 12)
    q13, q2 = w13.float().to(torch.float8_e4m3fn), w2.float().to(torch.float8_e4m3fn)
    s13 = (torch.rand((16, 2, 2), generator=g) + 0.5).cuda()  # 128 x 128 blocks of [E, 2I, H]
    s2 = (torch.rand((16, 2, 1), generator=g) + 0.5).cuda()
    out = kiln.fused_moe(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, backend="triton")
    ref = per_token_reference(x, dequantize(q13, s13).to(BF16), dequantize(q2, s2).to(BF16), w, ids)
    check(out, ref)


@gpu
def test_triton_backend_under_torch_compile_fullgraph():
    x, w13, w2, _, _ = case(16, 4, 128, 64, 24, "cuda", 30)
    logits = torch.randn(24, 16, generator=gen(31)).cuda()

    def fn(x, logits):
        w, ids = kiln.moe_topk(logits, 4)
        return kiln.fused_moe(x, w13, w2, w, ids, backend="triton")

    got = torch.compile(fn, fullgraph=True)(x, logits)
    torch.testing.assert_close(got, fn(x, logits), rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("t", [8, 64])
def test_triton_backend_cuda_graph_replays_with_new_routing(t):
    """Captured once, replayed with other logits (a different hot expert each time): the routing,
    offs and every launch read device memory only, so each replay is the new routing's layer."""
    e, k, h, i = 16, 4, 256, 128
    x, w13, w2, _, _ = case(e, k, h, i, t, "cuda", 16)
    logits = torch.randn(t, e, device="cuda")
    out = torch.empty_like(x)

    def step():
        w, ids = kiln.moe_topk(logits, k)
        kiln.fused_moe(x, w13, w2, w, ids, out=out, backend="triton")
        return w, ids

    step()  # load the modules outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w_g, ids_g = step()
    for seed in (1, 2):
        logits.copy_(torch.randn(t, e, generator=gen(seed)).cuda())
        logits[:, 3 + seed] += 4.0 * seed
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_w, want_ids = moe_topk_float(logits.cpu(), k)
        assert torch.equal(ids_g.cpu(), want_ids.to(torch.int32))
        check(out, per_token_reference(x, w13, w2, want_w, want_ids))
