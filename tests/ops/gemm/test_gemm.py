"""The GEMM APIs (kiln.gemm) against the float64 references of kiln/trace/gemm.py on fresh random
inputs: odd M/N/K, both B layouts, strided and transposed operands, out=, every dtype pair, fp8
with realistic scales (and every fp8 bit pattern), groupwise scales in both layouts, grouped GEMMs
with empty and one-row segments; bad inputs matched by message; the tactic rules (a misaligned
view runs the fallback kernel, the default heuristic's table); torch.compile and CUDA graphs.

Every test runs on the host backend, and on CUDA where a GPU is (pytest -m gpu; sizes keep 4
xdist workers well inside the device's memory). Outputs are poisoned (NaN) before each call."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln import _jit
from kiln.trace import gemm as ref

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# |out - ref| <= atol + rtol |ref| with outputs ~N(0, 1): one rounding of the output dtype
# (2^-8, 2^-11) after float32 accumulation in another order (plus fp8's adder on the GPU).
TOL = {BF16: (1.6e-2, 1e-2), F16: (2e-3, 2e-3), F32: (1e-5, 1e-5)}
FP8_TOL = {"cpu": (1e-2, 1e-2), "cuda": (2e-2, 1e-1)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(shape, k, dtype, device, g):
    return ref.operand(shape, k, g).to(device, dtype)


def nan_like(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def close(got, want, dtype, tol=None):
    rtol, atol = tol or TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


def module(label, device, dtype):
    """The module an API call on `device` uses (cuda means cuda:0, as a tensor's device says)."""
    return _jit.module(label, torch.empty(0, device=device).device, "test", dtype=dtype)


def weight(n, k, dtype, device, g, layout):
    """b [k, n]: "k" the transpose view of an [n, k] weight (column-major), "n" row-major."""
    if layout == "k":
        return rand((n, k), k, dtype, device, g).t()
    return rand((k, n), k, dtype, device, g)


# --- mm_bf16 / bmm_bf16 -------------------------------------------------------------------------------

SHAPES = [
    (1, 7, 127),
    (7, 127, 1000),
    (127, 1000, 7),
    (1000, 1, 127),
    (1, 4097, 7),
    (33, 72, 4097),
    (64, 256, 512),
]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layout", ["k", "n"])
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mm_matches_the_reference(device, dtype, layout, mnk):
    m, n, k = mnk
    g = gen(m * 7 + n * 3 + k)
    a, b = rand((m, k), k, dtype, device, g), weight(n, k, dtype, device, g, layout)
    out = kiln.mm_bf16(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    close(out, ref.mm_reference_float(a, b, torch.float64), dtype)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_mm_float32_output_and_out(device, dtype):
    g = gen(5)
    a, b = rand((37, 96), 96, dtype, device, g), weight(80, 96, dtype, device, g, "k")
    want = ref.mm_reference_float(a, b, torch.float64)
    close(kiln.mm_bf16(a, b, out_dtype=F32), want, F32)
    out = nan_like((37, 80), F32, device)
    assert kiln.mm_bf16(a, b, out=out) is out
    close(out, want, F32)
    same = nan_like((37, 80), dtype, device)
    kiln.mm_bf16(a, b, out=same, out_dtype=dtype)
    close(same, want, dtype)


@pytest.mark.parametrize("device", device_params())
def test_mm_strided_operands_and_output(device):
    """Row slices of larger buffers (lda, ldb, ldo past the row), a column-major b from a sliced
    weight; the output's padding stays untouched."""
    g = gen(9)
    a_big = rand((50, 200), 150, BF16, device, g)
    w_big = rand((90, 256), 150, BF16, device, g)
    a, b = a_big[3:45, 10:160], w_big[:70, 40:190].t()
    out_big = nan_like((42, 100), BF16, device)
    out = out_big[:, 5:75]
    kiln.mm_bf16(a, b, out=out)
    close(out, ref.mm_reference_float(a, b, torch.float64), BF16)
    assert out_big[:, :5].isnan().all() and out_big[:, 75:].isnan().all()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["k", "n"])
def test_bmm_matches_the_reference(device, layout):
    g = gen(11)
    A = rand((3, 17, 72), 72, F16, device, g)
    if layout == "k":  # a batched transpose view, as bmm users pass weights
        B = rand((3, 40, 72), 72, F16, device, g).transpose(1, 2)
    else:
        B = rand((3, 72, 40), 72, F16, device, g)
    out = kiln.bmm_bf16(A, B)
    assert out.shape == (3, 17, 40)
    close(out, ref.mm_reference_float(A, B, torch.float64), F16)
    out32 = kiln.bmm_bf16(A, B, out_dtype=F32)
    close(out32, ref.mm_reference_float(A, B, torch.float64), F32)


@pytest.mark.parametrize("device", device_params())
def test_bmm_broadcast_weight_and_batch_slices(device):
    """B expanded over the batch (batch stride 0) is read as is; A a slice of a larger batch."""
    g = gen(12)
    A = rand((6, 9, 64), 64, BF16, device, g)[::2]
    w = rand((24, 64), 64, BF16, device, g).t()
    B = w.unsqueeze(0).expand(3, 64, 24)
    close(kiln.bmm_bf16(A, B), ref.mm_reference_float(A, B, torch.float64), BF16)


@pytest.mark.parametrize("device", device_params())
def test_zero_sizes(device):
    g = gen(13)
    a, b = rand((5, 0), 1, BF16, device, g), rand((0, 7), 1, BF16, device, g)
    out = kiln.mm_bf16(a, b, out=nan_like((5, 7), BF16, device))
    assert torch.equal(out, torch.zeros(5, 7, dtype=BF16, device=device))  # k = 0: zeros
    assert kiln.mm_bf16(rand((0, 8), 8, BF16, device, g), rand((8, 3), 8, BF16, device, g)).shape == (0, 3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(0, 70),
    n=st.integers(1, 70),
    k=st.integers(0, 300),
    layout=st.sampled_from("kn"),
    f32=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mm_any_shape_property(m, n, k, layout, f32, seed):
    """Any m, n, k, either layout, either output dtype: the reference, on the host backend."""
    g = gen(seed)
    a, b = rand((m, k), max(k, 1), BF16, "cpu", g), weight(n, k, BF16, "cpu", g, layout)
    out = kiln.mm_bf16(a, b, out_dtype=F32 if f32 else None)
    close(out, ref.mm_reference_float(a, b, torch.float64), F32 if f32 else BF16)


@pytest.mark.parametrize("device", device_params())
def test_dense_bad_inputs_name_the_argument(device):
    g = gen(14)
    a, b = rand((8, 64), 64, BF16, device, g), rand((64, 16), 64, BF16, device, g)
    with pytest.raises(ValueError, match=r"b.shape\[0\] must equal a.shape\[-1\] \(k = 64\), got 63"):
        kiln.mm_bf16(a, b[:63])
    with pytest.raises(TypeError, match="b.dtype must be a's"):
        kiln.mm_bf16(a, b.half())
    with pytest.raises(TypeError, match="a.dtype torch.float32 is not supported; supported dtypes: bfloat16"):
        kiln.mm_bf16(a.float(), b.float())
    with pytest.raises(ValueError, match="a must be 2-D"):
        kiln.mm_bf16(a[None], b)
    with pytest.raises(ValueError, match="a must be row-major"):
        kiln.mm_bf16(a.t().contiguous().t(), b)  # a column-major a
    with pytest.raises(ValueError, match=r"bias must have shape \[n\] = \[16\], got \[15\]"):
        kiln.mm_bf16(a, b, bias=torch.zeros(15, dtype=BF16, device=device))
    with pytest.raises(TypeError, match="output dtype must be torch.bfloat16, torch.float16 or torch.float"):
        kiln.mm_bf16(a, b, out_dtype=torch.float64)
    with pytest.raises(ValueError, match=r"out must have shape \[8, 16\]"):
        kiln.mm_bf16(a, b, out=nan_like((8, 15), BF16, device))
    with pytest.raises(ValueError, match="overlapping elements"):
        kiln.mm_bf16(a, b, out=torch.zeros(1, 16, dtype=BF16, device=device).expand(8, 16))
    with pytest.raises(ValueError, match="overlap in memory"):
        buf = torch.zeros(8, 64, dtype=BF16, device=device)
        kiln.mm_bf16(buf, b, out=buf[:, :16])
    with pytest.raises(ValueError, match=r"B.shape\[0\] must equal A.shape\[0\] \(the batch, 2\)"):
        kiln.bmm_bf16(torch.stack([a, a]), b[None])
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        kiln.mm_bf16(a, [1, 2])


@pytest.mark.gpu
def test_dense_device_mismatch_is_refused():
    a, b = torch.randn(4, 8, dtype=BF16), torch.randn(8, 4, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match="b is on cuda:0 but a is on cpu"):
        kiln.mm_bf16(a, b)


# --- the tactic rules, seen from the API -----------------------------------------------------------------


def test_tactic_list_fits_the_blocklist_mask():
    mod = module(kiln.gemm.MM, "cpu", BF16)
    assert len(mod.tactic_names) <= mod.max_tactics
    assert len(set(mod.tactic_names)) == len(mod.tactic_names) and mod.tactic_names[-1] == "fallback"


@pytest.mark.parametrize(
    "m,n,k,expected",
    [
        (1, 4096, 4096, "small_m_8x32_k8"),
        (16, 6144, 4096, "small_m_16x64_k4"),
        (1, 28672, 4096, "small_m_8x64_k8"),
        (64, 4096, 4096, "sm90_128x128x64_s6_c1"),
        (1024, 4096, 4096, "sm90_128x256x64_s4_c1"),
        (1024, 6144, 4096, "sm90_128x128x64_s6_c1"),
    ],
)
def test_default_heuristic_for_a_9_0_device(m, n, k, expected):
    """The host backend answers with the 9.0 device's rules (kHostArch), so the heuristic table of
    gemm_tactics.cc is checked here against docs/perf/gemm.md's defaults (no kernel runs)."""
    mod = module(kiln.gemm.MM, "cpu", BF16)
    a, w = torch.empty(m, k, dtype=BF16), torch.empty(n, k, dtype=BF16)
    out = torch.empty(m, n, dtype=BF16)
    default, candidates = mod.mm_tactics(a=_jit.dl(a), b=_jit.dl(w.t()), out=_jit.dl(out))
    assert mod.tactic_names[default] == expected
    assert default in candidates and mod.tactic_names[candidates[-1]] == "fallback"


@pytest.mark.parametrize("device", device_params())
def test_a_misaligned_view_runs_the_fallback_kernel(device):
    """a one element (2 bytes) past a 16-byte boundary: no TMA or 16-byte-vector kernel can take
    it, so the launch runs the fallback kernel, with the same result."""
    g = gen(15)
    base = rand((64 * 129 + 1,), 128, BF16, device, g)
    a = base[1:].view(64, 129)[:, :128]
    b = weight(256, 128, BF16, device, g, "k")
    mod = module(kiln.gemm.MM, device, BF16)
    mod.reset_launch_counts()
    close(kiln.mm_bf16(a, b), ref.mm_reference_float(a, b, torch.float64), BF16)
    assert mod.launch_counts() == {"fallback": 1}
    mod.reset_launch_counts()
    kiln.mm_bf16(a.contiguous(), b)
    assert "fallback" not in mod.launch_counts()


@pytest.mark.parametrize("device", device_params())
def test_every_tactic_that_can_run_a_call_matches_the_reference(device):
    """Each candidate of mm_tactics, asked for strictly, gives the reference's result (on the GPU
    every kernel family and tile shape; on the CPU the host loops under each tactic's rules)."""
    g = gen(16)
    for m, n, k, layout in ((5, 200, 256, "k"), (130, 304, 192, "n"), (64, 384, 512, "k")):
        a, b = rand((m, k), k, BF16, device, g), weight(n, k, BF16, device, g, layout)
        want = ref.mm_reference_float(a, b, torch.float64)
        mod = module(kiln.gemm.MM, device, BF16)
        out = nan_like((m, n), BF16, device)
        args = {"a": _jit.dl(a), "b": _jit.dl(b), "out": _jit.dl(out)}
        default, candidates = mod.mm_tactics(**args)
        assert len(candidates) >= 2
        for i in candidates:
            out.fill_(float("nan"))
            assert mod.mm(**args, tactic=i, strict=True, stream=_jit.stream_of(a.device)) == i
            close(out, want, BF16)


@pytest.mark.parametrize("device", device_params())
def test_a_tactic_that_cannot_serve_the_call_is_refused_when_strict(device):
    mod = module(kiln.gemm.MM, device, BF16)
    a, b = torch.zeros(100, 64, dtype=BF16, device=device), torch.zeros(64, 32, dtype=BF16, device=device)
    out = torch.empty(100, 32, dtype=BF16, device=device)
    small = mod.tactic_names.index("small_m_8x32_k8")  # m 100 > its 8 rows
    args = {"a": _jit.dl(a), "b": _jit.dl(b), "out": _jit.dl(out)}
    with pytest.raises(ValueError, match="tactic small_m_8x32_k8: m 100 > tile_m 8"):
        mod.mm(**args, tactic=small, strict=True)
    assert mod.tactic_names[mod.mm(**args, tactic=small)] != "small_m_8x32_k8"  # not strict: the default
    with pytest.raises(ValueError, match="is blocklisted"):
        mod.mm(
            **args, tactic=len(mod.tactic_names) - 1, strict=True, blocked=1 << (len(mod.tactic_names) - 1)
        )


# --- fp8: bmm_fp8, gemm_fp8_nt_groupwise ------------------------------------------------------------------


def fp8_operands(b, m, n, k, a_dtype, b_dtype, device, g):
    a, sa = ref.quantize_tensor(ref.operand((b, m, k), k, g), a_dtype)
    w, sb = ref.quantize_tensor(ref.operand((b, n, k), k, g), b_dtype)
    return a.to(device), w.to(device).transpose(1, 2), sa.to(device), sb.to(device)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(
    "pair",
    [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2), (E5M2, E5M2)],
    ids=["e4m3xe4m3", "e5m2xe4m3", "e4m3xe5m2", "e5m2xe5m2"],
)
@pytest.mark.parametrize("out_dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    "bmnk",
    [(1, 1, 48, 64), (2, 19, 40, 96), (1, 130, 264, 512), (1, 7, 127, 1000)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_bmm_fp8_matches_the_reference(device, pair, out_dtype, bmnk):
    g = gen(sum(bmnk))
    A, B, sa, sb = fp8_operands(*bmnk, *pair, device, g)
    out = kiln.bmm_fp8(A, B, sa, sb, out_dtype)
    assert out.dtype == out_dtype and out.shape == (bmnk[0], bmnk[1], bmnk[2])
    rtol, atol = FP8_TOL[device]
    close(
        out,
        ref.bmm_fp8_reference_float(A, B, sa, sb, torch.float64),
        out_dtype,
        (max(rtol, TOL[out_dtype][0]), max(atol, TOL[out_dtype][1])),
    )


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_every_fp8_value_is_decoded_exactly(device, dtype):
    """All 256 bit patterns as A (k = 1, B = 1.0, scales 1): out = the value itself, which bf16
    holds exactly (NaN stays NaN, e5m2's infinities stay infinite)."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(1, 256, 1).to(device)
    one = torch.ones(1, 1, 1, dtype=E4M3, device=device)
    s = torch.ones(1, device=device)
    out = kiln.bmm_fp8(values, one, s, s, BF16).float().cpu().flatten()
    want = values.float().cpu().flatten()
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("device", device_params())
def test_bmm_fp8_refuses_a_row_major_b_as_flashinfer_requires(device):
    g = gen(17)
    A, B, sa, sb = fp8_operands(1, 16, 32, 64, E4M3, E4M3, device, g)
    with pytest.raises(ValueError, match="B must be column-major.*FlashInfer 0.7 silently returns wrong"):
        kiln.bmm_fp8(A, B.contiguous(), sa, sb, BF16)
    with pytest.raises(ValueError, match="A_scale must contain exactly one element"):
        kiln.bmm_fp8(A, B, torch.ones(2, device=device), sb, BF16)
    with pytest.raises(ValueError, match="B_scale must have dtype torch.float32"):
        kiln.bmm_fp8(A, B, sa, sb.double(), BF16)
    with pytest.raises(TypeError, match="dtype must be torch.bfloat16 or torch.float16"):
        kiln.bmm_fp8(A, B, sa, sb, F32)
    with pytest.raises(TypeError, match="A.dtype must be torch.float8_e4m3fn or torch.float8_e5m2"):
        kiln.bmm_fp8(A.to(BF16), B, sa, sb, BF16)
    with pytest.raises(ValueError, match=r"B.shape\[1\] must equal A.shape\[-1\] \(k = 64\)"):
        kiln.bmm_fp8(A, B[:, :32], sa, sb, BF16)


@pytest.mark.parametrize("device", device_params())
def test_fp8_through_uint8_views(device, monkeypatch):
    """Where torch's DLPack export has no fp8 codes, the fp8 operands travel as uint8 views with
    the type they stand for (a_as, b_as): the same result."""
    g = gen(26)
    A, B, sa, sb = fp8_operands(1, 9, 40, 64, E5M2, E4M3, device, g)
    native = kiln.bmm_fp8(A, B, sa, sb, BF16)
    monkeypatch.setattr(kiln.gemm, "_fp8_dlpack", False)
    assert torch.equal(kiln.bmm_fp8(A, B, sa, sb, BF16), native)
    mod = module(kiln.gemm.FP8, device, E5M2)
    out = torch.empty_like(native)
    args = {
        "a": _jit.dl(A.view(torch.uint8)),
        "b": _jit.dl(B.view(torch.uint8)),
        "out": _jit.dl(out),
        "a_scale": _jit.dl(sa),
        "b_scale": _jit.dl(sb),
        "scale_mode": "tensor",
    }
    with pytest.raises(
        TypeError, match=r"a.dtype must be float8_e5m2 \(this module is gemm_fp8_dtype_e5m2\)"
    ):
        mod.gemm_fp8(**args)
    with pytest.raises(ValueError, match="a_as must be '', 'e4m3' or 'e5m2'"):
        mod.gemm_fp8(**args, a_as="e3m4")


def groupwise_operands(m, n, k, mode, device, g, a_dtype=E4M3, b_dtype=E4M3):
    a, sa = ref.quantize_blocks(ref.operand((m, k), k, g), 1, a_dtype)
    b, sb = ref.quantize_blocks(ref.operand((n, k), k, g), ref.SCALE_BLOCK, b_dtype)
    if mode == "MN":
        sa, sb = sa.t().contiguous(), sb.t().contiguous()
    return a.to(device), b.to(device), sa.to(device), sb.to(device)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("mode", ["MN", "K"])
@pytest.mark.parametrize(
    "mnk", [(1, 72, 128), (33, 200, 256), (130, 256, 384), (7, 129, 640)], ids=lambda s: "x".join(map(str, s))
)
def test_groupwise_matches_the_reference(device, mode, mnk):
    g = gen(sum(mnk) + len(mode))
    a, b, sa, sb = groupwise_operands(*mnk, mode, device, g)
    out = kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode=mode)
    assert out.dtype == BF16 and out.shape == mnk[:2]
    tol = (0.02, FP8_TOL[device][1])
    close(out, ref.groupwise_reference_float(a, b, sa, sb, mode, torch.float64), BF16, tol)
    # "K" also takes the a_scale of per_token_group_quant_fp8 in column-major strides; out= f16
    if mode == "K":
        sa_col = sa.t().contiguous().t()
        out16 = nan_like(mnk[:2], F16, device)
        kiln.gemm_fp8_nt_groupwise(a, b, sa_col, sb, "K", out=out16)
        close(out16, ref.groupwise_reference_float(a, b, sa, sb, mode, torch.float64), F16, tol)


@pytest.mark.parametrize("device", device_params())
def test_groupwise_unsupported_combinations_are_explicit(device):
    g = gen(18)
    a, b, sa, sb = groupwise_operands(8, 128, 256, "MN", device, g)
    with pytest.raises(ValueError, match=r"scale_granularity_mnk \(1, 128, 64\) is not supported"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_granularity_mnk=(1, 128, 64))
    with pytest.raises(ValueError, match="must be a multiple of 128"):
        kiln.gemm_fp8_nt_groupwise(a[:, :200], b[:, :200], sa, sb)
    with pytest.raises(
        ValueError, match=r"a_scale must be \[k / 128, m\] = \[2, 8\] for scale_major_mode 'MN'"
    ):
        kiln.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb)
    with pytest.raises(ValueError, match=r"b_scale must be \[ceil\(n / 128\), k / 128\]"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb, scale_major_mode="K")
    with pytest.raises(ValueError, match="scale_major_mode must be 'MN', 'K' or None, got 'KN'"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="KN")
    with pytest.raises(ValueError, match="mma_sm must be 1 or 2"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, mma_sm=4)
    with pytest.raises(ValueError, match="b must be \\[n, k\\] with k contiguous"):
        kiln.gemm_fp8_nt_groupwise(a, b.t().contiguous().t(), sa, sb)
    with pytest.raises(TypeError, match="output dtype must be torch.bfloat16 or torch.float16"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, out_dtype=F32)


# --- grouped: SegmentGEMMWrapper, grouped_mm ------------------------------------------------------------


def segments(lens, k, n, dtype, device, g, num_weights=None, column_major=True):
    rows = sum(lens)
    x = rand((rows, k), k, dtype, device, g)
    e = num_weights or len(lens)
    w = rand((e, n, k) if column_major else (e, k, n), k, dtype, device, g)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64, device=device)
    return x, w, indptr


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("column_major", [True, False], ids=["col", "row"])
def test_segment_gemm_with_empty_and_one_row_segments(device, dtype, column_major):
    g = gen(19)
    lens = [3, 0, 1, 130, 0, 1, 40]
    x, w, indptr = segments(lens, 72, 40, dtype, device, g, column_major=column_major)
    wrapper = kiln.SegmentGEMMWrapper(torch.empty(1 << 20, dtype=torch.int8, device=device))
    want = ref.segment_gemm_reference_float(x, w, indptr, column_major, compute=torch.float64)
    by_indptr = wrapper.run(x, w, len(lens), column_major, seg_indptr=indptr)
    close(by_indptr, want, dtype)
    by_lens = wrapper.run(x, w, len(lens), column_major, seg_lens=torch.tensor(lens, device=device))
    assert torch.equal(by_lens, by_indptr)
    out = nan_like(x.shape[:1] + (40,), dtype, device)
    assert wrapper.run(x, w, len(lens), column_major, out=out, seg_indptr=indptr.int()) is out
    close(out, want, dtype)


@pytest.mark.parametrize("device", device_params())
def test_segment_gemm_weight_indices_and_uncovered_rows(device):
    """weight_indices pick any weight (repeats too); rows past seg_indptr[-1] are not written."""
    g = gen(20)
    lens = [5, 0, 9, 1]
    x, w, indptr = segments(lens, 64, 48, BF16, device, g, num_weights=3)
    x = torch.cat([x, rand((4, 64), 64, BF16, device, g)])  # four rows in no segment
    idx = torch.tensor([2, 0, 2, 1], device=device)
    out = nan_like((x.shape[0], 48), BF16, device)
    kiln.SegmentGEMMWrapper(torch.empty(1, device=device)).run(
        x, w, 4, True, out=out, seg_indptr=indptr, weight_indices=idx
    )
    want = ref.segment_gemm_reference_float(x, w, indptr, True, idx, torch.float64)
    close(out[:15], want[:15], BF16)
    assert out[15:].isnan().all()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("lens", [[0, 0, 0], [1, 1], [17, 0, 250, 3, 0], [300]], ids=str)
def test_grouped_mm_matches_the_reference(device, lens):
    g = gen(len(lens) + sum(lens))
    rows, k, n = sum(lens), 72, 56
    a = rand((rows, k), k, BF16, device, g)
    b = rand((len(lens), n, k), k, BF16, device, g).transpose(1, 2)
    offs = torch.tensor(lens, dtype=torch.int32).cumsum(0).to(device=device, dtype=torch.int32)
    out = kiln.grouped_mm(a, b, offs)
    assert out.shape == (rows, n)
    close(out, ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)
    close(
        kiln.grouped_mm(a, b.contiguous(), offs, out_dtype=F32),
        ref.grouped_mm_reference_float(a, b, offs, torch.float64),
        F32,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 40), min_size=1, max_size=9),
    n=st.integers(1, 48),
    k=st.integers(0, 160),
    column_major=st.booleans(),
    indexed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_segment_gemm_any_segmentation_property(lens, n, k, column_major, indexed, seed):
    """Any segment lengths (empty ones included), n, k, weight layout, with or without weight
    indices: the reference, on the host backend."""
    g = gen(seed)
    x, w, indptr = segments(
        lens, k, n, BF16, "cpu", g, num_weights=3 if indexed else None, column_major=column_major
    )
    idx = torch.randint(3, (len(lens),), generator=g) if indexed else None
    out = kiln.SegmentGEMMWrapper(torch.empty(1)).run(
        x, w, len(lens), column_major, seg_indptr=indptr, weight_indices=idx
    )
    close(out, ref.segment_gemm_reference_float(x, w, indptr, column_major, idx, torch.float64), BF16)


@pytest.mark.parametrize("device", device_params())
def test_grouped_unsupported_forms_and_bad_arguments(device):
    g = gen(21)
    a, b = rand((10, 32), 32, BF16, device, g), rand((2, 32, 16), 32, BF16, device, g)
    offs = torch.tensor([4, 10], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="kiln supports a 2-D a .* got a 3-D, b 3-D"):
        kiln.grouped_mm(a[None].expand(2, 10, 32), b, offs)
    with pytest.raises(ValueError, match="bias is not supported"):
        kiln.grouped_mm(a, b, offs, bias=torch.zeros(16, dtype=BF16, device=device))
    with pytest.raises(ValueError, match="offs must have one entry per group of b"):
        kiln.grouped_mm(a, b, offs[:1])
    with pytest.raises(TypeError, match="a.dtype torch.float32 is not supported"):
        kiln.grouped_mm(a.float(), b.float(), offs)
    with pytest.raises(ValueError, match=r"b.shape\[1\] must equal a.shape\[-1\] \(k = 32\)"):
        kiln.grouped_mm(a, b[:, :31], offs)
    wrapper = kiln.SegmentGEMMWrapper(torch.empty(1, device=device))
    with pytest.raises(ValueError, match="either seg_lens or seg_indptr should be provided"):
        wrapper.run(a, b, 2, False)
    with pytest.raises(ValueError, match=r"seg_indptr must have batch_size \+ 1 = 3 entries"):
        wrapper.run(a, b, 2, False, seg_indptr=offs)
    with pytest.raises(ValueError, match="without weight_indices segment s uses weights"):
        wrapper.run(a, b, 3, False, seg_lens=torch.tensor([2, 2, 2], device=device))
    with pytest.raises(ValueError, match="backend 'sm100' is not one of FlashInfer's backends.*'sm90'"):
        kiln.SegmentGEMMWrapper(torch.empty(1), backend="sm100")


def test_bad_segment_bounds_are_index_errors_before_anything_is_written():
    """Host backend: segment bounds and weight indices are checked before a row is written."""
    g = gen(22)
    a, b = rand((10, 32), 32, BF16, "cpu", g), rand((3, 32, 16), 32, BF16, "cpu", g)
    cases = [
        (
            torch.tensor([4, 11, 11], dtype=torch.int32),
            None,
            "segment 1 ends at row 11, past the 10 rows of the input",
        ),
        (torch.tensor([6, 4, 10], dtype=torch.int32), None, r"segment 1 starts at row 6, outside \[0, 4\]"),
    ]
    for offs, _, message in cases:
        out = nan_like((10, 16), BF16, "cpu")
        with pytest.raises(IndexError, match=message):
            kiln.grouped_mm(a, b, offs, out=out)
        assert out.isnan().all()
    wrapper = kiln.SegmentGEMMWrapper(torch.empty(1))
    out = nan_like((10, 16), BF16, "cpu")
    with pytest.raises(IndexError, match=r"weight_indices\[1\] = 7 is not a weight: valid are \[0, 3\)"):
        wrapper.run(
            a, b, 2, False, out=out, seg_lens=torch.tensor([5, 5]), weight_indices=torch.tensor([0, 7])
        )
    assert out.isnan().all()


@pytest.mark.gpu
def test_bad_segment_bounds_are_recorded_on_the_device():
    """CUDA: the bad segment is skipped (its rows unwritten) and the record raises at check_errors."""
    g = gen(23)
    a, b = rand((10, 32), 32, BF16, "cuda", g), rand((3, 32, 16), 32, BF16, "cuda", g)
    kiln.check_errors()
    out = nan_like((10, 16), BF16, "cuda")
    kiln.grouped_mm(a, b, torch.tensor([4, 11, 11], dtype=torch.int32, device="cuda"), out=out)
    with pytest.raises(kiln.DeviceIndexError, match="segment 1 ends at row 11, past the 10 rows"):
        kiln.check_errors()
    close(out[:4], ref.grouped_mm_reference_float(a[:4], b[:1], torch.tensor([4]), torch.float64), BF16)
    assert out[4:].isnan().all()
    wrapper = kiln.SegmentGEMMWrapper(torch.empty(1, device="cuda"))
    wrapper.run(
        a,
        b,
        2,
        False,
        out=out,
        seg_lens=torch.tensor([5, 5], device="cuda"),
        weight_indices=torch.tensor([0, 7], device="cuda"),
    )
    with pytest.raises(kiln.DeviceIndexError, match=r"weight_indices\[1\] = 7 is not a weight"):
        kiln.check_errors()


# --- torch.compile and CUDA graphs -------------------------------------------------------------------------


def layer(x, w_up, w_down, A, B, sa, sb, xs, ws, offs):
    """A toy block calling every GEMM op: dense up/down projections, an fp8 product, a grouped one."""
    h = kiln.mm_bf16(x, w_up)
    y = kiln.mm_bf16(torch.relu(h), w_down, out_dtype=F32)
    q = kiln.bmm_fp8(A, B, sa, sb, BF16)
    e = kiln.grouped_mm(xs, ws, offs)
    return y, q, e


def layer_inputs(device, g):
    x = rand((9, 64), 64, BF16, device, g)
    w_up, w_down = weight(128, 64, BF16, device, g, "k"), weight(64, 128, BF16, device, g, "k")
    A, B, sa, sb = fp8_operands(1, 9, 32, 64, E4M3, E4M3, device, g)
    xs = rand((12, 64), 64, BF16, device, g)
    ws = rand((3, 48, 64), 64, BF16, device, g).transpose(1, 2)
    offs = torch.tensor([2, 2, 12], dtype=torch.int32, device=device)
    return x, w_up, w_down, A, B, sa, sb, xs, ws, offs


def test_a_layer_compiles_with_fullgraph_and_matches_eager():
    g = gen(24)
    inputs = layer_inputs("cpu", g)
    eager = layer(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="eager")(*inputs)
    for e, c in zip(eager, compiled, strict=True):
        assert torch.equal(e, c)


@pytest.mark.gpu
def test_a_layer_replays_in_a_cuda_graph():
    g = gen(25)
    inputs = layer_inputs("cuda", g)
    eager = layer(*inputs)  # loads the modules before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(*inputs)
    inputs[0].copy_(rand((9, 64), 64, BF16, "cuda", g))
    graph.replay()
    torch.cuda.synchronize()
    fresh = layer(*inputs)
    for f, c in zip(fresh, captured, strict=True):
        assert torch.equal(f, c)
    assert not torch.equal(eager[0], fresh[0])
