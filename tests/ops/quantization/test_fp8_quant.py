"""kiln.per_token_group_quant_fp8 and kiln.scaled_fp8_quant bit for bit against a torch evaluation
of the same formula (scale = absmax / 448 in float32, x / scale rounded to nearest even and
saturated at +-448 by torch's own E4M3 conversion), on the host backend always and on CUDA where a
device is present: every input dtype, group sizes, row- and column-major scales, strided rows,
all-zero groups, values at the rounding ties and past the saturation point, static and dynamic
scales, the host encoder against torch's over every float16 value, bad inputs, torch.compile and
CUDA graphs."""

from __future__ import annotations

import re
import subprocess

import numpy
import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.codegen.dispatch import specialisation
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import compile_spec
from kiln.runtime.toolchain import available, nvcc
from kiln.trace.quantization import group_quant_reference_fp8, quantize_e4m3, tensor_quant_reference_fp8

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def bits(t):
    return t.view(torch.uint8)


def assert_bit_exact(q, ref):
    assert q.dtype == torch.float8_e4m3fn
    assert torch.equal(bits(q).cpu(), bits(ref).cpu()), (
        f"{int((bits(q).cpu() != bits(ref).cpu()).sum())} of {q.numel()} fp8 values differ from the reference"
    )


def randn(shape, dtype, device, gen=None, scale=4.0):
    return (scale * torch.randn(shape, dtype=torch.float32, generator=gen)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    "shape,group_size",
    [
        ((1, 128), 128),
        ((7, 4096), 128),
        ((33, 384), 64),
        ((5, 96), 32),
        ((3, 2, 256), 128),
        ((4, 30), 3),
        ((2, 7168), 128),
    ],
)
@pytest.mark.parametrize("column_major", [False, True])
def test_group_quant_is_bit_exact(device, dtype, shape, group_size, column_major):
    if column_major and len(shape) != 2:
        pytest.skip("column-major scales are 2-D")
    x = randn(shape, dtype, device)
    q, s = kiln.per_token_group_quant_fp8(x, group_size=group_size, column_major_scales=column_major)
    eq, es = group_quant_reference_fp8(x, group_size)
    assert_bit_exact(q, eq)
    assert torch.equal(s.cpu(), es.cpu()), "scales must be exactly absmax / 448"
    assert s.shape == (*shape[:-1], shape[-1] // group_size)
    if column_major:
        assert s.stride() == (1, shape[0])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    "shape", [(1, 1), (3, 17), (64, 4096), (2, 3, 640)], ids=lambda s: "x".join(map(str, s))
)
def test_scaled_quant_dynamic_and_static(device, dtype, shape):
    x = randn(shape, dtype, device)
    q, s = kiln.scaled_fp8_quant(x)
    eq, es = tensor_quant_reference_fp8(x)
    assert torch.equal(s.cpu(), es.cpu()) and s.shape == (1,)
    assert_bit_exact(q, eq)
    static = torch.tensor([0.0123], device=device)  # values past 448 * scale saturate
    q2, s2 = kiln.scaled_fp8_quant(x, static)
    assert s2 is static
    assert_bit_exact(q2, tensor_quant_reference_fp8(x, static)[0])


@pytest.mark.parametrize("device", device_params())
def test_zero_groups_saturation_and_ties(device):
    """An all-zero group has scale 0 and quantises to 0 (never NaN); values beyond 448 * scale
    saturate to +-448; values halfway between two E4M3 numbers round to the even one."""
    x = torch.zeros((3, 256), device=device)
    x[1, :128] = torch.linspace(-3, 3, 128)
    # Row 2: absmax 448, so scale 1; E4M3 steps by 2 between 16 and 32, so 17 is a tie between 16
    # and 18 (the even mantissa: 16) and 19 one between 18 and 20 (20); 1.5 * 2^-9 is a tie between
    # the subnormals 2^-9 and 2^-8 (2^-8).
    x[2, 0] = 448.0
    x[2, 1:5] = torch.tensor([17.0, 19.0, -17.0, 0.0029296875])
    q, s = kiln.per_token_group_quant_fp8(x)
    assert s[0].eq(0).all() and s[1, 1] == 0 and s[2, 0] == 1.0
    assert bits(q)[0].eq(0).all() and not q.float().isnan().any()
    assert q[2, 1:5].float().tolist() == [16.0, 20.0, -16.0, 0.00390625]
    assert_bit_exact(q, group_quant_reference_fp8(x, 128)[0])
    # Saturation: a static scale far too small.
    q2, _ = kiln.scaled_fp8_quant(x, torch.tensor([1e-4], device=device))
    assert q2.float().abs().max() == 448.0 and not q2.float().isnan().any()
    q3, s3 = kiln.scaled_fp8_quant(torch.zeros((2, 8), device=device))
    assert s3.item() == 0.0 and bits(q3).eq(0).all()


@pytest.mark.parametrize("device", device_params())
def test_scales_are_divisions_not_reciprocal_products(device):
    """absmax / 448 is a division: for about half of all absmax values, absmax * float32(1 / 448)
    (what torch's CUDA kernel does for a tensor divided by a Python number) is one ulp away."""
    absmax = torch.linspace(1, 2, 4096)
    x = torch.zeros((4096, 128))
    x[:, 5] = absmax
    _, s = kiln.per_token_group_quant_fp8(x.to(device))
    division = absmax / torch.full_like(absmax, 448.0)
    assert torch.equal(s.cpu()[:, 0], division)
    assert not torch.equal(division, absmax * torch.tensor(1 / 448, dtype=torch.float32))


def test_host_encoder_matches_torch_over_every_float16_value():
    """Every finite float16 value (and so every rounding case of the E4M3 grid's range) divided by
    one: the host backend's encoder against torch's conversion."""
    every = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every[every.isfinite()].reshape(1, -1)
    q, _ = kiln.scaled_fp8_quant(finite, torch.tensor([1.0]))
    assert_bit_exact(q, quantize_e4m3(finite.float(), torch.tensor([1.0])))


@pytest.mark.parametrize("device", device_params())
def test_strided_rows_and_empty(device):
    base = randn((9, 1024 + 64), torch.bfloat16, device)
    x = base[:, 64:]
    q, s = kiln.per_token_group_quant_fp8(x)
    eq, es = group_quant_reference_fp8(x, 128)
    assert_bit_exact(q, eq)
    assert torch.equal(s.cpu(), es.cpu())
    q2, s2 = kiln.scaled_fp8_quant(base[:, 3:1003])
    assert_bit_exact(q2, tensor_quant_reference_fp8(base[:, 3:1003])[0])
    e, es = kiln.per_token_group_quant_fp8(torch.empty((0, 256), device=device))
    assert e.shape == (0, 256) and es.shape == (0, 2)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 12),
    groups=st.integers(1, 6),
    group_size=st.sampled_from([1, 8, 16, 64, 128, 136]),
    dtype=st.sampled_from(DTYPES),
    pad=st.integers(0, 9),
    mag=st.floats(1e-6, 1e4),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_host(rows, groups, group_size, dtype, pad, mag, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, groups * group_size + pad), dtype, "cpu", gen, scale=mag)[:, pad:]
    q, s = kiln.per_token_group_quant_fp8(x, group_size=group_size)
    eq, es = group_quant_reference_fp8(x, group_size)
    assert_bit_exact(q, eq)
    assert torch.equal(s, es)


@pytest.mark.gpu
@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(0, 300),
    groups=st.integers(1, 60),
    group_size=st.sampled_from([1, 8, 64, 128, 136]),
    dtype=st.sampled_from(DTYPES),
    pad=st.integers(0, 9),
    mag=st.floats(1e-6, 1e4),
    seed=st.integers(0, 2**31 - 1),
    dynamic=st.booleans(),
)
def test_property_cuda(rows, groups, group_size, dtype, pad, mag, seed, dynamic):
    gen = torch.Generator().manual_seed(seed)
    x = randn((rows, groups * group_size + pad), dtype, "cpu", gen, scale=mag)[:, pad:].cuda()
    q, s = kiln.per_token_group_quant_fp8(x, group_size=group_size)
    eq, es = group_quant_reference_fp8(x, group_size)
    assert_bit_exact(q, eq)
    assert torch.equal(s.cpu(), es.cpu())
    q2, s2 = kiln.scaled_fp8_quant(x, None if dynamic else torch.tensor([mag / 100], device="cuda"))
    assert_bit_exact(q2, tensor_quant_reference_fp8(x, None if dynamic else s2)[0])


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x = randn((4, 256), torch.bfloat16, device)
    with pytest.raises(ValueError, match=r"group_size must be > 0 and divide x.shape\[-1\] \(256\), got 100"):
        kiln.per_token_group_quant_fp8(x, group_size=100)
    with pytest.raises(ValueError, match=r"column_major_scales needs a 2-D x, got shape \[2, 2, 256\]"):
        kiln.per_token_group_quant_fp8(x.reshape(2, 2, 256), column_major_scales=True)
    with pytest.raises(
        TypeError, match="x.dtype float64 is not supported; supported dtypes: float32, float16, bfloat16"
    ):
        kiln.scaled_fp8_quant(x.double())
    with pytest.raises(
        TypeError, match=r"scale.dtype must be float32 \(the scale is float32\), got bfloat16"
    ):
        kiln.scaled_fp8_quant(x, torch.ones(1, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match=r"scale must hold one element, got shape \[2\]"):
        kiln.scaled_fp8_quant(x, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="input must be contiguous in its last dimension"):
        kiln.scaled_fp8_quant(x.t())
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        kiln.scaled_fp8_quant([1.0])


@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x = randn((8, 256), torch.bfloat16, device)

    def fn(x):
        q, s = kiln.per_token_group_quant_fp8(x)
        q2, s2 = kiln.scaled_fp8_quant(x)
        return q.float() * s.repeat_interleave(128, -1), q2.float() * s2

    backend = "inductor" if device == "cuda" else "aot_eager"
    got, want = torch.compile(fn, fullgraph=True, backend=backend)(x), fn(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_custom_ops_are_registered_with_fake_implementations():
    # opcheck's schema test multiplies outputs, which torch does not implement for float8: the
    # fake-tensor test checks what torch.compile needs.
    checks = ("test_faketensor",)
    x = torch.randn(3, 256)
    out = torch.empty((3, 256), dtype=torch.float8_e4m3fn)
    torch.library.opcheck(
        torch.ops.kiln.per_token_group_quant_fp8.default, (out, torch.empty(3, 2), x, 128), test_utils=checks
    )
    torch.library.opcheck(
        torch.ops.kiln.scaled_fp8_quant_dynamic.default, (out, torch.empty(1), x), test_utils=checks
    )
    torch.library.opcheck(
        torch.ops.kiln.scaled_fp8_quant_static.default, (out, torch.ones(1), x), test_utils=checks
    )


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x = randn((64, 4096), torch.bfloat16, "cuda")
    kiln.scaled_fp8_quant(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, s = kiln.scaled_fp8_quant(x)
        gq, gs = kiln.per_token_group_quant_fp8(x)
    x.mul_(2)  # the replay must see the new values, dynamic scale included
    g.replay()
    torch.cuda.synchronize()
    eq, es = tensor_quant_reference_fp8(x)
    assert torch.equal(s.cpu(), es.cpu())
    assert_bit_exact(q, eq)
    assert_bit_exact(gq, group_quant_reference_fp8(x, 128)[0])


# ---- the scales are IEEE divisions on the device too -------------------------------------------


def host_float32_formula(x, group_size=None):
    """(x_q, scales) from numpy's float32 arithmetic (IEEE, no torch kernel involved): scale =
    absmax / 448 rounded to nearest, x_q = e4m3(x / scale) from that scale (0 where it is 0)."""
    v = x.float().cpu().numpy().astype(numpy.float32)
    g = v.reshape(*v.shape[:-1], -1, group_size) if group_size else v.reshape(1, -1)
    scale = numpy.abs(g).max(axis=-1, keepdims=True) / numpy.float32(448.0)
    assert scale.dtype == numpy.float32
    with numpy.errstate(divide="ignore", invalid="ignore"):
        q = numpy.where(scale == 0, numpy.float32(0), g / scale).astype(numpy.float32)
    q = torch.from_numpy(numpy.clip(q, -448, 448)).to(torch.float8_e4m3fn).reshape(v.shape)
    if group_size:
        s = torch.from_numpy(scale.squeeze(-1)).reshape(*v.shape[:-1], -1)
    else:
        s = torch.from_numpy(scale[0])
    return q, s


# The shapes of the report (1 x 128 bf16 per group of 128; 333 x 1000 f16 dynamic), magnitudes that
# put absmax in every binade of the scales' range, and the report's own absmax 14.0703125, whose
# quotient by 448 is 0.0314069464802742 while the reciprocal product gives 0.0314069502055645.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape,group_size", [((1, 128), 128), ((333, 1000), None), ((333, 1024), 128),
                                              ((7, 7168), 128), ((64, 4096), None), ((5, 96), 32)])
@pytest.mark.parametrize("mag", [0.01, 1.0, 8.0, 300.0])
def test_cuda_scales_equal_the_float32_division(dtype, shape, group_size, mag):
    x = randn(shape, dtype, "cpu", torch.Generator().manual_seed(hash((shape, mag)) % 2**31), scale=mag)
    x[0, 0] = 14.0703125  # an absmax whose reciprocal product is one ulp off
    want_q, want_s = host_float32_formula(x, group_size)
    if group_size:
        q, s = kiln.per_token_group_quant_fp8(x.cuda(), group_size=group_size)
    else:
        q, s = kiln.scaled_fp8_quant(x.cuda())
    assert torch.equal(s.cpu(), want_s), "the scales must be absmax / 448, the float32 division"
    assert_bit_exact(q, want_q)


def test_the_report_values_are_the_division_and_the_reciprocal_product():
    """0.0314069464802742 (kiln's scale for absmax 14.0703125) is 14.0703125 / 448 rounded to
    nearest; 0.0314069502055645 is 14.0703125 * float32(1 / 448), what torch's CUDA kernel computes
    for `tensor / 448` (a Python number): an expected value computed that way is one ulp off."""
    a = numpy.float32(14.0703125)
    assert float(a / numpy.float32(448)) == 0.031406946480274200439453125
    assert float(a * (numpy.float32(1) / numpy.float32(448))) == 0.031406950205564498901367188
    _, s = kiln.scaled_fp8_quant(torch.tensor([[14.0703125, -3.0]], dtype=torch.float16))
    assert s.item() == 0.031406946480274200439453125


# Every float32 division the quantisation kernels do must be the IEEE one (PTX div.rn.f32): never
# div.approx / div.full (what -use_fast_math or -prec-div=false would give) or a reciprocal.
@pytest.mark.skipif(not available("cuda"), reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_the_kernels_divide_with_div_rn(tmp_path, dtype):
    graph = load_graph()
    spec = compile_spec(specialisation(graph.target("//ops:quantization"), {"dtype": dtype}), "cuda", graph)
    spec.generate(tmp_path)
    includes = [f"-I{tmp_path}", *(f"-I{d}" for d in spec.include_dirs)]
    for arch in ("sm_80", "sm_90"):
        ptx = tmp_path / f"q_{arch}.ptx"
        unit = str(tmp_path / "quantization_cuda.cu")
        command = [nvcc().path, *spec.cuda_flags, f"-arch={arch}", "-ptx", *includes, unit, "-o", str(ptx)]
        subprocess.run(command, check=True, capture_output=True)
        ops = re.findall(r"\b((?:div|rcp)\.[a-z0-9.]*f32)\b", ptx.read_text())
        assert ops and set(ops) == {"div.rn.f32"}, f"{arch}: float32 divisions {sorted(set(ops))}"
