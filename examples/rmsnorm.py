"""kiln.rmsnorm against torch on this machine: correctness, then timing.

Runs on the GPU when one is present (CUDA kernels), else on the CPU (kiln's host backend). For
each shape it checks kiln and torch.nn.functional.rms_norm against a float64 reference, then times
both (median of repeated calls: CUDA events on a GPU, wall clock on the CPU) and prints a table.
This is an example, not the benchmark of record: `python -m benchmarks run rmsnorm` is.

    python examples/rmsnorm.py [--device cpu|cuda] [--dtype bf16|f16|f32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import kiln

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def reference(x, w, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def median_us(fn, device, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    args = ap.parse_args()
    dtype, device, eps = DTYPES[args.dtype], args.device, 1e-6
    shapes = [(1, 4096), (128, 4096), (4096, 4096)] + ([(16384, 8192)] if device == "cuda" else [])
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (kiln host backend)"
    print(f"kiln {kiln.__version__} | torch {torch.__version__} | {name} | {args.dtype}")
    print(f"{'tokens x hidden':>16} {'max |kiln-ref|':>15} {'max |torch-ref|':>16} "
          f"{'kiln us':>9} {'torch us':>9} {'kiln GB/s':>10}")
    ok = True
    for rows, hidden in shapes:
        x = torch.randn(rows, hidden, device=device).to(dtype)
        w = torch.randn(hidden, device=device).to(dtype)
        ref = reference(x, w, eps)
        y_kiln = kiln.rmsnorm(x, w, eps=eps)
        y_torch = F.rms_norm(x, (hidden,), w, eps=eps)
        err_kiln = (y_kiln.double() - ref).abs().max().item()
        err_torch = (y_torch.double() - ref).abs().max().item()
        tol = {torch.bfloat16: 0.05, torch.float16: 0.01, torch.float32: 1e-4}[dtype] * max(
            1.0, ref.abs().max().item() / 8)
        ok &= err_kiln <= tol
        reps = 50 if device == "cuda" else 5
        t_kiln = median_us(lambda x=x, w=w: kiln.rmsnorm(x, w, eps=eps), device, reps)
        t_torch = median_us(lambda x=x, w=w: F.rms_norm(x, x.shape[-1:], w, eps=eps), device, reps)
        gbs = (2 * x.numel() + w.numel()) * x.element_size() / (t_kiln * 1e-6) / 1e9
        print(f"{rows:>7} x {hidden:<6} {err_kiln:>15.3e} {err_torch:>16.3e} {t_kiln:>9.1f} "
              f"{t_torch:>9.1f} {gbs:>10.1f}")
    print("reference check:", "passed" if ok else "FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
