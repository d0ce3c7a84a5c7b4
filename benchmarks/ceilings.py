"""Ceilings measured on the device itself, so each result can say how close it gets:

  copy bandwidth  a device-to-device copy of a buffer far larger than the last-level cache,
                  bytes read + written per second (median of repeats): what a memory-bound op
                  can reach.
  GEMM rate       a square matmul in the workload's dtype class (bf16 on CUDA; float32 on the
                  CPU, where bf16 GEMMs are not representative), 2 n^3 FLOPs per second: what a
                  compute-bound op can reach.

Measured once per device per process; recorded with how they were measured.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_gbps(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, 20 if device.type == "cuda" else 10)
    return 2 * nbytes / seconds / 1e9


def _gemm_tflops(device: torch.device, n: int, dtype: torch.dtype) -> float:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    y = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    seconds = _median_seconds(lambda: torch.matmul(x, y), device, 10 if device.type == "cuda" else 5)
    return 2 * n**3 / seconds / 1e12


@functools.cache
def measure(device: torch.device) -> dict:
    cuda = device.type == "cuda"
    copy_bytes = (1 << 30) if cuda else (64 << 20)
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    return {
        "copy_gbps": _copy_gbps(device, copy_bytes),
        "copy_how": f"device-to-device copy of {copy_bytes >> 20} MiB, read + write bytes, median",
        "gemm_tflops": _gemm_tflops(device, n, dtype),
        "gemm_how": f"{str(dtype).removeprefix('torch.')} matmul {n}x{n}x{n}, median",
    }
