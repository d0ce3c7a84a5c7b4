"""kiln.rmsnorm_quant, fused_add_rmsnorm_quant and layernorm_quant against a float64 reference
rounded to fp8, on the host backend always and on CUDA where a device is present: every input
dtype, both fp8 formats, odd and large rows (register-resident and multi-pass kernels), 2-D and
3-D, strided rows and outputs, every vector width, saturation and NaN, the scale as a tensor (0-d,
(1,), converted) or a number, enable_pdl, bad inputs, torch.compile, the custom ops and CUDA
graphs (which replay whatever the scale tensor holds)."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params

import kiln
from kiln.trace.norm import fp8_of, layer_norm_float64, rms_norm_float64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
# The kernels compute in float32, the reference in float64; both round once to fp8. A value within
# ~1e-6 relative of a rounding midpoint may land one fp8 step away, nothing more: one step is at
# most 2^-3 (E4M3, three mantissa bits) or 2^-2 (E5M2) of the value, 2^-9 or 2^-16 among the
# subnormals. Such values are rare (the fraction of exact matches is checked too).
STEP = {torch.float8_e4m3fn: (0.125, 2.0**-9), torch.float8_e5m2: (0.25, 2.0**-16)}
# Scales that put the largest outputs (|y| ~ 15 with standard-normal inputs and weights) past each
# format's largest finite value, so every case saturates some elements.
SCALE = {torch.float8_e4m3fn: 1.0 / 32, torch.float8_e5m2: 1.0 / 4096}


def randn(shape, dtype, device, gen=None):
    return torch.randn(shape, dtype=torch.float32, generator=gen).to(device=device, dtype=dtype)


def check_fp8(out: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor | None = None):
    """`out` (fp8) equals the reference rounded to fp8 (`ref`, decoded to float32) up to one fp8
    step at rounding midpoints; NaN exactly where the reference has NaN. `slack` (per element, in
    out's units): the float32 evaluation error the value before rounding may carry on top, where it
    is a cancelling sum (LayerNorm's normalised * gemma + beta near zero, scaled by 1 / scale)."""
    got, ref = out.float().cpu(), ref.float().cpu()
    assert torch.equal(got.isnan(), ref.isnan()), "NaN where the reference has none, or the reverse"
    ok = ~ref.isnan()
    rtol, atol = STEP[out.dtype]
    if slack is None:
        torch.testing.assert_close(got[ok], ref[ok], rtol=rtol, atol=atol)
    else:
        slack = slack.float().cpu()[ok]
        err, bound = (got[ok] - ref[ok]).abs(), atol + rtol * (ref[ok].abs() + slack) + slack
        assert (err <= bound).all(), f"{int((err > bound).sum())} elements beyond one step and the slack"
    if ok.sum() >= 100:
        assert (got[ok] == ref[ok]).float().mean() > 0.99, "more than rare one-step differences"


def fp8_out(shape, fmt, device):
    """An output full of NaN (E4M3's 0x7f, E5M2's 0x7f): an element never written shows."""
    return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(fmt)


SHAPES = [(1, 1), (1, 7), (3, 4095), (7, 4096), (33, 5120), (2, 8191), (1, 40000), (4, 65536),
          (300, 128), (17, 3), (3, 7, 1000)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d).removeprefix("torch.float8_"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rmsnorm_quant_matches_reference(device, dtype, fmt, shape):
    x, w = randn(shape, dtype, device), randn(shape[-1:], dtype, device)
    out = fp8_out(shape, fmt, device)
    scale = torch.tensor([SCALE[fmt]], device=device)
    assert kiln.rmsnorm_quant(out, x, w, scale, eps=1e-6) is None
    check_fp8(out, fp8_of(rms_norm_float64(x, w, 1e-6), scale, fmt))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d).removeprefix("torch.float8_"))
@pytest.mark.parametrize("shape", [(5, 4096), (130, 2048), (3, 7, 1000), (2, 40000), (9, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fused_add_rmsnorm_quant(device, dtype, fmt, shape):
    x, r, w = randn(shape, dtype, device), randn(shape, dtype, device), randn(shape[-1:], dtype, device)
    x0, r0 = x.clone(), r.clone()
    out = fp8_out(shape, fmt, device)
    scale = torch.tensor(SCALE[fmt], device=device)  # 0-d
    kiln.fused_add_rmsnorm_quant(out, x, r, w, scale, 1e-5)
    summed = (x0.float() + r0.float()).to(dtype)
    assert torch.equal(r, summed), "residual must be exactly (input + residual) rounded to dtype"
    assert torch.equal(x, x0), "the input is left as it is"
    check_fp8(out, fp8_of(rms_norm_float64(summed, w, 1e-5), scale, fmt))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d).removeprefix("torch.float8_"))
@pytest.mark.parametrize("shape", [(1, 7), (7, 4096), (33, 5120), (3, 70000), (300, 128), (2, 5, 129)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layernorm_quant_matches_reference(device, dtype, fmt, shape):
    x = (randn(shape, dtype, device).float() + 2.0).to(dtype)  # a mean to take away
    g, b = randn(shape[-1:], torch.float32, device), randn(shape[-1:], torch.float32, device)
    out = fp8_out(shape, fmt, device)
    kiln.layernorm_quant(out, x, g, b, torch.tensor([SCALE[fmt]], device=device), 1e-5)
    # float32 evaluates normalised * gemma + beta to a few ulps of its terms; 1 / scale (4096 for
    # E5M2) magnifies that where the sum cancels to near zero: 8 ulps of the terms, in out's units
    normalised = layer_norm_float64(x, torch.ones_like(g), torch.zeros_like(b), 1e-5)
    terms = (normalised * g.double().to(normalised.device)).abs() + b.double().to(normalised.device).abs()
    slack = 8 * 2.0**-24 * terms / SCALE[fmt]
    check_fp8(out, fp8_of(layer_norm_float64(x, g, b, 1e-5), torch.tensor(SCALE[fmt]), fmt), slack)


@pytest.mark.parametrize("device", device_params())
def test_scale_forms_agree(device):
    """A (1,) and a 0-d float32 tensor, one of another dtype or on the CPU (converted, as FlashInfer
    does), and a Python float: the same bits."""
    x, w = randn((9, 1000), torch.bfloat16, device), randn((1000,), torch.bfloat16, device)
    outs = []
    for scale in (torch.tensor([0.05], device=device), torch.tensor(0.05, device=device),
                  torch.tensor([0.05], dtype=torch.float64, device=device), torch.tensor([0.05]), 0.05):
        out = fp8_out((9, 1000), torch.float8_e4m3fn, device)
        kiln.rmsnorm_quant(out, x, w, scale)
        outs.append(out.view(torch.uint8))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    check_fp8(outs[0].view(torch.float8_e4m3fn), fp8_of(rms_norm_float64(x, w, 1e-6), torch.tensor(0.05)))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d).removeprefix("torch.float8_"))
def test_saturation_and_nan(device, fmt):
    """Beyond the format's range the output saturates at its largest finite value (infinities too:
    the scale of 1e-30 takes every value there); NaN stays NaN, in its row only."""
    x, w = randn((4, 256), torch.float32, device), randn((256,), torch.float32, device)
    x[2, 17] = float("nan")
    out = fp8_out((4, 256), fmt, device)
    kiln.rmsnorm_quant(out, x, w, 1e-30)
    got, top = out.float().cpu(), torch.finfo(fmt).max
    assert got[2].isnan().all() and not got[[0, 1, 3]].isnan().any()
    sign = torch.sign(rms_norm_float64(x, w, 1e-6)[[0, 1, 3]]).float().cpu()
    assert torch.equal(got[[0, 1, 3]], sign * top)


@pytest.mark.parametrize("device", device_params())
def test_strided_rows_outputs_and_vector_widths(device):
    """Strided input rows and a strided fp8 out= (nothing written outside it); start offsets that
    allow each vector width."""
    base = randn((9, 6000), torch.bfloat16, device)
    w = randn((4096,), torch.bfloat16, device)
    big = fp8_out((9, 5000), torch.float8_e4m3fn, device)
    for offset in (0, 1, 2, 3, 4, 8):
        x, out = base[:, offset:offset + 4096], big[:, 500 + offset:4596 + offset]
        kiln.rmsnorm_quant(out, x, w, torch.tensor([1.0 / 32], device=device))
        check_fp8(out, fp8_of(rms_norm_float64(x, w, 1e-6), torch.tensor(1.0 / 32)))
    assert big[:, :500].float().isnan().all() and big[:, 4604:].float().isnan().all()


@pytest.mark.parametrize("device", device_params())
def test_empty(device):
    x = torch.empty((0, 64), dtype=torch.float16, device=device)
    out = torch.empty((0, 64), dtype=torch.float8_e4m3fn, device=device)
    w = randn((64,), torch.float16, device)
    kiln.rmsnorm_quant(out, x, w, 1.0)
    kiln.fused_add_rmsnorm_quant(out, x, torch.empty_like(x), w, 1.0)
    kiln.layernorm_quant(out, x, w.float(), w.float(), 1.0)


@pytest.mark.parametrize("device", device_params())
def test_enable_pdl_is_accepted_and_changes_nothing(device):
    """None, True and False give the same bits (on the CPU and below sm90 PDL does not exist); a
    value that is not a bool is a TypeError."""
    x, w = randn((64, 2048), torch.bfloat16, device), randn((2048,), torch.bfloat16, device)
    r = randn((64, 2048), torch.bfloat16, device)
    results = []
    for pdl in (None, True, False):
        out = fp8_out((64, 2048), torch.float8_e4m3fn, device)
        kiln.rmsnorm_quant(out, x, w, 0.05, enable_pdl=pdl)
        out2, r2 = fp8_out((64, 2048), torch.float8_e4m3fn, device), r.clone()
        kiln.fused_add_rmsnorm_quant(out2, x, r2, w, 0.05, enable_pdl=pdl)
        results.append((out.view(torch.uint8), out2.view(torch.uint8), r2))
    for a, b in zip(results[0], results[1], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(results[0], results[2], strict=True):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got str"):
        kiln.rmsnorm_quant(fp8_out((64, 2048), torch.float8_e4m3fn, device), x, w, 0.05, enable_pdl="yes")


# ---- bad inputs: every check names the argument, and nothing is launched --------------------

@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x, w = randn((4, 64), torch.bfloat16, device), randn((64,), torch.bfloat16, device)
    out = torch.empty((4, 64), dtype=torch.float8_e4m3fn, device=device)
    with pytest.raises(TypeError, match="out.dtype must be float8_e4m3fn or float8_e5m2 .*got bfloat16"):
        kiln.rmsnorm_quant(torch.empty_like(x), x, w, 1.0)
    with pytest.raises(ValueError, match=r"out.shape must equal input.shape \[4, 64\], got \[4, 32\]"):
        kiln.rmsnorm_quant(out[:, :32], x, w, 1.0)
    with pytest.raises(ValueError, match=r"scale must be a tensor of shape \(\) or \(1,\), got shape \[2\]"):
        kiln.rmsnorm_quant(out, x, w, torch.ones(2, device=device))
    with pytest.raises(TypeError, match="scale must be a tensor of one element or a number, got str"):
        kiln.rmsnorm_quant(out, x, w, "1.0")
    with pytest.raises(ValueError, match="scale must be finite and nonzero, got 0"):
        kiln.rmsnorm_quant(out, x, w, 0.0)
    with pytest.raises(ValueError, match="scale must be finite and nonzero, got inf"):
        kiln.layernorm_quant(out, x, w.float(), w.float(), float("inf"))
    with pytest.raises(ValueError, match=r"weight.shape\[0\] must equal input.shape\[-1\] \(64\), got 63"):
        kiln.rmsnorm_quant(out, x, w[:63], 1.0)
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        kiln.rmsnorm_quant(out, x, w, 1.0, eps=-1.0)
    with pytest.raises(TypeError, match="gemma.dtype must be float32"):
        kiln.layernorm_quant(out, x, w, w.float(), 1.0)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        kiln.rmsnorm_quant(None, x, w, 1.0)
    # out shares bytes with the input, or (fused) with the residual it writes.
    raw = torch.empty(4 * 64 * 2, dtype=torch.uint8, device=device)
    xs = raw.view(torch.bfloat16).view(4, 64)
    xs.copy_(x)
    with pytest.raises(ValueError, match="out and input overlap in memory"):
        kiln.rmsnorm_quant(raw[:256].view(torch.float8_e4m3fn).view(4, 64), xs, w, 1.0)
    with pytest.raises(ValueError, match="out and residual overlap in memory"):
        kiln.fused_add_rmsnorm_quant(raw[:256].view(torch.float8_e4m3fn).view(4, 64), x, xs, w, 1.0)
    with pytest.raises(ValueError, match="input and residual overlap in memory"):
        kiln.fused_add_rmsnorm_quant(out, x, x, w, 1.0)
    with pytest.raises(ValueError, match="out and scale overlap in memory"):
        kiln.rmsnorm_quant(out, x, w, out.view(torch.uint8)[0, :4].view(torch.float32))


@pytest.mark.gpu
def test_mixed_devices_are_rejected():
    x, w = randn((4, 64), torch.float16, "cuda"), randn((64,), torch.float16, "cuda")
    with pytest.raises(ValueError, match="out is on cpu but input is on cuda:0"):
        kiln.rmsnorm_quant(torch.empty((4, 64), dtype=torch.float8_e4m3fn), x, w, 1.0)


# ---- framework integration --------------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x, r, w = (randn((8, 256), torch.bfloat16, device), randn((8, 256), torch.bfloat16, device),
               randn((256,), torch.bfloat16, device))
    scale = torch.tensor([0.05], device=device)

    def block(x, r, w):
        a = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        b = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        c = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        kiln.rmsnorm_quant(a, x * 2, w, scale)
        kiln.fused_add_rmsnorm_quant(b, x, r, w, scale)
        kiln.layernorm_quant(c, x, w.float(), w.float(), 0.05)
        return a.view(torch.uint8), b.view(torch.uint8), c.view(torch.uint8), r

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    got = compiled(x, r.clone(), w)
    expected = block(x, r.clone(), w)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


# opcheck's test_schema compares the mutated arguments with arithmetic torch lacks for float8
# tensors ("mul_cpu_reduced_float" is not implemented for Float8_e4m3fn); the other checks run.
OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_custom_ops_are_registered_with_fake_implementations():
    kiln.load_api()  # the custom ops register when kiln.norm is imported (on first use otherwise)
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    out = torch.empty((3, 8), dtype=torch.float8_e4m3fn)
    s = torch.tensor([0.5])
    for op, args in ((torch.ops.kiln.rmsnorm_quant.default, (out, x, w, s, 1.0, 1e-6, False)),
                     (torch.ops.kiln.rmsnorm_quant.default, (out, x, w, None, 0.5, 1e-6, False)),
                     (torch.ops.kiln.fused_add_rmsnorm_quant.default, (out, x, r, w, s, 1.0, 1e-6, False)),
                     (torch.ops.kiln.layernorm_quant.default, (out, x, w, w, s, 1.0, 1e-6))):
        torch.library.opcheck(op, args, test_utils=OPCHECKS)
    meta = torch.empty((3, 8), device="meta")
    torch.ops.kiln.rmsnorm_quant(torch.empty((3, 8), dtype=torch.float8_e4m3fn, device="meta"), meta,
                                 torch.empty((8,), device="meta"), None, 0.5, 1e-6, False)  # fake: no kernel


@pytest.mark.gpu
def test_cuda_graph_replays_the_current_scale():
    x, w = randn((64, 4096), torch.bfloat16, "cuda"), randn((4096,), torch.bfloat16, "cuda")
    out = torch.empty((64, 4096), dtype=torch.float8_e4m3fn, device="cuda")
    scale = torch.tensor([0.05], device="cuda")
    kiln.rmsnorm_quant(out, x, w, scale)  # load the module before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kiln.rmsnorm_quant(out, x, w, scale)
    for value in (0.05, 0.01):
        scale.fill_(value)
        out.view(torch.uint8).fill_(0x7F)
        g.replay()
        torch.cuda.synchronize()
        check_fp8(out, fp8_of(rms_norm_float64(x, w, 1e-6), torch.tensor(value)))
