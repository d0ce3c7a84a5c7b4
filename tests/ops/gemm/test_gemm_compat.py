"""FlashInfer 0.7.2's arguments of the GEMM APIs (kiln.gemm, docs/gemm.md "Backends"): every
backend name runs kiln's kernels and matches the reference; a name FlashInfer does not have is a
ValueError listing the accepted ones; the calls FlashInfer refuses for a name are refused with its
reason; mm_bf16's bias and pdl, 16-bit outputs of the other dtype, gemm_fp8_nt_groupwise's
TensorRT-LLM scale layout, gemm_fp8_nt_blockscaled (128 x 128 blocks of a), skip_check; and the
capability queries (is_compute_capability_supported, is_backend_supported, kiln/_support.py),
which must follow the targets' arch families in the build graph rather than a typed-in list. On
the GPU: programmatic dependent launch through every kernel family (sm90, sm80, small-M,
fallback) after a producer kernel, eagerly and in a CUDA graph.

The host backend runs every CPU case (small shapes: float32 loops); -m gpu the CUDA ones."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from test_gemm import close, fp8_operands, gen, groupwise_operands, nan_like, rand, weight

import kiln
import kiln.utils
from kiln import _jit, gemm
from kiln._support import compute_capability_arch
from kiln.runtime.arch import ArchFamily, supports
from kiln.trace import gemm as ref
from kiln.utils import target_arch_families

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_TOL = {"cpu": (1e-2, 1e-2), "cuda": (2e-2, 1e-1)}


# --- backend names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", [*gemm.MM_BF16_BACKENDS, "auto"])
def test_every_mm_bf16_backend_name_runs_kiln_kernels(device, backend):
    g = gen(40)
    a, b = rand((5, 96), 96, BF16, device, g), weight(72, 96, BF16, device, g, "k")
    close(kiln.mm_bf16(a, b, backend=backend), ref.mm_reference_float(a, b, torch.float64), BF16)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", [*gemm.BMM_BF16_BACKENDS, "auto"])
def test_every_bmm_bf16_backend_name_runs_kiln_kernels(device, backend):
    g = gen(41)
    A = rand((3, 17, 64), 64, BF16, device, g)
    B = rand((3, 40, 64), 64, BF16, device, g).transpose(1, 2)
    close(kiln.bmm_bf16(A, B, backend=backend), ref.mm_reference_float(A, B, torch.float64), BF16)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", [*gemm.BMM_FP8_BACKENDS, "auto"])
def test_every_bmm_fp8_backend_name_runs_kiln_kernels(device, backend):
    g = gen(42)
    A, B, sa, sb = fp8_operands(2, 9, 48, 64, E4M3, E4M3, device, g)
    out = kiln.bmm_fp8(A, B, sa, sb, BF16, backend=backend)
    want = ref.bmm_fp8_reference_float(A, B, sa, sb, torch.float64)
    close(out, want, BF16, FP8_TOL[device])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(
    "backend,mode,layout",
    [("cutlass", "MN", "MN"), ("cutlass", "K", "K"), ("cutlass", None, "MN"), ("cutile", "K", "K"),
     ("cutile", None, "K")],
)
def test_every_groupwise_backend_name_runs_kiln_kernels(device, backend, mode, layout):
    """scale_major_mode None: "MN" for cutlass (kiln's former default), "K" for cutile (FlashInfer's)."""
    g = gen(43)
    a, b, sa, sb = groupwise_operands(33, 200, 256, layout, device, g)
    out = kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, mode, backend=backend)
    close(out, ref.groupwise_reference_float(a, b, sa, sb, layout, torch.float64), BF16, FP8_TOL[device])


def blockscaled_operands(m, n, k, mode, device, g, a_dtype=E4M3):
    a, sa = ref.quantize_blocks(ref.operand((m, k), k, g), ref.SCALE_BLOCK, a_dtype)
    b, sb = ref.quantize_blocks(ref.operand((n, k), k, g), ref.SCALE_BLOCK, E4M3)
    if mode == "MN":
        sa, sb = sa.t().contiguous(), sb.t().contiguous()
    return a.to(device), b.to(device), sa.to(device), sb.to(device)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("mode", ["MN", "K"])
@pytest.mark.parametrize(
    "mnk,a_dtype", [((1, 72, 128), E4M3), ((133, 200, 256), E4M3), ((300, 256, 384), E5M2)]
)
def test_gemm_fp8_nt_blockscaled_matches_the_reference(device, mode, mnk, a_dtype):
    """128 x 128 blocks of a as well as b (m not a multiple of 128: a partial last block of rows),
    both scale layouts; gemm_fp8_nt_groupwise with scale_granularity_mnk (128, 128, 128) is the same
    call."""
    m, n, k = mnk
    g = gen(sum(mnk) + len(mode))
    a, b, sa, sb = blockscaled_operands(m, n, k, mode, device, g, a_dtype)
    want = ref.blockscaled_reference_float(a, b, sa, sb, mode, torch.float64)
    out = kiln.gemm_fp8_nt_blockscaled(a, b, sa, sb, mode)
    assert out.dtype == BF16 and out.shape == (m, n)
    close(out, want, BF16, FP8_TOL[device])
    out16 = nan_like((m, n), F16, device)
    kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, mode, scale_granularity_mnk=(128, 128, 128), out=out16)
    close(out16, want, F16, FP8_TOL[device])


def test_gemm_fp8_nt_blockscaled_bad_inputs_name_the_argument():
    g = gen(56)
    a, b, sa, sb = blockscaled_operands(130, 128, 256, "MN", "cpu", g)
    with pytest.raises(ValueError, match=r"a_scale must be \[k / 128, ceil\(m / 128\)\] = \[2, 2\] for "
                       "scale_major_mode 'MN' with 128 x 128 blocks of a, got shape \\[2, 130\\]"):
        kiln.gemm_fp8_nt_blockscaled(a, b, sa.repeat_interleave(128, 1)[:, :130], sb)
    with pytest.raises(ValueError, match=r"a_scale must be \[ceil\(m / 128\), k / 128\] = \[2, 2\]"):
        kiln.gemm_fp8_nt_blockscaled(a, b, sa[:1], sb.t().contiguous(), "K")
    for backend in ("trtllm", "cutile"):
        with pytest.raises(ValueError, match=r"supports scale_granularity_mnk \(1, 128, 128\) only"):
            kiln.gemm_fp8_nt_groupwise(
                a, b, sa.t().contiguous(), sb.t().contiguous(), "K", scale_granularity_mnk=(128, 128, 128),
                backend=backend,
            )
    with pytest.raises(ValueError, match="mma_sm must be 1 or 2"):
        kiln.gemm_fp8_nt_blockscaled(a, b, sa, sb, mma_sm=3)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("m,n", [(33, 200), (2, 256), (256, 512)])
def test_groupwise_trtllm_reads_the_tensorrt_llm_scale_layout(device, m, n):
    """backend="trtllm": a_scale m-major ([k/128, m] or its transpose view), b_scale k-major
    ([ceil(n/128), k/128] or its transpose view), whatever scale_major_mode says; k = 512 makes
    b_scale square at n = 512, where the strides tell the layouts apart."""
    g = gen(44)
    a, b, sa_k, sb_k = groupwise_operands(m, n, 512, "K", device, g)  # sa [m, kb], sb [nb, kb]
    want = ref.groupwise_reference_float(a, b, sa_k, sb_k, "K", torch.float64)
    sa_mn = sa_k.t().contiguous()  # [kb, m], m contiguous: FlashInfer's test's a_scale
    for sa, sb in ((sa_mn, sb_k), (sa_mn.t(), sb_k), (sa_mn, sb_k.t())):  # the same memory each
        for mode in ("MN", None, "K"):
            out = kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, mode, backend="trtllm")
            close(out, want, BF16, FP8_TOL[device])
    with pytest.raises(ValueError, match=r"takes b_scale \[ceil\(n / 128\), k / 128\]"):
        kiln.gemm_fp8_nt_groupwise(a, b, sa_mn, sb_k[:, :1], "MN", backend="trtllm")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", gemm.GROUP_GEMM_FP8_BACKENDS)
def test_group_gemm_fp8_backend_names_and_segment_alignment(device, backend):
    from test_group_gemm_fp8 import operands

    g = gen(45)
    a, b, sa, sb, indptr = operands([5, 0, 130], 136, 256, "MN", device, g)
    want = ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr.cpu(), "MN", torch.float64)
    for alignment in (1, 128):
        out = kiln.group_gemm_fp8_nt_groupwise(
            a, b, sa, sb, indptr, backend=backend, segment_alignment=alignment
        )
        close(out.cpu(), want.cpu(), BF16, FP8_TOL[device])
    with pytest.raises(ValueError, match="segment_alignment must be an int >= 1, got 0"):
        kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, segment_alignment=0)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", gemm.SEGMENT_GEMM_BACKENDS)
def test_every_segment_gemm_backend_name_runs_kiln_kernels(device, backend):
    g = gen(46)
    x = rand((23, 64), 64, F16, device, g)
    w = rand((3, 40, 64), 64, F16, device, g)  # [E, d_out, d_in]: column-major
    indptr = torch.tensor([0, 7, 7, 23], device=device)
    out = kiln.SegmentGEMMWrapper(torch.empty(1, device=device), backend=backend).run(
        x, w, 3, True, seg_indptr=indptr
    )
    want = ref.segment_gemm_reference_float(x, w, indptr.cpu(), True, compute=torch.float64)
    close(out, want, F16)


def test_a_backend_name_flashinfer_lacks_is_a_value_error_listing_the_accepted_ones():
    a, b = torch.zeros(4, 64, dtype=BF16), torch.zeros(64, 8, dtype=BF16)
    with pytest.raises(ValueError, match=r"kiln.mm_bf16: backend 'cublas' is not one of .*'cudnn', .*'auto'"):
        kiln.mm_bf16(a, b, backend="cublas")
    with pytest.raises(ValueError, match=r"kiln.bmm_bf16: backend 'trtllm' .*'cake', 'auto'"):
        kiln.bmm_bf16(a[None], b[None], backend="trtllm")
    A, B, sa, sb = fp8_operands(1, 4, 16, 64, E4M3, E4M3, "cpu", gen(47))
    with pytest.raises(ValueError, match=r"kiln.bmm_fp8: backend 'triton' .*'cublas'"):
        kiln.bmm_fp8(A, B, sa, sb, BF16, backend="triton")
    a8, b8, sa8, sb8 = groupwise_operands(4, 128, 128, "MN", "cpu", gen(48))
    with pytest.raises(ValueError, match=r"backend 'auto' is not one of .*'cutlass', 'trtllm', 'cutile' \("):
        kiln.gemm_fp8_nt_groupwise(a8, b8, sa8, sb8, "MN", backend="auto")
    with pytest.raises(ValueError, match=r"backend 'cutlass' is not one of .*'trtllm', 'cutile'"):
        kiln.group_gemm_fp8_nt_groupwise(
            a8, b8[None], sa8, sb8[None], torch.tensor([0, 4], dtype=torch.int32), backend="cutlass"
        )
    with pytest.raises(ValueError, match=r"backend 'sm100' .*'auto', 'sm80', 'sm90'"):
        kiln.SegmentGEMMWrapper(torch.empty(1), backend="sm100")


def test_calls_flashinfer_refuses_for_a_backend_name_are_refused_with_its_reason():
    g = gen(49)
    a, b = rand((4, 64), 64, BF16, "cpu", g), weight(16, 64, BF16, "cpu", g, "k")
    bias = torch.zeros(16, dtype=BF16)
    refused = [
        ({"bias": bias, "backend": "cutlass"}, "'cutlass' backend takes no bias and no pdl"),
        ({"pdl": True, "backend": "cutlass"}, "'cutlass' backend takes no bias and no pdl"),
        ({"pdl": True, "backend": "cublaslt"}, "'cublaslt' backend does not support PDL"),
        ({"bias": bias, "out_dtype": F32, "backend": "cublaslt"}, "fuses a bias only with a bfloat16"),
        ({"bias": bias, "backend": "cutile"}, "ignores `bias`"),
        ({"pdl": True, "backend": "cutile"}, "ignores `pdl`"),
        ({"out_dtype": F16, "backend": "tgv"}, "writes a bfloat16 output only, got torch.float16"),
        ({"out_dtype": F32, "backend": "tinygemm"}, "writes a bfloat16 output only"),
        ({"out_dtype": F16, "backend": "cute-dsl"}, "writes a bfloat16 output only"),
    ]
    for kwargs, why in refused:
        with pytest.raises(ValueError, match=why):
            kiln.mm_bf16(a, b, **kwargs)
    # the same arguments under another name run
    kiln.mm_bf16(a, b, bias=bias, pdl=True, out_dtype=F16, backend="cudnn")
    with pytest.raises(ValueError, match="'tgv' backend writes a bfloat16 output only"):
        kiln.bmm_bf16(a[None], b[None], out_dtype=F32, backend="tgv")
    A, B, sa, sb = fp8_operands(1, 4, 16, 64, E5M2, E4M3, "cpu", g)
    with pytest.raises(ValueError, match="'cutlass' backend does not support e5m2"):
        kiln.bmm_fp8(A, B, sa, sb, BF16, backend="cutlass")
    kiln.bmm_fp8(A, B, sa, sb, BF16, backend="cublas")
    a8, b8, sa8, sb8 = groupwise_operands(4, 128, 128, "MN", "cpu", g)
    with pytest.raises(ValueError, match="supports scale_major_mode='K' only, got 'MN'"):
        kiln.gemm_fp8_nt_groupwise(a8, b8, sa8, sb8, "MN", backend="cutile")
    with pytest.raises(ValueError, match=r"'trtllm' backend needs k >= 256 \(a.shape\[1\] = 128\)"):
        kiln.gemm_fp8_nt_groupwise(a8, b8, sa8, sb8, "MN", backend="trtllm")


def test_skip_check_is_accepted():
    g = gen(50)
    a, b = rand((4, 64), 64, BF16, "cpu", g), weight(16, 64, BF16, "cpu", g, "k")
    want = ref.mm_reference_float(a, b, torch.float64)
    close(kiln.mm_bf16(a, b, skip_check=True), want, BF16)
    close(kiln.bmm_bf16(a[None], b[None], skip_check=True)[0], want, BF16)
    A, B, sa, sb = fp8_operands(1, 4, 16, 64, E4M3, E4M3, "cpu", g)
    kiln.bmm_fp8(A, B, sa, sb, BF16, skip_check=True)
    with pytest.raises(ValueError, match="b.shape\\[0\\] must equal a.shape\\[-1\\]"):
        kiln.mm_bf16(a, b[:32], skip_check=True)  # kiln checks anyway


# --- bias, output dtypes, pdl ------------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("out_dtype", [BF16, F16, F32], ids=["out_bf16", "out_f16", "out_f32"])
def test_mm_bf16_bias_and_every_output_dtype_match_the_reference(device, dtype, out_dtype):
    """out = a @ b + bias for every 16-bit input and bf16 / f16 / f32 output (the other 16-bit
    dtype included: the mma.sync kernels write it), odd n, both b layouts; bmm_bf16 likewise."""
    g = gen(51)
    for m, n, k, layout in ((1, 77, 64, "k"), (70, 130, 192, "n")):
        a, b = rand((m, k), k, dtype, device, g), weight(n, k, dtype, device, g, layout)
        bias = rand((n,), 1, dtype, device, g)
        want = ref.mm_reference_float(a, b, torch.float64)
        out = kiln.mm_bf16(a, b, bias=bias, out=nan_like((m, n), out_dtype, device), out_dtype=out_dtype)
        assert out.dtype == out_dtype
        # bias added after the product is rounded to out's dtype: two roundings, within the tolerance
        close(out, want + bias.double(), out_dtype if out_dtype != F32 else dtype)
        A, B = torch.stack([a, a]), torch.stack([b, b])
        close(kiln.bmm_bf16(A, B, out_dtype=out_dtype), torch.stack([want, want]), out_dtype)


def test_a_16_bit_output_of_the_other_dtype_takes_no_sm90_tactic():
    """The sm90 16-bit kernels write the input dtype or float32 only: the host backend answers the
    9.0 device's rules, so a bf16 -> f16 call's candidates hold no sm90 tactic, bf16 -> bf16's do."""
    mod = _jit.module(gemm.MM, torch.device("cpu"), "test", dtype=BF16)
    a, w = torch.empty(256, 512, dtype=BF16), torch.empty(1024, 512, dtype=BF16)
    for out_dtype, has_sm90 in ((F16, False), (BF16, True), (F32, True)):
        out = torch.empty(256, 1024, dtype=out_dtype)
        default, candidates = mod.mm_tactics(a=_jit.dl(a), b=_jit.dl(w.t()), out=_jit.dl(out))
        names = [mod.tactic_names[i] for i in candidates]
        assert any(n.startswith("sm90") for n in names) == has_sm90, names
        want = "sm80_128x128x64_s3" if out_dtype == F16 else "sm90_128x128x64_s6_c1"
        assert mod.tactic_names[default] == want


def test_bad_bias_and_pdl_name_the_argument():
    g = gen(52)
    a, b = rand((4, 64), 64, BF16, "cpu", g), weight(16, 64, BF16, "cpu", g, "k")
    with pytest.raises(TypeError, match="bias.dtype must be a's"):
        kiln.mm_bf16(a, b, bias=torch.zeros(16, dtype=F16))
    with pytest.raises(ValueError, match="bias must be 1-D"):
        kiln.mm_bf16(a, b, bias=torch.zeros(1, 16, dtype=BF16))
    with pytest.raises(TypeError, match="pdl must be a bool, got str"):
        kiln.mm_bf16(a, b, pdl="yes")
    for pdl in (True, None, False):  # ignored on CPU tensors
        close(kiln.mm_bf16(a, b, pdl=pdl), ref.mm_reference_float(a, b, torch.float64), BF16)


def _mm_with_pdl(x, b, bias, pdl):
    return kiln.mm_bf16(x * 2, b, bias=bias, pdl=pdl, backend="tgv")


def test_mm_bf16_with_bias_and_pdl_compiles_with_fullgraph():
    g = gen(53)
    x, b = rand((6, 64), 64, BF16, "cpu", g), weight(40, 64, BF16, "cpu", g, "k")
    bias = rand((40,), 1, BF16, "cpu", g)
    eager = _mm_with_pdl(x, b, bias, True)
    torch._dynamo.reset()
    compiled = torch.compile(_mm_with_pdl, fullgraph=True, backend="eager")(x, b, bias, True)
    assert torch.equal(eager, compiled)


@pytest.mark.gpu
def test_pdl_launches_of_every_kernel_family_wait_for_the_producer():
    """Each tactic that can run the call, asked for strictly with pdl on (the launch attribute is
    set on sm90+), right behind the kernel that writes a (and a sleeping one before it, so the
    GEMM is launched while they run): the result is the reference's, eagerly and replayed in a
    CUDA graph. On a 9.0 GPU the candidates cover every kernel family."""
    g = gen(54)
    device = torch.device("cuda", torch.cuda.current_device())
    mod = _jit.module(gemm.MM, device, "test", dtype=BF16)
    kinds = set()

    def run(t, src, a, b, out):
        a.zero_()
        torch.cuda._sleep(100_000)
        torch.mul(src, 1.0, out=a)
        mod.mm(a=_jit.dl(a), b=_jit.dl(b), out=_jit.dl(out), tactic=t, strict=True, pdl=True,
               stream=_jit.stream_of(device))

    for m, n, k in ((8, 1024, 512), (200, 512, 256)):
        src = rand((m, k), k, BF16, "cuda", g)
        b = weight(n, k, BF16, "cuda", g, "k")
        want = ref.mm_reference_float(src, b, torch.float64)
        a = torch.empty_like(src)
        out = torch.empty(m, n, dtype=BF16, device="cuda")
        _, candidates = mod.mm_tactics(a=_jit.dl(a), b=_jit.dl(b), out=_jit.dl(out))
        for t in candidates:
            kinds.add(mod.tactic_names[t].split("_")[0])
            out.fill_(float("nan"))
            run(t, src, a, b, out)
            close(out, want, BF16)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(t, src, a, b, out)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            close(out, want, BF16)
    expected = {"sm80", "small", "fallback"}
    if torch.cuda.get_device_capability() == (9, 0):
        expected.add("sm90")
    assert kinds >= expected, kinds


@pytest.mark.gpu
def test_mm_bf16_pdl_gives_the_result_without_pdl():
    g = gen(55)
    for m, n, k in ((1, 4096, 4096), (64, 1024, 1024), (1024, 2048, 512), (7, 129, 100)):
        a, b = rand((m, k), k, BF16, "cuda", g), weight(n, k, BF16, "cuda", g, "k")
        assert torch.equal(kiln.mm_bf16(a, b, pdl=True), kiln.mm_bf16(a, b))


# --- capability queries --------------------------------------------------------------------------------

DECORATED = [
    (kiln.mm_bf16, gemm.MM, gemm.MM_BF16_BACKENDS),
    (kiln.bmm_bf16, gemm.MM, gemm.BMM_BF16_BACKENDS),
    (kiln.bmm_fp8, gemm.FP8, gemm.BMM_FP8_BACKENDS),
    (kiln.gemm_fp8_nt_groupwise, gemm.FP8, gemm.GEMM_FP8_NT_GROUPWISE_BACKENDS),
    (kiln.gemm_fp8_nt_blockscaled, gemm.FP8, ()),
    (kiln.group_gemm_fp8_nt_groupwise, gemm.FP8_GROUPED, ()),
]
CCS = (70, 75, 80, 86, 87, 89, 90, 100, 103, 107, 110, 120, 121)


@pytest.mark.parametrize("fn,label,names", DECORATED, ids=lambda v: getattr(v, "__name__", None))
def test_capability_queries_answer_from_the_build_graph(fn, label, names):
    families = target_arch_families(label)
    for cc in CCS:
        want = supports(families, compute_capability_arch(cc))
        assert fn.is_compute_capability_supported(cc) == want, cc
        if names:
            assert all(fn.is_backend_supported(b, cc) == want for b in names), cc
    assert fn.is_compute_capability_supported(90) and not fn.is_compute_capability_supported(75)
    if names:
        assert fn.has_backend_choices()
        assert all(fn.has_backend(b) and fn.is_backend_supported(b) for b in names)
        assert not fn.is_backend_supported("auto") and not fn.is_backend_supported("nope", 90)
    else:  # FlashInfer's @backend_requirement({}, ...): no backend choices
        assert not fn.has_backend_choices()
        with pytest.raises(ValueError, match=f"no backend choices for {fn.__name__}"):
            fn.is_backend_supported("trtllm", 90)


def test_capability_queries_follow_a_change_of_the_arch_families(monkeypatch):
    """The answers are read from the build graph (kiln.utils.target_arch_families) on every query:
    a target that declared sm80 alone would answer no for 9.0 and 10.0."""
    sm80 = ArchFamily("sm80", ("8.0", "8.6", "8.7", "8.9"))
    monkeypatch.setattr(kiln.utils, "target_arch_families", lambda label: (sm80,))
    assert kiln.mm_bf16.is_compute_capability_supported(86)
    assert not kiln.mm_bf16.is_compute_capability_supported(90)
    assert not kiln.bmm_fp8.is_backend_supported("cutlass", 100)
    with pytest.raises(TypeError, match="a compute capability is an int"):
        kiln.mm_bf16.is_compute_capability_supported("9.0")
