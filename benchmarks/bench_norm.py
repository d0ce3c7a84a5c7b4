"""RMSNorm benchmark: kiln.rmsnorm vs torch.nn.functional.rms_norm (and FlashInfer when it is
importable), after a reference check. Until the unified harness lands this script is the
benchmark of record for //ops:norm; it writes one JSON record per (shape, backend, timing).

Timing (recorded per result):
  cuda_events  eager calls, CUDA events around a batch of `n` calls over rotating input buffers
               (together larger than the L2, so every call reads from HBM); per-call median,
               min, max and std over `repeats` batches. Includes launch overhead when the CPU
               cannot keep ahead of the GPU (small shapes).
  cuda_graph   the same batch captured in a CUDA graph and replayed: GPU time without Python or
               launch overhead.

    python benchmarks/bench_norm.py --out results.json [--dtype bf16] [--no-flashinfer]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import kiln

SHAPES = [(1, 4096), (128, 4096), (4096, 4096), (16384, 8192)]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
EPS = 1e-6
TOL = {torch.bfloat16: (1.6e-2, 8e-3), torch.float16: (2e-3, 1e-3), torch.float32: (2e-5, 2e-5)}
L2_BYTES = 60 * 2**20  # H200; read from the device below when available


def reference(x, w):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def backends(use_flashinfer: bool):
    out = {
        "kiln": lambda x, w, o: kiln.rmsnorm(x, w, eps=EPS, out=o),
        "torch": lambda x, w, o: F.rms_norm(x, (x.shape[-1],), w, eps=EPS),
    }
    if use_flashinfer:
        try:
            import flashinfer

            out["flashinfer"] = lambda x, w, o: flashinfer.norm.rmsnorm(x, w, eps=EPS, out=o)
        except Exception as e:  # noqa: BLE001 - report and go on without the peer
            print(f"flashinfer not available: {e!r}", file=sys.stderr)
    return out


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", L2_BYTES) or L2_BYTES
    gpu = {"name": props.name, "arch": f"{props.major}.{props.minor}",
           "sms": props.multi_processor_count, "l2_bytes": l2}
    ceiling = copy_bandwidth()
    print(f"{props.name}: measured copy bandwidth {ceiling / 1e12:.2f} TB/s")
    records = []
    for rows, hidden in SHAPES:
        bytes_per_call = (2 * rows * hidden + hidden) * torch.finfo(dtype).bits // 8
        k = max(1, min(64, -(-3 * l2 // bytes_per_call)))  # rotate > 3x the L2
        gen = torch.Generator(device="cuda").manual_seed(rows * 7919 + hidden)
        xs = [torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype) for _ in range(k)]
        ws = [torch.randn(hidden, device="cuda", generator=gen).to(dtype) for _ in range(k)]
        outs = [torch.empty_like(x) for x in xs]
        n = max(1, min(200, int(2e-3 / max(bytes_per_call / ceiling, 2e-6))))  # ~2 ms batches
        for name, fn in backends(not args.no_flashinfer).items():
            out = torch.full_like(xs[0], float("nan"))
            got = fn(xs[0], ws[0], out)
            got = out if got is None else got
            torch.cuda.synchronize()
            rtol, atol = TOL[dtype]
            try:
                torch.testing.assert_close(got.double(), reference(xs[0], ws[0]), rtol=rtol, atol=atol)
                check = "passed"
            except AssertionError as e:
                check = f"FAILED: {str(e).splitlines()[0]}"
            for mode in ("cuda_events", "cuda_graph"):
                rec = {
                    "routine": "rmsnorm", "backend": name, "shape": {"tokens": rows, "hidden": hidden},
                    "dtype": args.dtype, "gpu": gpu, "timing": mode, "calls_per_measurement": n,
                    "measurements": args.repeats, "rotating_buffers": k,
                    "bytes_per_call": bytes_per_call, "reference_check": check,
                    "kiln_version": kiln.__version__, "git_commit": git_commit(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "copy_bandwidth_tbps": ceiling / 1e12,
                    "repro": f"python benchmarks/bench_norm.py --dtype {args.dtype} --out results.json",
                }
                if check == "passed":
                    per_call = time_backend(fn, xs, ws, outs, n, args.repeats, mode)
                    rec.update(stats(per_call))
                    rec["gbps"] = bytes_per_call / (rec["median_us"] * 1e-6) / 1e9
                    rec["fraction_of_copy_bw"] = rec["gbps"] * 1e9 / ceiling
                records.append(rec)
                shown = (f"{rec['median_us']:9.2f} us {rec['gbps']:8.1f} GB/s "
                         f"({rec['fraction_of_copy_bw']:.0%} of copy)" if "median_us" in rec else check)
                print(f"{rows:>6}x{hidden:<5} {name:<10} {mode:<11} {shown}", flush=True)
        del xs, ws, outs
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
