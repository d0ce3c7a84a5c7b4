"""Re-creates FlashInfer 0.7's tests/gemm/test_group_gemm.py (the copy under tests/gemm/grouped/ is
the same test) against kiln: SegmentGEMMWrapper.run on float16 segments of equal length given as
seg_lens, weights row- or column-major, with and without weight_indices into 1024 weights, the
backend names "sm90" and "sm80"; FlashInfer's assertions (each segment, or the whole output,
against a float32 matmul rounded to float16: rtol 1e-3, atol 1e-3 / 2e-3).

kiln runs both backend names on its own grouped kernels (the sm90 kernel on a 9.0 GPU where its
alignment rules hold, else the fallback), so FlashInfer's guard "sm90 needs an SM90 device" is
left out: the "sm90" cases run on any device. FlashInfer's JIT warm-up fixture is left out too
(kiln compiles on first use). The cases with more than 8192 rows, which FlashInfer's test skips as
too large, are not generated.

FlashInfer's largest cases hold up to 32 GiB of weights (1024 x 4096 x 4096 float16): under
pytest-xdist they take turns (one_large_case_at_a_time), so the other workers' cases fit beside.

CPU: batch sizes 1 and 77, 10 rows per segment, d_in = d_out = 128 (the host backend runs float32
loops, and the float16 comparisons are slow on the CPU); both weight layouts, with and without
weight_indices, both backend names."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
import torch

import kiln as flashinfer
from kiln.runtime.lock import ModuleLock

CPU_CASES = {"batch_size": (1, 77), "num_rows_per_batch": (10,), "d_in": (128,), "d_out": (128,)}
LARGE_CASE_BYTES = 6 << 30


@contextlib.contextmanager
def one_large_case_at_a_time(device: str, nbytes: int):
    """Run a case needing `nbytes` or more than LARGE_CASE_BYTES of GPU memory while holding a lock
    every pytest process of this machine shares (flock: released if the holder dies)."""
    if device != "cuda" or nbytes < LARGE_CASE_BYTES:
        yield
        return
    path = Path(tempfile.gettempdir()) / "kiln-flashinfer-large-cases.lock"
    with ModuleLock(path, "the large FlashInfer test cases", timeout_s=3600.0, doing="running one"):
        yield
        torch.cuda.empty_cache()


def _cases():
    for batch_size in (1, 77, 199):
        for num_rows_per_batch in (3, 10, 99):
            if batch_size * num_rows_per_batch <= 8192:
                yield batch_size, num_rows_per_batch


@pytest.mark.parametrize("batch_size,num_rows_per_batch", list(_cases()))
@pytest.mark.parametrize("d_in", [128, 1024, 4096])
@pytest.mark.parametrize("d_out", [128, 1024, 4096])
@pytest.mark.parametrize("use_weight_indices", [False, True])
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16])
@pytest.mark.parametrize("backend", ["sm90", "sm80"])
def test_segment_gemm(
    batch_size, num_rows_per_batch, d_in, d_out, use_weight_indices, column_major, dtype, backend, device
):
    num_weights = 1024 if use_weight_indices else batch_size
    # the weights, and without weight_indices their float32 copy in the reference
    nbytes = num_weights * d_in * d_out * (2 if use_weight_indices else 6)
    with one_large_case_at_a_time(device, nbytes):
        _segment_gemm(batch_size, num_rows_per_batch, d_in, d_out, use_weight_indices, column_major, dtype,
                      backend, device)


def _segment_gemm(batch_size, num_rows_per_batch, d_in, d_out, use_weight_indices, column_major, dtype,
                  backend, device):
    torch.manual_seed(42)
    workspace_buffer = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=device)
    segment_gemm = flashinfer.gemm.SegmentGEMMWrapper(workspace_buffer, backend=backend)
    x = torch.randn(batch_size * num_rows_per_batch, d_in, dtype=dtype, device=device)
    if use_weight_indices:
        num_weights = 1024
        if column_major:
            weight = torch.randn(num_weights, d_out, d_in, dtype=dtype, device=device)
        else:
            weight = torch.randn(num_weights, d_in, d_out, dtype=dtype, device=device)
    else:
        if column_major:
            weight = torch.randn(batch_size, d_out, d_in, dtype=dtype, device=device)
        else:
            weight = torch.randn(batch_size, d_in, d_out, dtype=dtype, device=device)
    y = segment_gemm.run(
        x,
        weight,
        batch_size,
        weight_column_major=column_major,
        seg_lens=torch.full((batch_size,), num_rows_per_batch, dtype=torch.int64),
        weight_indices=(
            (torch.arange(0, batch_size, device=device) % num_weights) if use_weight_indices else None
        ),
    )

    if use_weight_indices:
        for i in range(batch_size):
            rows = slice(i * num_rows_per_batch, (i + 1) * num_rows_per_batch)
            w = weight[i % num_weights].float()
            torch.testing.assert_close(
                y[rows],
                torch.matmul(x[rows].float(), w.T if column_major else w).to(dtype),
                rtol=1e-3,
                atol=1e-3,
            )
    else:
        torch.testing.assert_close(
            y,
            torch.matmul(
                x.view(batch_size, num_rows_per_batch, d_in).float(),
                weight.float().transpose(-1, -2) if column_major else weight.float(),
            )
            .view(batch_size * num_rows_per_batch, d_out)
            .to(dtype),
            rtol=1e-3,
            atol=2e-3,
        )
