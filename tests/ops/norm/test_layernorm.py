"""kiln.layernorm against a float64 reference, on the host backend always and on CUDA where a
device is present: every input dtype with float32 gemma/beta, odd and large rows (the
register-resident and the three-pass kernels), 2-D and 3-D, strided rows, rows with a large mean
(a one-pass E[x^2] - mean^2 would cancel), poisoned outputs, a property test, bad inputs,
torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace.norm import layer_norm_float64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# As RMSNorm's: one rounding at the output after float32 accumulation, plus accumulation order.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def check(out, ref):
    assert out.isfinite().all(), "non-finite elements in the output"
    rtol, atol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref.to(out.device), rtol=rtol, atol=atol)


def randn(shape, dtype, device, gen=None, mean=0.0):
    return (torch.randn(shape, dtype=torch.float32, generator=gen) + mean).to(device=device, dtype=dtype)


def params(hidden, device, gen=None):
    return randn((hidden,), torch.float32, device, gen), randn((hidden,), torch.float32, device, gen)


SHAPES = [
    (1, 1),
    (1, 7),
    (3, 4095),
    (7, 4096),
    (33, 5120),
    (2, 8191),
    (1, 40000),
    (3, 70000),
    (300, 128),
    (17, 3),
]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_layernorm_matches_reference(device, dtype, shape):
    x = randn(shape, dtype, device, mean=2.0)
    g, b = params(shape[-1], device)
    check(kiln.layernorm(x, g, b, eps=1e-5), layer_norm_float64(x, g, b, 1e-5))


@pytest.mark.parametrize("device", device_params())
def test_large_mean_does_not_cancel(device):
    # Mean 100: a one-pass E[x^2] - mean^2 would lose ~1e-3 of the variance in float32 (x^2 ~ 1e4),
    # ~5e-4 of every output. A correct float32 kernel still carries x - mean's rounding (x's spacing
    # at 100 is 7.6e-6) times gemma: 1e-4 absolute allows that and catches the cancellation.
    x = randn((8, 4096), torch.float32, device, mean=100.0)
    g, b = params(4096, device)
    out, ref = kiln.layernorm(x, g, b), layer_norm_float64(x, g, b, 1e-6)
    assert out.isfinite().all(), "non-finite elements in the output"
    torch.testing.assert_close(out.double(), ref.to(out.device), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("device", device_params())
def test_three_d_and_strided_rows(device):
    base = randn((4, 9, 6000), torch.bfloat16, device)
    x = base[:, 1:8, 100:4196]
    g, b = params(4096, device)
    out = kiln.layernorm(x, g, b)
    assert out.shape == x.shape
    check(out, layer_norm_float64(x, g, b, 1e-6))
    x2 = base[1, :, 3:4099]  # 2-D, unaligned start: narrow vectors
    check(kiln.layernorm(x2, g, b), layer_norm_float64(x2, g, b, 1e-6))


@pytest.mark.parametrize("device", device_params())
def test_empty(device):
    g, b = params(64, device)
    assert kiln.layernorm(torch.empty((0, 64), dtype=torch.float16, device=device), g, b).shape == (0, 64)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 20),
    hidden=st.integers(1, 3000),
    three_d=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    pad=st.integers(0, 9),
    eps=st.floats(1e-8, 1e-2),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_host(rows, hidden, three_d, dtype, pad, eps, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (2, rows, hidden + pad) if three_d else (rows, hidden + pad)
    x = randn(shape, dtype, "cpu", gen)[..., pad:]
    g, b = params(hidden, "cpu", gen)
    out = kiln.layernorm(x, g, b, eps=eps)
    if out.numel():
        check(out, layer_norm_float64(x, g, b, eps))


@pytest.mark.gpu
@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(0, 300),
    hidden=st.integers(1, 40000),
    dtype=st.sampled_from(DTYPES),
    pad=st.integers(0, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_cuda(rows, hidden, dtype, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, hidden + pad), dtype, "cpu", gen)[:, pad:].cuda()
    g, b = params(hidden, "cuda", gen)
    out = kiln.layernorm(x, g, b)
    if rows:
        check(out, layer_norm_float64(x, g, b, 1e-6))


@pytest.mark.slow
@pytest.mark.gpu
def test_large_cuda():
    x = randn((16384, 8192), torch.bfloat16, "cuda")
    g, b = params(8192, "cuda")
    check(kiln.layernorm(x, g, b), layer_norm_float64(x, g, b, 1e-6))


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x = randn((4, 64), torch.bfloat16, device)
    g, b = params(64, device)
    with pytest.raises(
        TypeError,
        match=r"gemma.dtype must be float32 \(LayerNorm's parameters are float32\), "
        "got bfloat16",
    ):
        kiln.layernorm(x, g.bfloat16(), b)
    with pytest.raises(ValueError, match=r"beta.shape\[0\] must equal input.shape\[-1\] \(64\), got 63"):
        kiln.layernorm(x, g, b[:63])
    with pytest.raises(TypeError, match="input.dtype float64 is not supported"):
        kiln.layernorm(x.double(), g, b)
    with pytest.raises(ValueError, match="input must have 2 or 3 dimensions"):
        kiln.layernorm(x.flatten(), g, b)
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        kiln.layernorm(x, g, b, eps=-1.0)
    with pytest.raises(TypeError, match="gemma must be a torch.Tensor"):
        kiln.layernorm(x, None, b)


@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x = randn((8, 256), torch.bfloat16, device)
    g, b = params(256, device)
    backend = "inductor" if device == "cuda" else "aot_eager"
    fn = torch.compile(lambda x: kiln.layernorm(x, g, b) * 2, fullgraph=True, backend=backend)
    torch.testing.assert_close(fn(x), kiln.layernorm(x, g, b) * 2, rtol=0, atol=0)


def test_custom_op_is_registered_with_a_fake_implementation():
    torch.library.opcheck(
        torch.ops.kiln.layernorm.default,
        (torch.randn(3, 8), torch.randn(3, 8), torch.randn(8), torch.randn(8), 1e-6),
    )


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x = randn((64, 4096), torch.bfloat16, "cuda")
    g, b = params(4096, "cuda")
    kiln.layernorm(x, g, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kiln.layernorm(x, g, b)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, layer_norm_float64(x, g, b, 1e-6))
