"""Re-creates FlashInfer 0.7's tests/gemm/test_mm_bf16.py against kiln: its curated smoke cases of
mm_bf16 (every backend name, bias, pdl, bf16 / fp16 / fp32 outputs, with and without autotuning),
the cuTile backend's refusal of bias and pdl and its repeatable tuned result, and the CuTe-DSL
low-M cases, with FlashInfer's assertions (cosine similarity > 0.99; the CuTe-DSL cases also
against a float32 reference within rtol 2e-2, atol 5e-2).

kiln runs every backend name on its own kernels (kiln.gemm: the names choose no library), so the
cases FlashInfer runs only where its libraries are (cuDNN, cuda-tile, nvidia-cutlass-dsl, SM100 for
CUTLASS / TGV / CuTe-DSL) run here on any device, and FlashInfer's availability checks are left out;
mm_bf16.is_compute_capability_supported / is_backend_supported still gate the CUDA cases, answered
from kiln's build graph. FlashInfer's guards against combinations none of its cases has (auto,
CUTLASS or cuTile with bias or pdl, a non-bfloat16 output for TGV / TinyGEMM, fp16 out for cuDNN on
SM103) are left out with them.

Left out: test_cublaslt_bf16_runner_zero_algos, which patches FlashInfer's cuBLASLt runner object
(gemm_base.get_mm_bf16_cublaslt_module): not_claimed.

CPU: the cases with m in 1, 8, 32, 33 and k up to 8320 but 7168 (the host backend runs float32
loops at ~2 GFLOP/s; autotuning times every tactic): every backend name, bias, pdl, each output
dtype and one tuned case."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln import autotune, mm_bf16
from kiln.utils import get_compute_capability
from tests.flashinfer.conftest import not_claimed

CPU_CASES = {"m": (1, 8, 32, 33), "k": (512, 1024, 2048, 3072, 8320)}

_SMOKE_CASES = [
    # m, n, k, res_dtype, enable_bias, pdl, backend, auto_tuning
    (1, 1024, 2048, torch.bfloat16, True, False, "cudnn", False),
    (16, 4096, 1024, torch.float16, False, True, "cudnn", True),
    (64, 2048, 3072, torch.float32, True, True, "cudnn", False),
    (8, 1024, 1024, torch.bfloat16, False, False, "cutlass", True),
    (32, 4096, 3072, torch.float32, False, False, "cutlass", False),
    (1, 2048, 1024, torch.bfloat16, True, True, "tgv", False),
    (64, 1024, 2048, torch.bfloat16, False, True, "tgv", True),
    (16, 2048, 2048, torch.bfloat16, False, False, "cublaslt", True),
    (16, 2048, 2048, torch.bfloat16, True, False, "cublaslt", True),
    (8, 4096, 3072, torch.float16, False, False, "cublaslt", False),
    (1, 1024, 3072, torch.bfloat16, True, False, "tinygemm", False),
    (32, 1024, 1024, torch.bfloat16, False, False, "cutile", False),
    (25, 2048, 1024, torch.bfloat16, False, False, "cute-dsl", False),
    (8, 768, 7168, torch.bfloat16, True, True, "cute-dsl", True),
    (17, 2304, 1536, torch.bfloat16, False, False, "cute-dsl", False),
    (8, 768, 8320, torch.bfloat16, False, False, "cute-dsl", False),
    (33, 256, 512, torch.bfloat16, True, True, "cute-dsl", False),
    (64, 256, 512, torch.bfloat16, True, True, "cute-dsl", False),
    (64, 4096, 2048, torch.bfloat16, False, False, "auto", True),
    (1, 2048, 3072, torch.float16, False, False, "auto", False),
]


def _capability(device: str) -> int | None:
    """The device's compute capability as FlashInfer's tests compute it; None on the CPU."""
    if device != "cuda":
        return None
    major, minor = get_compute_capability(torch.device(device))
    return major * 10 + minor


def _require(backend: str | None, device: str) -> None:
    """FlashInfer's capability gate, answered by kiln's build graph (never fires on the H200)."""
    cc = _capability(device)
    if cc is None:
        return
    if not mm_bf16.is_compute_capability_supported(cc):
        not_claimed(f"mm_bf16 on compute capability {cc}")
    if backend not in (None, "auto") and not mm_bf16.is_backend_supported(backend, cc):
        not_claimed(f"mm_bf16's {backend} backend on compute capability {cc}")


@pytest.mark.parametrize("m,n,k,res_dtype,enable_bias,pdl,backend,auto_tuning", _SMOKE_CASES)
def test_mm_bf16(m, n, k, res_dtype, enable_bias, pdl, backend, auto_tuning, device):
    _require(backend, device)
    torch.manual_seed(42)
    input = torch.randn([m, k], device=device, dtype=torch.bfloat16)
    mat2 = torch.randn([n, k], device=device, dtype=torch.bfloat16)

    if enable_bias:
        bias = torch.randn(n, device=device, dtype=torch.bfloat16)
        reference = F.linear(input, mat2, bias)
    else:
        bias = None
        reference = torch.mm(input, mat2.T)

    out = torch.empty([m, n], device=device, dtype=res_dtype)
    with autotune(auto_tuning):
        mm_bf16(input, mat2.T, bias, pdl, out, res_dtype, backend)

    cos_sim = F.cosine_similarity(reference.reshape(-1), out.reshape(-1), dim=0)
    assert cos_sim > 0.99
    if backend == "cute-dsl":
        fp32_reference = F.linear(
            input.float(), mat2.float(), bias.float() if bias is not None else None
        ).to(res_dtype)
        torch.testing.assert_close(out, fp32_reference, rtol=2e-2, atol=5e-2)


def test_mm_bf16_cutile_rejects_bias_and_pdl(device):
    _require("cutile", device)
    a = torch.randn(64, 1024, device=device, dtype=torch.bfloat16)
    b = torch.randn(2048, 1024, device=device, dtype=torch.bfloat16)
    bias = torch.randn(2048, device=device, dtype=torch.bfloat16)
    out = torch.empty(64, 2048, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ignores `bias`"):
        mm_bf16(a, b.T, bias, False, out, torch.bfloat16, backend="cutile")
    with pytest.raises(ValueError, match="ignores `pdl`"):
        mm_bf16(a, b.T, None, True, out, torch.bfloat16, backend="cutile")


def test_mm_bf16_cutile_repeat_uses_tune_cache(device):
    _require("cutile", device)
    a = torch.randn(64, 1024, device=device, dtype=torch.bfloat16)
    b = torch.randn(2048, 1024, device=device, dtype=torch.bfloat16)
    out = torch.empty(64, 2048, device=device, dtype=torch.bfloat16)

    mm_bf16(a, b.T, None, False, out, torch.bfloat16, backend="cutile")
    out_first = out.clone()
    mm_bf16(a, b.T, None, False, out, torch.bfloat16, backend="cutile")
    torch.testing.assert_close(
        out_first, out, rtol=0, atol=0, msg="tune-cache reuse produced divergent output"
    )


def test_cublaslt_bf16_runner_zero_algos(device):
    not_claimed("FlashInfer's cuBLASLt runner object (gemm_base.get_mm_bf16_cublaslt_module, _get_algos)")


@pytest.mark.parametrize("pdl", [False, True])
def test_mm_bf16_cute_dsl_direct_fallback(pdl, device):
    _require("cute-dsl", device)
    m, n, k = 1, 256, 8192
    a = torch.randn((m, k), device=device, dtype=torch.bfloat16)
    b = torch.randn((n, k), device=device, dtype=torch.bfloat16)
    out = mm_bf16(a, b.T, pdl=pdl, backend="cute-dsl")
    reference = a @ b.T
    cos_sim = F.cosine_similarity(reference.reshape(-1), out.reshape(-1), dim=0)
    assert cos_sim > 0.99


@pytest.mark.parametrize("enable_bias", [False, True])
def test_mm_bf16_cute_dsl_one_stage_splitk(enable_bias, device):
    _require("cute-dsl", device)
    m, n, k = 1, 1024, 128
    a = torch.randn((m, k), device=device, dtype=torch.bfloat16)
    b = torch.randn((n, k), device=device, dtype=torch.bfloat16)
    bias = torch.randn((n,), device=device, dtype=torch.bfloat16) if enable_bias else None
    out = mm_bf16(a, b.T, bias=bias, pdl=True, backend="cute-dsl")
    reference = F.linear(a, b, bias)
    cos_sim = F.cosine_similarity(reference.reshape(-1), out.reshape(-1), dim=0)
    assert cos_sim > 0.99
