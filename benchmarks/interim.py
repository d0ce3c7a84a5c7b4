"""Timing helpers of the interim bench_norm.py (removed: `python -m benchmarks run rmsnorm`
replaces it), kept only for benchmarks/bench_decode.py, the interim decode benchmark. Delete this
file with bench_decode.py when decode has its harness routine (docs/benchmarks.md shows how).
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import torch


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * n / statistics.median(times)


def stats(per_call_s):
    return {
        "median_us": statistics.median(per_call_s) * 1e6,
        "mean_us": statistics.fmean(per_call_s) * 1e6,
        "std_us": statistics.pstdev(per_call_s) * 1e6,
        "min_us": min(per_call_s) * 1e6,
        "max_us": max(per_call_s) * 1e6,
    }


def time_backend(fn, xs, ws, outs, n, repeats, mode):
    k = len(xs)

    def batch():
        for i in range(n):
            fn(xs[i % k], ws[i % k], outs[i % k])

    for _ in range(3):
        batch()
    torch.cuda.synchronize()
    if mode == "cuda_graph":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            batch()
        run = g.replay
    else:
        run = batch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(repeats):
        start.record()
        run()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e-3 / n)
    return per_call


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"
