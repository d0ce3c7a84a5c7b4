"""kiln.silu_and_mul, gelu_and_mul and gelu_tanh_and_mul against a float64 reference, on the host
backend always and on CUDA where a device is present: every dtype, odd d (the scalar path) and
vector-width d, 1-D to 3-D inputs, strided rows, out=, poisoned outputs, a property test, bad
inputs, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace.activation import act_and_mul_float64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One rounding at the output after float32 arithmetic: half an ulp relative (2^-24, 2^-11, 2^-8),
# plus expf/erff/tanhf's few ulps; atol covers the cancellation in 1 + erf(x) for very negative x.
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
APIS = {"silu": kiln.silu_and_mul, "gelu": kiln.gelu_and_mul, "gelu_tanh": kiln.gelu_tanh_and_mul}


def check(out, ref):
    assert out.isfinite().all(), "unwritten (poisoned) or non-finite elements in the output"
    rtol, atol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


def randn(shape, dtype, device, gen=None, scale=3.0):
    # Scale 3: the activations' tails (|x| up to ~12) are exercised, not only the linear middle.
    return (scale * torch.randn(shape, dtype=torch.float32, generator=gen)).to(device=device, dtype=dtype)


def poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


SHAPES = [(1, 2), (1, 14), (3, 22), (7, 256), (5, 4098), (33, 1000), (2, 28672), (1, 16386), (65, 130)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("act", list(APIS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(device, dtype, act, shape):
    x = randn(shape, dtype, device)
    out = poisoned((shape[0], shape[1] // 2), dtype, device)
    assert APIS[act](x, out=out) is out
    check(out, act_and_mul_float64(x, act))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("act", list(APIS))
def test_leading_dimensions_and_strided_rows(device, act):
    dtype = torch.bfloat16
    x3 = randn((3, 5, 1024), dtype, device)
    check(APIS[act](x3), act_and_mul_float64(x3, act))
    x1 = randn((96,), dtype, device)
    assert APIS[act](x1).shape == (48,)
    check(APIS[act](x1), act_and_mul_float64(x1, act))
    # A strided view (the gate/up columns of a wider tensor) and a strided out= inside a poisoned
    # buffer: nothing outside the view is written.
    base = randn((9, 3000), dtype, device)
    x = base[:, 100:2148]  # row stride 3000, unaligned start
    big = poisoned((9, 2000), dtype, device)
    out = big[:, 500:1524]
    APIS[act](x, out=out)
    check(out, act_and_mul_float64(x, act))
    assert big[:, :500].isnan().all() and big[:, 1524:].isnan().all()
    # Leading dimensions that fold into one row stride (every other row) work; a prefix of the
    # middle dimension does not fold.
    x4 = randn((2, 6, 512), dtype, device)[:, ::2]
    check(APIS[act](x4), act_and_mul_float64(x4, act))
    with pytest.raises(ValueError, match="input's leading dimensions must fold into one row stride"):
        APIS[act](randn((2, 6, 512), dtype, device)[:, :3])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("offset", [1, 2, 3, 4, 8])
def test_every_vector_width_by_alignment(device, offset):
    base = randn((16, 2048 + 8), torch.float16, device)
    x = base[:, offset:offset + 2048]
    check(kiln.silu_and_mul(x), act_and_mul_float64(x, "silu"))


@pytest.mark.parametrize("device", device_params())
def test_empty(device):
    x = torch.empty((0, 64), dtype=torch.float16, device=device)
    assert kiln.silu_and_mul(x).shape == (0, 32)
    assert kiln.gelu_and_mul(torch.empty((4, 0), dtype=torch.float16, device=device)).shape == (4, 0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 20), d=st.integers(1, 700), dtype=st.sampled_from(DTYPES),
       act=st.sampled_from(list(APIS)), pad=st.integers(0, 9), seed=st.integers(0, 2**31 - 1))
def test_property_host(rows, d, dtype, act, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, 2 * d + pad), dtype, "cpu", gen)[:, pad:]
    out = APIS[act](x)
    if out.numel():
        check(out, act_and_mul_float64(x, act))


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 300), d=st.integers(1, 9000), dtype=st.sampled_from(DTYPES),
       act=st.sampled_from(list(APIS)), pad=st.integers(0, 9), seed=st.integers(0, 2**31 - 1))
def test_property_cuda(rows, d, dtype, act, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, 2 * d + pad), dtype, "cpu", gen)[:, pad:].to("cuda")
    out = APIS[act](x)
    if out.numel():
        check(out, act_and_mul_float64(x, act))


@pytest.mark.slow
@pytest.mark.gpu
def test_large_cuda():
    x = randn((8192, 2 * 14336), torch.bfloat16, "cuda")
    out = poisoned((8192, 14336), torch.bfloat16, "cuda")
    kiln.silu_and_mul(x, out=out)
    check(out, act_and_mul_float64(x, "silu"))


# ---- bad inputs: every check names the argument, and nothing is launched --------------------

@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x = randn((4, 64), torch.float16, device)
    with pytest.raises(ValueError, match=r"input.shape\[-1\] must be even \(2 \* d\), got shape \[4, 63\]"):
        kiln.silu_and_mul(x[:, :63])
    with pytest.raises(TypeError, match="input.dtype float64 is not supported; supported dtypes: "
                                        "float32, float16, bfloat16"):
        kiln.silu_and_mul(x.double())
    with pytest.raises(ValueError, match=r"out.shape must be \[4, 32\] .*got \[4, 64\]"):
        kiln.gelu_and_mul(x, out=torch.empty((4, 64), dtype=x.dtype, device=device))
    with pytest.raises(TypeError, match="out.dtype must be float16"):
        kiln.gelu_tanh_and_mul(x, out=torch.empty((4, 32), dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="input must be contiguous in its last dimension"):
        kiln.silu_and_mul(randn((64, 4), torch.float16, device).t())
    with pytest.raises(ValueError, match="out and input overlap in memory"):
        kiln.silu_and_mul(x, out=x[:, :32])
    with pytest.raises(ValueError, match="out has overlapping elements"):
        kiln.silu_and_mul(x, out=torch.empty((1, 32), dtype=x.dtype, device=device).expand(4, 32))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        kiln.silu_and_mul([1.0, 2.0])


@pytest.mark.gpu
def test_mixed_devices_are_rejected():
    x = randn((4, 64), torch.float16, "cuda")
    with pytest.raises(ValueError, match="out is on cpu but input is on cuda:0"):
        kiln.silu_and_mul(x, out=torch.empty((4, 32), dtype=x.dtype))


# ---- framework integration --------------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x = randn((8, 512), torch.bfloat16, device)

    def mlp(x):
        return kiln.silu_and_mul(x) * 2 + kiln.gelu_and_mul(x) + kiln.gelu_tanh_and_mul(x)

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(mlp, fullgraph=True, backend=backend)
    if backend == "aot_eager":  # the same ops in the same order: bit for bit
        torch.testing.assert_close(compiled(x), mlp(x), rtol=0, atol=0)
    else:  # inductor fuses the additions around kiln's ops in float32 and rounds once to bf16
        torch.testing.assert_close(compiled(x).float(), mlp(x).float(), rtol=1.6e-2, atol=2e-2)


def test_custom_op_is_registered_with_a_fake_implementation():
    x = torch.empty((3, 8), device="meta")
    torch.ops.kiln.act_and_mul(torch.empty((3, 4), device="meta"), x, "silu", False)
    torch.library.opcheck(torch.ops.kiln.act_and_mul.default,
                          (torch.randn(3, 4), torch.randn(3, 8), "gelu", False))


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x = randn((64, 2 * 4096), torch.bfloat16, "cuda")
    out = torch.empty((64, 4096), dtype=torch.bfloat16, device="cuda")
    kiln.silu_and_mul(x, out=out)  # load the module before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kiln.silu_and_mul(x, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, act_and_mul_float64(x, "silu"))


# ---- programmatic dependent launch (enable_pdl) -------------------------------------------------

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("act", list(APIS))
def test_enable_pdl_is_accepted_and_changes_nothing(device, act):
    """FlashInfer's enable_pdl: None, True and False give the same bits; anything but a bool or
    None is a TypeError."""
    x = randn((16, 2 * 1000), torch.bfloat16, device)
    outs = [APIS[act](x, enable_pdl=pdl) for pdl in (None, True, False)]
    outs.append(APIS[act](x, poisoned((16, 1000), torch.bfloat16, device), True))  # positional
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got str"):
        APIS[act](x, enable_pdl="no")


@pytest.mark.gpu
def test_pdl_chain_of_dependent_launches():
    """Each launch reads the previous one's output, with PDL (sm90+; ignored below), eagerly and in
    a CUDA graph: the same bits as ordinary launches (a kernel reading before griddepcontrol.wait
    would see stale or poisoned values)."""
    x = randn((8, 2 * 14336), torch.bfloat16, "cuda", scale=1.0)

    def chain(pdl, outs):
        y1 = kiln.silu_and_mul(x, out=outs[0], enable_pdl=pdl)
        y2 = kiln.gelu_and_mul(y1, out=outs[1], enable_pdl=pdl)
        return y1, y2, kiln.gelu_tanh_and_mul(y2, out=outs[2], enable_pdl=pdl)

    def poisoned_outs():
        return [poisoned((8, 14336 >> k), torch.bfloat16, "cuda") for k in range(3)]

    expected = chain(False, poisoned_outs())
    eager = chain(True, poisoned_outs())
    assert all(torch.equal(a, b) for a, b in zip(eager, expected, strict=True))
    outs = poisoned_outs()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(True, outs)
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(outs, expected, strict=True))
