"""Re-creates FlashInfer 0.7's tests/gemm/test_groupwise_scaled_gemm_fp8.py against kiln: the fp8
GEMMs with DeepSeek-V3 groupwise scales, gemm_fp8_nt_blockscaled (128 x 128 blocks of both
operands), gemm_fp8_nt_groupwise (1 x 128 x 128 blocks; the backend names "cutlass", "trtllm",
"cutile"; small batches; the cuTile output dtypes and its refusal of MN-major scales) and
group_gemm_fp8_nt_groupwise (1, 2, 4 or 8 equal segments), with FlashInfer's assertions (against
the product of the dequantized operands: atol 1e-2, rtol 1e-2). The operands are quantized per
tile with power-of-two scales as FlashInfer's test does, by this module's own quantize_fp8 /
dequantize_fp8.

kiln runs every backend name on its own sm90 kernels (and its fallback and host backends), so the
cases FlashInfer runs only on SM100 / SM110 / SM120 run here on any device, and its cuda-tile
availability check is left out. Where FlashInfer's test skips a call its backend refuses, kiln
refuses it too and the case checks the refusal: cuTile with MN-major scales, TensorRT-LLM with k
below 256.

Not claimed (skipped, named): group_deepgemm_fp8_nt_groupwise and batch_deepgemm_fp8_nt_groupwise
(DeepGEMM's m_indices and masked layouts), and the TensorRT-LLM backend given K-major scales
(FlashInfer's kernel reads its own scale layout; its test skips the combination). FlashInfer's
`solo` marker is left out: the largest cases (up to ~14 GiB) take turns instead
(one_large_case_at_a_time).

CPU (the host backend runs float32 loops): m 128 (128 and 256 block-scaled, 1 and 4 for the small
batches, 4 and 128 for the grouped GEMM), n 128 and 256, k 128 and 256, one or two groups; both
scale layouts, every backend name, both output dtypes."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.gemm import gemm_fp8_nt_blockscaled, gemm_fp8_nt_groupwise, group_gemm_fp8_nt_groupwise
from tests.flashinfer.conftest import not_claimed
from tests.flashinfer.test_group_gemm import one_large_case_at_a_time

FP8 = torch.float8_e4m3fn


def quantize_fp8(x: torch.Tensor, scale_shape, tile_shape, scale_major_mode: str):
    """x ([rows, cols] or [groups, rows, cols]) as e4m3 per tile of `tile_shape`, with one float32
    scale per tile: the smallest power of two >= the tile's |max| (at least 1e-4) / e4m3's largest
    value. The scales in the K layout are the tile grid ([.., rows / tr, cols / tc]); in the MN
    layout its transpose in the last two dimensions; `scale_shape` (FlashInfer's argument) must be
    the shape of the layout asked for."""
    tr, tc = tile_shape[-2:]
    *lead, rows, cols = x.shape
    tiles = x.float().reshape(*lead, rows // tr, tr, cols // tc, tc)
    amax = tiles.abs().amax(dim=(-3, -1)).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(FP8).max)))
    q = (tiles / scale[..., :, None, :, None]).reshape(x.shape).to(FP8)
    grid = scale if scale_major_mode == "K" else scale.transpose(-2, -1)
    assert tuple(grid.shape) == tuple(scale_shape), (tuple(grid.shape), tuple(scale_shape))
    return q, grid.contiguous()


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, scale_major_mode: str) -> torch.Tensor:
    """q times its tile's scale, in float32 (the scales in the layout quantize_fp8 returned)."""
    grid = scale if scale_major_mode == "K" else scale.transpose(-2, -1)
    *lead, rows, cols = q.shape
    tr, tc = rows // grid.shape[-2], cols // grid.shape[-1]
    return q.float() * grid.repeat_interleave(tr, dim=-2).repeat_interleave(tc, dim=-1)


def _operands(m, n, k, scale_major_mode, device, groups=None, a_rows=1):
    """FlashInfer's operands: a [m, k] ~ N(0, 1) per a_rows x 128 tile, b [n, k] (or [groups, n,
    k]) ~ N(0, 1 / k) per 128 x 128 tile, quantized, and the dequantized ones."""
    tile_size = 128
    b_shape = (n, k) if groups is None else (groups, n, k)
    a_val = torch.randn((m, k), dtype=torch.float, device=device)
    b_val = torch.randn(b_shape, dtype=torch.float, device=device) / math.sqrt(k)
    lead = () if groups is None else (groups,)
    if scale_major_mode == "K":
        a_scale_shape = (m // a_rows, k // tile_size)
        b_scale_shape = (*lead, n // tile_size, k // tile_size)
    else:
        a_scale_shape = (k // tile_size, m // a_rows)
        b_scale_shape = (*lead, k // tile_size, n // tile_size)
    a_fp8, a_scale = quantize_fp8(a_val, a_scale_shape, (a_rows, tile_size), scale_major_mode)
    b_fp8, b_scale = quantize_fp8(b_val, b_scale_shape, (*((1,) * len(lead)), tile_size, tile_size),
                                  scale_major_mode)
    return a_fp8, b_fp8, a_scale, b_scale, dequantize_fp8(a_fp8, a_scale, scale_major_mode), \
        dequantize_fp8(b_fp8, b_scale, scale_major_mode)


@pytest.mark.parametrize("m", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("n", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("k", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("scale_major_mode", ["MN", "K"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16])
@pytest.mark.cpu_cases(m=(128, 256), n=(128,), k=(256,))
def test_fp8_blockscale_gemm(m, n, k, scale_major_mode, out_dtype, device):
    torch.random.manual_seed(0)
    with one_large_case_at_a_time(device, 16 * (m * k + n * k + m * n)):
        a_fp8, b_fp8, a_scale, b_scale, a_dequant, b_dequant = _operands(
            m, n, k, scale_major_mode, device, a_rows=128
        )
        ref_c = torch.einsum("mk,nk->mn", a_dequant, b_dequant).to(out_dtype)
        c = gemm_fp8_nt_blockscaled(a_fp8, b_fp8, a_scale, b_scale, scale_major_mode, out_dtype=out_dtype)
        torch.testing.assert_close(c, ref_c, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("n", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("k", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("scale_major_mode", ["MN", "K"])
@pytest.mark.parametrize("backend", ["cutlass", "trtllm", "cutile"])
@pytest.mark.cpu_cases(m=(128,), n=(128, 256), k=(128, 256))
def test_fp8_groupwise_gemm(m, n, k, scale_major_mode, backend, device):
    if backend == "trtllm" and scale_major_mode != "MN":
        not_claimed("gemm_fp8_nt_groupwise(backend='trtllm') with K-major scales (FlashInfer's "
                    "TensorRT-LLM kernel reads its own layout; its test skips the combination)")
    torch.random.manual_seed(0)
    out_dtype = torch.bfloat16
    with one_large_case_at_a_time(device, 16 * (m * k + n * k + m * n)):
        a_fp8, b_fp8, a_scale, b_scale, a_dequant, b_dequant = _operands(m, n, k, scale_major_mode, device)
        ref_c = torch.einsum("mk,nk->mn", a_dequant, b_dequant).to(out_dtype)
        if backend == "trtllm":
            b_scale = b_scale.t().contiguous()

        def call():
            return gemm_fp8_nt_groupwise(
                a_fp8, b_fp8, a_scale, b_scale, scale_major_mode, out_dtype=out_dtype, backend=backend
            )

        if backend == "trtllm" and k < 256:
            with pytest.raises(ValueError, match="k >= 256"):
                call()
            return
        if backend == "cutile" and scale_major_mode != "K":
            with pytest.raises(ValueError, match="scale_major_mode='K' only"):
                call()
            return
        c = call()
        torch.testing.assert_close(c, ref_c, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [1, 4, 16, 32])
@pytest.mark.parametrize("n", [128, 256])
@pytest.mark.parametrize("k", [256])
@pytest.mark.parametrize("scale_major_mode", ["MN", "K"])
@pytest.mark.cpu_cases(m=(1, 4), n=(128,))
def test_fp8_groupwise_gemm_small_batch_size(m, n, k, scale_major_mode, device):
    torch.random.manual_seed(0)
    out_dtype = torch.bfloat16
    a_fp8, b_fp8, a_scale, b_scale, a_dequant, b_dequant = _operands(m, n, k, scale_major_mode, device)
    ref_c = torch.einsum("mk,nk->mn", a_dequant, b_dequant).to(out_dtype)
    c = gemm_fp8_nt_groupwise(
        a_fp8, b_fp8, a_scale, b_scale, scale_major_mode, out_dtype=out_dtype, backend="cutlass"
    )
    torch.testing.assert_close(c, ref_c, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [4, 128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("n", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("k", [128, 256, 512, 4096, 8192])
@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
@pytest.mark.parametrize("scale_major_mode", ["MN", "K"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16])
@pytest.mark.cpu_cases(m=(4, 128), n=(128,), k=(256,), group_size=(1, 2))
def test_fp8_groupwise_group_gemm(m, n, k, group_size, scale_major_mode, out_dtype, device):
    torch.random.manual_seed(0)
    rows = group_size * m
    with one_large_case_at_a_time(device, 16 * (rows * k + group_size * n * k + rows * n)):
        a_fp8, b_fp8, a_scale, b_scale, a_dequant, b_dequant = _operands(
            rows, n, k, scale_major_mode, device, groups=group_size
        )
        m_indptr = torch.arange(0, group_size + 1, dtype=torch.int32, device=device) * m
        out = group_gemm_fp8_nt_groupwise(
            a_fp8, b_fp8, a_scale, b_scale, m_indptr, scale_major_mode=scale_major_mode, out_dtype=out_dtype
        )
        ref_c = (
            torch.einsum("bmk,bnk->bmn", a_dequant.view((group_size, m, k)), b_dequant)
            .reshape((rows, n))
            .to(out_dtype)
        )
        torch.testing.assert_close(out, ref_c, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [128, 256, 512, 1024])
@pytest.mark.parametrize("nk", [(128, 512), (512, 128), (4096, 7168), (7168, 2048)])
@pytest.mark.parametrize("group_size", [1, 4, 8, 64, 128, 256])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16])
@pytest.mark.cpu_cases(m=(128,), nk=((128, 512),), group_size=(1,))
def test_fp8_groupwise_group_deepgemm(m, nk, group_size, out_dtype, device):
    not_claimed("group_deepgemm_fp8_nt_groupwise (DeepGEMM's contiguous layout: a group index per row)")


@pytest.mark.parametrize("n,k", [(256, 128), (256, 4096)])
@pytest.mark.cuda_only
def test_fp8_groupwise_group_cute_dsl_current_stream(n, k, device):
    not_claimed("group_deepgemm_fp8_nt_groupwise (DeepGEMM's contiguous layout, its CuTe-DSL backend)")


@pytest.mark.parametrize("m", [128, 256, 512, 1024])
@pytest.mark.parametrize("nk", [(128, 512), (512, 128), (4096, 7168), (7168, 2048)])
@pytest.mark.parametrize("group_size", [1, 4, 8, 64, 128, 256])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16])
@pytest.mark.cpu_cases(m=(128,), nk=((128, 512),), group_size=(1,))
def test_fp8_groupwise_batch_deepgemm_masked(m, nk, group_size, out_dtype, device):
    not_claimed("batch_deepgemm_fp8_nt_groupwise (DeepGEMM's masked batch layout, masked_m)")


@pytest.mark.parametrize("m", [128, 512])
@pytest.mark.parametrize("n", [256, 4096])
@pytest.mark.parametrize("k", [256, 2048])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.cpu_cases(m=(128,), n=(256,), k=(256,))
def test_gemm_fp8_nt_groupwise_cutile_out_dtypes(m, n, k, out_dtype, device):
    torch.random.manual_seed(0)
    scale_major_mode = "K"
    a_fp8, b_fp8, a_scale, b_scale, a_dequant, b_dequant = _operands(m, n, k, scale_major_mode, device)
    ref_c = torch.einsum("mk,nk->mn", a_dequant, b_dequant).to(out_dtype)
    c = gemm_fp8_nt_groupwise(
        a=a_fp8,
        b=b_fp8,
        a_scale=a_scale,
        b_scale=b_scale,
        scale_major_mode=scale_major_mode,
        mma_sm=1,
        out_dtype=out_dtype,
        backend="cutile",
    )
    torch.testing.assert_close(c, ref_c, atol=1e-2, rtol=1e-2)


def test_gemm_fp8_nt_groupwise_cutile_rejects_mn_scale_major(device):
    torch.random.manual_seed(0)
    m, n, k = 128, 1024, 2048
    tile_size = 128
    a_val = torch.randn((m, k), dtype=torch.float, device=device)
    b_val = torch.randn((n, k), dtype=torch.float, device=device)
    a_fp8, a_scale = quantize_fp8(a_val, (k // tile_size, m), (1, tile_size), "MN")
    b_fp8, b_scale = quantize_fp8(b_val, (k // tile_size, n // tile_size), (tile_size, tile_size), "MN")
    with pytest.raises(ValueError, match="scale_major_mode='K' only"):
        gemm_fp8_nt_groupwise(
            a=a_fp8,
            b=b_fp8,
            a_scale=a_scale,
            b_scale=b_scale,
            scale_major_mode="MN",
            mma_sm=1,
            out_dtype=torch.bfloat16,
            backend="cutile",
        )
