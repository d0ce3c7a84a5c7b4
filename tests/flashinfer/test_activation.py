"""Re-creates FlashInfer 0.7's tests/utils/test_activation.py against kiln (``import kiln as
flashinfer``): silu_and_mul, gelu_tanh_and_mul and gelu_and_mul over FlashInfer's shapes with
enable_pdl on and off, rows that do not depend on how many are launched together, and two
dependent launches captured in a CUDA graph.

FlashInfer's parametrisations, calls and tolerances are kept; the references are kiln's own
(python/kiln/trace/activation.py, float64, rounded to the dtype).

Differences, and what was left out:
- FlashInfer skips enable_pdl=True below sm90; kiln ignores the flag there and on the CPU, so
  those cases run.
- The module fixture that pre-builds FlashInfer's JIT modules is left out: kiln compiles a module
  on its first use.
- On the CPU the batch-split test stands in 4 for the GPU's multiprocessor count.
"""

from __future__ import annotations

import pytest
import torch

import kiln as flashinfer
from kiln.trace.activation import act_and_mul_float64

CPU_CASES = {"dim": (128, 855), "batch_size": (1, 2), "seq_len": (1, 4)}
CPU_SMS = 4  # the multiprocessor count the CPU run stands in


def reference(act, x):
    return act_and_mul_float64(x, act).to(x.dtype)


@pytest.mark.parametrize("dim", [128, 256, 512, 855, 1710, 2048, 3420, 4096, 11008, 16384])
@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("seq_len", [1, 2, 4, 8, 16, 32, 64, 128, 512])
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_fused_silu_mul(device, dim, batch_size, seq_len, enable_pdl):
    x = torch.randn(batch_size, seq_len, 2 * dim).to(device).to(torch.float16)
    y_ref = reference("silu", x)
    y = flashinfer.activation.silu_and_mul(x, enable_pdl=enable_pdl)
    torch.testing.assert_close(y_ref, y, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dim", [128, 256, 512, 855, 1710, 2048, 3420, 4096, 11008, 16384])
@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("seq_len", [1, 2, 4, 8, 16, 32, 64, 128, 512])
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_fused_gelu_tanh_mul(device, dim, batch_size, seq_len, enable_pdl):
    x = torch.randn(batch_size, seq_len, 2 * dim).to(device).to(torch.float16)
    y_ref = reference("gelu_tanh", x)
    y = flashinfer.activation.gelu_tanh_and_mul(x, enable_pdl=enable_pdl)
    torch.testing.assert_close(y_ref, y, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dim", [128, 256, 512, 855, 1710, 2048, 3420, 4096, 11008, 16384])
@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("seq_len", [1, 2, 4, 8, 16, 32, 64, 128, 512])
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_fused_gelu_mul(device, dim, batch_size, seq_len, enable_pdl):
    x = torch.randn(batch_size, seq_len, 2 * dim).to(device).to(torch.float16)
    y_ref = reference("gelu", x)
    y = flashinfer.activation.gelu_and_mul(x, enable_pdl=enable_pdl)
    torch.testing.assert_close(y_ref, y, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [855, 1710, 3420, 4096, 14336, 28672])
def test_act_and_mul_small_batch_split(device, act, dtype, dim):
    # A few rows spread each row over several CTAs, many rows give each its own: a row's output
    # must not depend on how many rows are launched with it.
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else CPU_SMS
    x = torch.randn(8 * num_sms, 2 * dim, device=device, dtype=dtype)
    fn = getattr(flashinfer.activation, f"{act}_and_mul")
    y = fn(x)
    y_ref = reference(act, x)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    sizes = [1, 3, num_sms - 1, num_sms, num_sms + 1, 2 * num_sms - 1, 2 * num_sms]
    for num_tokens in sizes:
        torch.testing.assert_close(fn(x[:num_tokens]), y[:num_tokens], rtol=0, atol=0)


@pytest.mark.cuda_only
def test_act_and_mul_cuda_graph(device):
    # Two launches back to back in a graph, the second reading the first one's output: on sm90+,
    # where enable_pdl defaults to on, the second waits on the first through PDL.
    x = torch.randn(4, 2 * 14336, device=device, dtype=torch.bfloat16)
    y1 = torch.full((4, 14336), float("nan"), device=device, dtype=torch.bfloat16)
    y2 = torch.full((4, 7168), float("nan"), device=device, dtype=torch.bfloat16)
    y1_ref = flashinfer.activation.silu_and_mul(x)
    y2_ref = flashinfer.activation.gelu_and_mul(y1_ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.activation.silu_and_mul(x, out=y1)
        flashinfer.activation.gelu_and_mul(y1, out=y2)
    graph.replay()
    torch.testing.assert_close(y1, y1_ref, rtol=0, atol=0)
    torch.testing.assert_close(y2, y2_ref, rtol=0, atol=0)
