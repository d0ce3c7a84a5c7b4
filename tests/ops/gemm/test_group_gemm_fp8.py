"""kiln.group_gemm_fp8_nt_groupwise (//ops/gemm:fp8_grouped) against the float64 reference of
kiln/trace/gemm.py on fresh random DeepSeek-V3-quantised inputs (activations per 1 x 128, each
expert's weight per 128 x 128 block): empty, one-row and 128-crossing segments, odd n (a partial
last n block), both scale layouts, a per-expert scale as a stride-0 view, bf16 and f16 outputs,
rows in no segment left unwritten; bad inputs matched by message; bad bounds as index errors; the
tactic rules (a misaligned view runs the fallback kernel); a hypothesis property over segment
lengths, n, k and the scale layout; torch.compile and a CUDA graph.

The host backend runs every CPU case; `-m gpu` runs them on CUDA (the sm90 wgmma kernel on an
H200) and adds DeepSeek-V3's real expert shapes (K 7168 / N 4096 and K 2048 / N 7168).
Tolerance: the reference decodes the fp8 operands exactly and sums in float64, so the CPU error
is the output's one rounding (2^-8 bf16) plus float32 accumulation; on the GPU the fp8 wgmma
adder keeps ~14 bits before each 128-block partial is promoted (kiln.trace.gemm: single
elements up to ~6 % of the rms), hence atol 0.1 at outputs ~N(0, 1)."""

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
E4M3 = torch.float8_e4m3fn
LABEL = "//ops/gemm:fp8_grouped"
TOL = {"cpu": (1e-2, 1e-2), "cuda": (2e-2, 1e-1)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def operands(lens, n, k, mode, device, g, experts=None):
    """a [rows, k] per 1 x 128, b [E, n, k] per 128 x 128 block, scales in `mode`'s layout, m_indptr."""
    e = experts or len(lens)
    rows = sum(lens)
    a, sa = ref.quantize_blocks(ref.operand((rows, k), k, g), 1, E4M3)
    w = ref.operand((e, n, k), k, g)
    qs = [ref.quantize_blocks(w[i], ref.SCALE_BLOCK, E4M3) for i in range(e)]
    b = torch.stack([q for q, _ in qs])
    sb = torch.stack([s for _, s in qs])  # [E, nb, kb]
    if mode == "MN":
        sa, sb = sa.t().contiguous(), sb.transpose(1, 2).contiguous()
    indptr = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    return a.to(device), b.to(device), sa.to(device), sb.to(device), indptr.to(device)


def close(got, want, device):
    rtol, atol = TOL[device]
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=rtol, atol=atol)


def module(device):
    return _jit.module(LABEL, torch.empty(0, device=device).device, "test", dtype=E4M3)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("mode", ["MN", "K"])
@pytest.mark.parametrize(
    "lens,n,k",
    [([5], 72, 128), ([0, 1, 130, 0, 7], 200, 256), ([41, 0, 129], 136, 384)],
    ids=["one", "empty-and-one-row", "crossing-128"],
)
def test_matches_the_reference(device, mode, lens, n, k):
    g = gen(sum(lens) + n + k + len(mode))
    a, b, sa, sb, indptr = operands(lens, n, k, mode, device, g, experts=len(lens) + 1)
    rows = sum(lens)
    out = kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode=mode)
    assert out.dtype == BF16 and out.shape == (rows, n)
    want = ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr.cpu(), mode, torch.float64)
    close(out, want, device)
    # out= f16, and rows past the last segment (one extra row here) are not written
    out16 = torch.full((rows + 1, n), float("nan"), dtype=F16, device=device)
    a1 = torch.cat([a, a[:1]])
    sa1 = torch.cat([sa, sa[:, :1]], 1) if mode == "MN" else torch.cat([sa, sa[:1]])
    kiln.group_gemm_fp8_nt_groupwise(a1, b, sa1, sb, indptr, scale_major_mode=mode, out=out16)
    close(out16[:rows], want, device)
    assert out16[rows:].isnan().all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 140), min_size=1, max_size=5),
    n=st.integers(1, 300),
    kb=st.integers(1, 3),
    mode=st.sampled_from(["MN", "K"]),
    seed=st.integers(0, 2**16),
)
def test_any_segmentation_property(lens, n, kb, mode, seed):
    """Any segment lengths (empty ones, one row, past 128), any n (partial n blocks), k of 1-3
    scale blocks, either scale layout: the reference, on the host backend."""
    g = gen(seed)
    a, b, sa, sb, indptr = operands(lens, n, 128 * kb, mode, "cpu", g)
    out = kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode=mode)
    close(out, ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr, mode, torch.float64), "cpu")


@pytest.mark.parametrize("device", device_params())
def test_a_per_expert_scale_as_a_stride_zero_view(device):
    # The MoE layer's per-expert weight scales: s [E] expanded to the block grid without a copy.
    g = gen(3)
    a, b, sa, blocks, indptr = operands([9, 0, 140], 264, 256, "K", device, g)
    s = blocks[:, 0, 0] * (0.5 + torch.rand(3, generator=g)).to(device)  # outputs ~N(0, 1) still
    sb = s[:, None, None].expand(3, 3, 2)
    out = kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode="K")
    want = ref.group_gemm_fp8_reference_float(a, b, sa, sb.contiguous(), indptr.cpu(), "K", torch.float64)
    close(out, want, device)


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    g = gen(4)
    a, b, sa, sb, indptr = operands([3, 5], 128, 256, "MN", device, g)
    api = kiln.group_gemm_fp8_nt_groupwise
    with pytest.raises(ValueError, match=r"scale_granularity_mnk \(1, 128, 64\) is not supported"):
        api(a, b, sa, sb, indptr, scale_granularity_mnk=(1, 128, 64))
    with pytest.raises(ValueError, match=r"k \(a.shape\[1\] = 200\) must be a multiple of 128"):
        api(a[:, :200], b[:, :, :200], sa, sb, indptr)
    with pytest.raises(ValueError, match=r"b.shape\[2\] must equal a.shape\[-1\] \(k = 256\)"):
        api(a, b[:, :, :128], sa, sb, indptr)
    with pytest.raises(
        ValueError, match=r"a_scale must be \[k / 128, rows\] = \[2, 8\] for scale_major_mode 'MN'"
    ):
        api(a, b, sa.t().contiguous(), sb, indptr)
    with pytest.raises(ValueError, match=r"b_scale must be \[E, ceil\(n / 128\), k / 128\] = \[2, 1, 2\]"):
        api(a, b, sa.t().contiguous(), sb, indptr, scale_major_mode="K")
    with pytest.raises(ValueError, match="scale_major_mode must be 'MN' or 'K', got 'N'"):
        api(a, b, sa, sb, indptr, scale_major_mode="N")
    with pytest.raises(ValueError, match="mma_sm must be 1 or 2"):
        api(a, b, sa, sb, indptr, mma_sm=3)
    with pytest.raises(TypeError, match=r"b.dtype must be torch.float8_e4m3fn, got torch.bfloat16"):
        api(a, b.to(BF16), sa, sb, indptr)
    with pytest.raises(TypeError, match="a_scale.dtype must be torch.float32"):
        api(a, b, sa.half(), sb, indptr)
    with pytest.raises(TypeError, match="output dtype must be torch.bfloat16 or torch.float16"):
        api(a, b, sa, sb, indptr, out_dtype=F32)
    with pytest.raises(ValueError, match="3 segments, but b holds 2 weights"):
        api(a, b, sa, sb, torch.tensor([0, 3, 5, 8], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="b must be \\[E, n, k\\] with k contiguous"):
        api(a, b.transpose(1, 2).contiguous().transpose(1, 2), sa, sb, indptr)
    with pytest.raises(TypeError, match="m_indptr must be an int32 \\(or int64\\) tensor"):
        api(a, b, sa, sb, indptr.float())


def test_bad_bounds_are_index_errors_before_anything_is_written():
    g = gen(5)
    a, b, sa, sb, _ = operands([4, 6], 128, 128, "K", "cpu", g)
    for indptr, message in [
        ([0, 4, 11], "segment 1 ends at row 11, past the 10 rows of the input"),
        ([0, 6, 4], r"segment 1 starts at row 6, outside \[0, 4\]"),
    ]:
        out = torch.full((10, 128), float("nan"), dtype=BF16)
        with pytest.raises(IndexError, match=message):
            kiln.group_gemm_fp8_nt_groupwise(
                a, b, sa, sb, torch.tensor(indptr, dtype=torch.int32), scale_major_mode="K", out=out
            )
        assert out.isnan().all()


@pytest.mark.parametrize("device", device_params())
def test_a_misaligned_view_runs_the_fallback_kernel(device):
    # The sm90 kernel's TMA needs 16-byte aligned rows; an a whose rows are 1 byte off takes the
    # fallback kernel (any alignment) and gives the same result within the tolerance.
    g = gen(6)
    a, b, sa, sb, indptr = operands([3, 9], 128, 128, "K", device, g)
    k = a.shape[1]
    buf = torch.empty(a.numel() + 16, dtype=torch.uint8, device=device)
    a_off = buf[1 : 1 + a.numel()].view(E4M3).view(a.shape)
    a_off.copy_(a)
    mod = module(device)
    mod.reset_launch_counts()
    aligned = kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode="K")
    off = kiln.group_gemm_fp8_nt_groupwise(a_off, b, sa, sb, indptr, scale_major_mode="K")
    counts = mod.launch_counts()
    assert counts.get("fallback") == 1 and counts.get("sm90_128x128x128_s6_c1") == 1, counts
    want = ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr.cpu(), "K", torch.float64)
    close(aligned, want, device)
    close(off, want, device)
    assert k == 128


def test_compiles_with_fullgraph_and_matches_eager():
    g = gen(7)
    a, b, sa, sb, indptr = operands([2, 0, 5], 136, 256, "MN", "cpu", g)

    def f(a, b, sa, sb, indptr):
        return kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr) * 2

    eager = f(a, b, sa, sb, indptr)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")(a, b, sa, sb, indptr)
    assert torch.equal(eager, compiled)


@pytest.mark.gpu
def test_cuda_graph_replays_with_new_bounds():
    g = gen(8)
    a, b, sa, sb, indptr = operands([100, 0, 300], 256, 256, "K", "cuda", g)
    out = torch.empty((400, 256), dtype=BF16, device="cuda")
    kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode="K", out=out)  # loads
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode="K", out=out)
    indptr.copy_(torch.tensor([0, 250, 260, 400], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    close(out, ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr.cpu(), "K", torch.float64), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4096, 7168), (7168, 2048)], ids=["gate-up", "down"])
def test_cuda_deepseek_v3_expert_shapes(n, k):
    # DeepSeek-V3's expert GEMMs with 16 of its 256 experts and ~T 512's rows an expert (16 x 8
    # routed rows each on average), drawn uniformly: the sm90 kernel on the real n and k.
    g = gen(n + k)
    lens = ref.segment_lengths(16 * 16, 16, g).tolist()
    a, b, sa, sb, indptr = operands(lens, n, k, "K", "cuda", g)
    mod = module("cuda")
    mod.reset_launch_counts()
    out = kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode="K")
    assert mod.launch_counts() == {"sm90_128x128x128_s6_c1": 1}
    want = ref.group_gemm_fp8_reference_float(a, b, sa, sb, indptr.cpu(), "K", torch.float32)
    close(out, want, "cuda")
    err = (out.float() - want).norm() / want.norm()
    assert err < 1e-2, float(err)
