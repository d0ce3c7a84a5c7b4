"""Re-creates FlashInfer 0.7's tests/gemm/test_bmm_bf16.py against kiln: bmm_bf16 on bfloat16
inputs with a column-major B (the transpose view of [b, n, k]), bfloat16 and float16 outputs, the
"cutlass" and "cudnn" backend names, under autotuning; FlashInfer's assertion (cosine similarity to
torch.bmm > 0.99).

kiln runs both backend names on its own kernels, so the cases FlashInfer runs only on SM100
(CUTLASS) or with cuDNN installed run here on any device; bmm_bf16.is_compute_capability_supported /
is_backend_supported, answered from kiln's build graph, still gate the CUDA cases. FlashInfer's
guard for cuDNN's fp16 output on SM103 is left out (kiln has no such hole).

CPU: b = 1, m = 48, k = 64 (the host backend runs float32 loops and autotuning times every tactic);
both n, output dtypes and backend names."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln import autotune, bmm_bf16
from kiln.utils import get_compute_capability
from tests.flashinfer.conftest import not_claimed

CPU_CASES = {"b": (1,), "m": (48,), "k": (64,)}


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("m", [48, 128])
@pytest.mark.parametrize("n", [80, 64])
@pytest.mark.parametrize("k", [64, 256])
@pytest.mark.parametrize("res_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["cutlass", "cudnn"])
def test_bmm_bf16(b, m, n, k, res_dtype, backend, device):
    if device == "cuda":
        major, minor = get_compute_capability(torch.device(device))
        cc = major * 10 + minor
        if not bmm_bf16.is_compute_capability_supported(cc):
            not_claimed(f"bmm_bf16 on compute capability {cc}")
        if not bmm_bf16.is_backend_supported(backend, cc):
            not_claimed(f"bmm_bf16's {backend} backend on compute capability {cc}")
    torch.manual_seed(7)
    input = torch.randn([b, m, k], device=device, dtype=torch.bfloat16)
    mat2 = torch.randn([b, n, k], device=device, dtype=torch.bfloat16).transpose(-2, -1)
    reference = torch.bmm(input, mat2)

    out = torch.empty([b, m, n], device=device, dtype=res_dtype)
    with autotune():
        bmm_bf16(input, mat2, out=out, out_dtype=res_dtype, backend=backend)

    cos_sim = F.cosine_similarity(reference.reshape(-1), out.reshape(-1), dim=0)
    assert cos_sim > 0.99
