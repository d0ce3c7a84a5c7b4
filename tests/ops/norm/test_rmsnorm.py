"""kiln.rmsnorm and friends against a float64 reference, on the host backend always and on CUDA
where a device is present: every dtype, odd and large shapes, 2-D and 3-D, strided inputs, out=,
in place, poisoned outputs, property tests, bad inputs, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace.norm import rms_norm_float64 as ref_rmsnorm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Tolerance per dtype: the kernel rounds once at the output (half an ulp: 2^-24, 2^-11, 2^-8
# relative) on top of float32 accumulation; the bound allows one ulp plus accumulation-order error.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}


def check(out: torch.Tensor, ref: torch.Tensor):
    assert out.isfinite().all(), "unwritten (poisoned) or non-finite elements in the output"
    rtol, atol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


def randn(shape, dtype, device, gen=None):
    return torch.randn(shape, dtype=torch.float32, generator=gen).to(device=device, dtype=dtype)


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))


SHAPES = [(1, 1), (1, 7), (3, 4095), (7, 4096), (128, 4096), (33, 5120), (2, 8191), (5, 12288),
          (1, 40000), (4, 65536), (300, 128), (1000, 64), (17, 3)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rmsnorm_matches_reference(device, dtype, shape):
    x, w = randn(shape, dtype, device), randn(shape[-1:], dtype, device)
    out = poisoned_like(x)
    assert kiln.rmsnorm(x, w, eps=1e-6, out=out) is out
    check(out, ref_rmsnorm(x, w, 1e-6))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(5, 4096), (130, 2048), (3, 7, 1000), (2, 40000), (9, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fused_add_rmsnorm(device, dtype, gemma, shape):
    x, r, w = (randn(shape, dtype, device), randn(shape, dtype, device),
               randn(shape[-1:], dtype, device))
    x0, r0 = x.clone(), r.clone()
    (kiln.gemma_fused_add_rmsnorm if gemma else kiln.fused_add_rmsnorm)(x, r, w, eps=1e-5)
    summed = (x0.float() + r0.float()).to(dtype)
    assert torch.equal(r, summed), "residual must be exactly (input + residual) rounded to dtype"
    check(x, ref_rmsnorm(summed, w, 1e-5, 1.0 if gemma else 0.0))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_gemma_rmsnorm(device, dtype):
    x, w = randn((37, 3072), dtype, device), randn((3072,), dtype, device)
    check(kiln.gemma_rmsnorm(x, w, eps=1e-6), ref_rmsnorm(x, w, 1e-6, 1.0))


@pytest.mark.parametrize("device", device_params())
def test_three_d_and_strided_inputs(device):
    dtype = torch.bfloat16
    base = randn((4, 9, 6000), dtype, device)
    x3 = base[:, 1:8, 100:4196]  # non-collapsible leading strides, unaligned start
    w = randn((4096,), dtype, device)
    check(kiln.rmsnorm(x3, w), ref_rmsnorm(x3, w, 1e-6))
    x2 = base[1, :, 8:4104]  # 2-D with row stride 6000, 16-byte aligned start
    out_big = poisoned_like(randn((9, 5000), dtype, device))
    out = out_big[:, 500:4596]  # strided out=
    kiln.rmsnorm(x2, w, out=out)
    check(out, ref_rmsnorm(x2, w, 1e-6))
    assert out_big[:, :500].isnan().all() and out_big[:, 4596:].isnan().all()  # nothing outside


@pytest.mark.parametrize("device", device_params())
def test_in_place_out_and_empty(device):
    x, w = randn((6, 1024), torch.float16, device), randn((1024,), torch.float16, device)
    expected = ref_rmsnorm(x, w, 1e-6)
    kiln.rmsnorm(x, w, out=x)
    check(x, expected)
    empty = torch.empty((0, 1024), dtype=torch.float16, device=device)
    assert kiln.rmsnorm(empty, w).shape == (0, 1024)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("offset_elems", [1, 2, 3, 4])
def test_every_vector_width_by_alignment(device, offset_elems):
    """Start offsets that allow 8-, 4-, 2- and 1-element vectors all give the right answer."""
    big = randn((64, 2048 + 8), torch.bfloat16, device)
    x = big[:, offset_elems:offset_elems + 2048]
    w = randn((2048,), torch.bfloat16, device)
    check(kiln.rmsnorm(x, w), ref_rmsnorm(x, w, 1e-6))


@pytest.mark.slow
@pytest.mark.parametrize("device", device_params())
def test_large(device):
    rows, hidden = (16384, 8192) if device == "cuda" else (2048, 8192)
    x, w = randn((rows, hidden), torch.bfloat16, device), randn((hidden,), torch.bfloat16, device)
    out = poisoned_like(x)
    kiln.rmsnorm(x, w, out=out)
    check(out, ref_rmsnorm(x, w, 1e-6))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 40), hidden=st.integers(1, 3000), three_d=st.booleans(),
       dtype=st.sampled_from(DTYPES), pad=st.integers(0, 9), eps=st.floats(1e-8, 1e-2),
       seed=st.integers(0, 2**31 - 1))
def test_property_host(rows, hidden, three_d, dtype, pad, eps, seed):
    """Any shape, stride padding, dtype and eps: agrees with the reference (host backend)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (2, rows, hidden + pad) if three_d else (rows, hidden + pad)
    x = randn(shape, dtype, "cpu", gen)[..., pad:]
    w = randn((hidden,), dtype, "cpu", gen)
    out = kiln.rmsnorm(x, w, eps=eps)
    if out.numel():
        check(out, ref_rmsnorm(x, w, eps))


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 300), hidden=st.integers(1, 20000), dtype=st.sampled_from(DTYPES),
       pad=st.integers(0, 9), fused=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_property_cuda(rows, hidden, dtype, pad, fused, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, hidden + pad), dtype, "cuda", gen)[:, pad:]
    w = randn((hidden,), dtype, "cuda", gen)
    if fused:
        r = randn((rows, hidden), dtype, "cuda", gen)
        x = x.contiguous()
        summed = (x.float() + r.float()).to(dtype)
        kiln.fused_add_rmsnorm(x, r, w)
        assert torch.equal(r, summed)
        if rows:
            check(x, ref_rmsnorm(summed, w, 1e-6))
    else:
        out = kiln.rmsnorm(x, w)
        if rows:
            check(out, ref_rmsnorm(x, w, 1e-6))


# ---- bad inputs: every check names the argument, and nothing is launched --------------------

@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x, w = randn((4, 64), torch.float16, device), randn((64,), torch.float16, device)
    with pytest.raises(ValueError, match=r"weight.shape\[0\] must equal input.shape\[-1\] \(64\), got 63"):
        kiln.rmsnorm(x, w[:63])
    with pytest.raises(TypeError, match="weight.dtype must be float16 .*got bfloat16"):
        kiln.rmsnorm(x, w.bfloat16())
    with pytest.raises(TypeError, match="input.dtype float64 is not supported; supported dtypes: "
                                        "float32, float16, bfloat16"):
        kiln.rmsnorm(x.double(), w)
    with pytest.raises(ValueError, match="input must have 2 or 3 dimensions, got shape \\[256\\]"):
        kiln.rmsnorm(x.flatten(), w)
    with pytest.raises(ValueError, match="input must be contiguous in its last dimension"):
        kiln.rmsnorm(x.t().contiguous().t(), randn((4,), torch.float16, device))
    with pytest.raises(ValueError, match=r"out.shape must equal input.shape \[4, 64\], got \[4, 32\]"):
        kiln.rmsnorm(x, w, out=torch.empty((4, 32), dtype=x.dtype, device=device))
    with pytest.raises(TypeError, match="out.dtype must be float16"):
        kiln.rmsnorm(x, w, out=torch.empty((4, 64), dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        kiln.rmsnorm(x, w, eps=float("nan"))
    with pytest.raises(ValueError, match="input and residual overlap in memory"):
        kiln.fused_add_rmsnorm(x, x, w)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        kiln.rmsnorm([1.0, 2.0], w)
    with pytest.raises(ValueError, match="residual.shape must equal input.shape"):
        kiln.fused_add_rmsnorm(x, torch.empty((4, 65), dtype=x.dtype, device=device), w)


@pytest.mark.gpu
def test_mixed_devices_are_rejected():
    x = randn((4, 64), torch.float16, "cuda")
    with pytest.raises(ValueError, match="weight is on cpu but input is on cuda:0"):
        kiln.rmsnorm(x, randn((64,), torch.float16, "cpu"))


def test_binding_takes_any_dlpack_producer_and_rejects_non_tensors():
    """The launcher's typed views come from DLPack: capsules and __dlpack__ objects work, anything
    else is a TypeError naming the argument."""

    class FakeCuda:
        def __dlpack__(self, stream=None):
            raise BufferError("not exportable")

    x, w = randn((2, 8), torch.float32, "cpu"), randn((8,), torch.float32, "cpu")
    from kiln import _jit

    mod = _jit.module_for("//ops:norm", (("dtype", "f32"),), x.device)
    call = lambda out, input, weight: mod.rmsnorm(out=out, input=input, weight=weight, eps=1e-6,  # noqa: E731
                                                  weight_offset=0.0)
    with pytest.raises(BufferError):
        call(_jit.dl(x), _jit.dl(x), FakeCuda())
    with pytest.raises(TypeError, match="weight must be a tensor"):
        call(_jit.dl(x), _jit.dl(x), 3)
    used = _jit.dl(w)
    torch.from_dlpack(used)  # consumes the capsule
    with pytest.raises(TypeError, match="already consumed"):
        call(_jit.dl(x), _jit.dl(x), used)
    # Any __dlpack__ producer works, not only capsules: numpy arrays here.
    out = torch.empty_like(x)
    call(_jit.dl(out), x.numpy(), w.numpy())
    check(out, ref_rmsnorm(x, w, 1e-6))
    # By position (as kiln.rmsnorm passes them: keyword matching costs on every call) the same
    # result; a call missing an argument is pybind11's TypeError.
    by_position = torch.full_like(x, float("nan"))
    mod.rmsnorm(_jit.dl(by_position), _jit.dl(x), _jit.dl(w), 1e-6, 0.0)
    assert torch.equal(by_position, out)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mod.rmsnorm(_jit.dl(out), _jit.dl(x), _jit.dl(w), 1e-6)


# ---- framework integration --------------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x, r, w = (randn((8, 256), torch.bfloat16, device), randn((8, 256), torch.bfloat16, device),
               randn((256,), torch.bfloat16, device))

    def block(x, r, w):
        y = kiln.rmsnorm(x, w) * 2
        kiln.fused_add_rmsnorm(x, r, w)
        return y, x, r

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    y, xo, ro = compiled(x.clone(), r.clone(), w)
    ey, ex, er = block(x.clone(), r.clone(), w)
    torch.testing.assert_close(y, ey, rtol=0, atol=0)
    torch.testing.assert_close(xo, ex, rtol=0, atol=0)
    torch.testing.assert_close(ro, er, rtol=0, atol=0)


def test_custom_ops_are_registered_with_fake_implementations():
    kiln.load_api()  # the custom ops register when kiln.norm is imported (on first use otherwise)
    x, w = torch.empty((3, 8), device="meta"), torch.empty((8,), device="meta")
    out = torch.empty_like(x)
    torch.ops.kiln.rmsnorm(out, x, w, 1e-6, 0.0, False)  # fake impl: shape-only, no kernel
    torch.library.opcheck(torch.ops.kiln.rmsnorm.default,
                          (torch.randn(3, 8), torch.randn(3, 8), torch.randn(8), 1e-6, 0.0, False))
    torch.library.opcheck(torch.ops.kiln.fused_add_rmsnorm.default,
                          (torch.randn(3, 8), torch.randn(3, 8), torch.randn(8), 1e-6, 0.0, False))


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x, w = randn((64, 4096), torch.bfloat16, "cuda"), randn((4096,), torch.bfloat16, "cuda")
    r = randn((64, 4096), torch.bfloat16, "cuda")
    out = torch.empty_like(x)
    kiln.rmsnorm(x, w, out=out)  # load the module before capture
    xs, rs = x.clone(), r.clone()
    kiln.fused_add_rmsnorm(xs, rs, w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    xg, rg = x.clone(), r.clone()
    with torch.cuda.graph(g):
        kiln.rmsnorm(x, w, out=out)
        kiln.fused_add_rmsnorm(xg, rg, w)
    out.fill_(float("nan"))
    xg.copy_(x)
    rg.copy_(r)
    g.replay()
    torch.cuda.synchronize()
    check(out, ref_rmsnorm(x, w, 1e-6))
    assert torch.equal(xg, xs) and torch.equal(rg, rs)


@pytest.mark.gpu
def test_runs_on_the_callers_stream():
    x, w = randn((512, 4096), torch.bfloat16, "cuda"), randn((4096,), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = kiln.rmsnorm(x, w)
    s.synchronize()
    check(out, ref_rmsnorm(x, w, 1e-6))


# ---- programmatic dependent launch (enable_pdl) -------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_enable_pdl_is_accepted_and_changes_nothing(device):
    """FlashInfer's enable_pdl: None, True and False give the same bits (there is no PDL on the CPU
    or below sm90, and with it a kernel still reads what the one before it wrote); anything but a
    bool or None is a TypeError."""
    x, w = randn((64, 4096), torch.bfloat16, device), randn((4096,), torch.bfloat16, device)
    r = randn((64, 4096), torch.bfloat16, device)
    results = []
    for pdl in (None, True, False):
        xs, rs = x.clone(), r.clone()
        y = kiln.rmsnorm(x, w, enable_pdl=pdl)
        g = kiln.gemma_rmsnorm(x, w, out=torch.empty_like(x), enable_pdl=pdl)
        kiln.fused_add_rmsnorm(xs, rs, w, 1e-5, pdl)
        kiln.gemma_fused_add_rmsnorm(xs, rs, w, enable_pdl=pdl)
        results.append((y, g, xs, rs))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got int"):
        kiln.rmsnorm(x, w, enable_pdl=1)


@pytest.mark.gpu
def test_pdl_chain_of_dependent_launches():
    """A chain where each launch reads what the previous one wrote, launched with PDL (sm90+; on
    older GPUs the flag is ignored), eagerly and in a CUDA graph: the same bits as ordinary
    launches. A kernel that touched memory before griddepcontrol.wait would read stale rows."""
    torch.manual_seed(0)
    x, w = randn((4096, 4096), torch.bfloat16, "cuda"), randn((4096,), torch.bfloat16, "cuda")
    r = randn((4096, 4096), torch.bfloat16, "cuda")

    def chain(pdl, x, r):
        x, r = x.clone(), r.clone()
        for _ in range(4):
            y = kiln.rmsnorm(x, w, enable_pdl=pdl)
            kiln.fused_add_rmsnorm(y, r, w, enable_pdl=pdl)
            x = kiln.gemma_rmsnorm(y, w, out=torch.empty_like(y), enable_pdl=pdl)
            kiln.gemma_fused_add_rmsnorm(x, r, w, enable_pdl=pdl)
        return x, r

    expected = chain(False, x, r)
    eager = chain(True, x, r)
    assert torch.equal(eager[0], expected[0]) and torch.equal(eager[1], expected[1])
    xg, rg = x.clone(), r.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True, xg, rg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])
