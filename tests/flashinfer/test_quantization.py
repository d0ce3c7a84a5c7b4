"""Re-creates FlashInfer 0.7's tests/utils/test_quantization.py against kiln: packbits and
segment_packbits (flashinfer.quantization) against numpy.packbits, with FlashInfer's
parametrisations, calls and assertions.

Left out: test_int4_dequantize_handles_partial_group_tail, whose int4_quantize / INT4Tensor /
int4_dequantize are newer than FlashInfer 0.7.2.
"""

from __future__ import annotations

from typing import Literal

import numpy
import pytest
import torch

import kiln as flashinfer

# Every size is cheap on the host backend too (the largest is a million booleans): none is shrunk.
CPU_CASES: dict = {}


def numpy_packbits_ref(x_cpu: torch.Tensor, bitorder: Literal["big", "little"]):
    return torch.tensor(numpy.packbits(x_cpu.numpy(), bitorder=bitorder))


@pytest.mark.parametrize("num_elements", [1, 10, 99, 128, 999, 5000, 131072, 999999])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits(device, num_elements, bitorder):
    torch.manual_seed(42)
    x_cpu = torch.rand(num_elements) < 0.5
    x_gpu = x_cpu.to(device)
    x_packed_ref = numpy_packbits_ref(x_cpu, bitorder)
    x_packed = flashinfer.quantization.packbits(x_gpu, bitorder)

    assert torch.equal(x_packed_ref.cpu(), x_packed.cpu())


@pytest.mark.parametrize("batch_size", [1, 10, 99, 128, 777, 999])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_segment_packbits(device, batch_size, bitorder):
    torch.manual_seed(42)
    old_indptr = torch.cumsum(torch.arange(batch_size + 1), 0).to(device)
    num_elements = old_indptr[-1].item()
    x_cpu = torch.rand(num_elements) < 0.5
    x_gpu = x_cpu.to(device)

    y_gpu, new_indptr = flashinfer.quantization.segment_packbits(x_gpu, old_indptr, bitorder)

    for i in range(batch_size):
        x_segment_i = x_gpu[old_indptr[i] : old_indptr[i + 1]]
        y_segment_i_ref = flashinfer.packbits(x_segment_i, bitorder)
        assert torch.equal(y_gpu[new_indptr[i] : new_indptr[i + 1]], y_segment_i_ref)
