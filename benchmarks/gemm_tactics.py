"""Every GEMM tactic that can run a shape, timed side by side through kiln.autotune (CUDA events,
L2 flushed before each sample, the median of --repeats), with the default heuristic's choice and
cuBLAS (torch.matmul / torch._scaled_mm, timed the same way) beside it: the measured basis of the
default-tactic table in ops/gemm/gemm_tactics.cc.

    python benchmarks/gemm_tactics.py --out tactics.jsonl                  # the decode shapes
    python benchmarks/gemm_tactics.py --m 256,1024 --ops mm_bf16 --out t.jsonl

Each shape's output is checked against a float32 reference before anything is timed. One JSON
line per (op, shape): the default tactic and its time, the fastest tactic and its time, every
tactic's time, and the peer's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Llama-3-8B / 70B linear layers (N x K), as the GEMM issue's targets name them.
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (57344, 8192),
          (8192, 28672)]
BMM_SHAPES = [(128, 512, 128), (128, 128, 512)]  # (batch, n, k): MLA-style small batched GEMMs


def _time_peer(fn, repeats: int, flush, device) -> float:
    """Median seconds of one call, L2 flushed before each sample (as the tuner times tactics)."""
    import time

    import torch

    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        flush()
        if device.type != "cuda":  # the host backend (a dry run of this script on a CPU machine)
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(samples)


def _cases(ops: list[str], ms: list[int]):
    for op in ops:
        for m in ms:
            if op == "mm_bf16":
                for n, k in SHAPES:
                    yield op, {"m": m, "n": n, "k": k}
            elif op == "bmm_bf16":
                for batch, n, k in BMM_SHAPES:
                    yield op, {"batch": batch, "m": m, "n": n, "k": k}
            elif op == "bmm_fp8":
                for n, k in SHAPES:
                    yield op, {"batch": 1, "m": m, "n": n, "k": k}
            else:
                raise SystemExit(f"unknown op {op!r}: mm_bf16, bmm_bf16, bmm_fp8")


def _build(op: str, s: dict, gen, dev):
    """(kiln call, peer call, float32 reference) for one shape; weights as linear layers hold
    them ([n, k] row-major, passed as the transpose view)."""
    import torch

    bf16 = torch.bfloat16
    if op == "mm_bf16":
        a = torch.randn(s["m"], s["k"], device=dev, generator=gen).to(bf16)
        w = torch.randn(s["n"], s["k"], device=dev, generator=gen).to(bf16)
        import kiln

        return (lambda: kiln.mm_bf16(a, w.t())), (lambda: a @ w.t()), (lambda: a.float() @ w.float().t())
    if op == "bmm_bf16":
        a = torch.randn(s["batch"], s["m"], s["k"], device=dev, generator=gen).to(bf16)
        w = torch.randn(s["batch"], s["n"], s["k"], device=dev, generator=gen).to(bf16)
        import kiln

        bt = w.transpose(1, 2)
        return (lambda: kiln.bmm_bf16(a, bt)), (lambda: torch.bmm(a, bt)), (lambda: a.float() @ bt.float())
    a = (torch.randn(1, s["m"], s["k"], device=dev, generator=gen) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(1, s["n"], s["k"], device=dev, generator=gen) * 4).to(torch.float8_e4m3fn)
    sa = torch.tensor([0.05], device=dev)
    sb = torch.tensor([0.02], device=dev)
    import kiln

    bt = w.transpose(1, 2)

    def peer():
        return torch._scaled_mm(a[0], w[0].t(), scale_a=sa, scale_b=sb, out_dtype=bf16)

    return (
        (lambda: kiln.bmm_fp8(a, bt, sa, sb, bf16)),
        peer,
        (lambda: (a.float() @ bt.float()) * (sa * sb)),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="mm_bf16,bmm_bf16,bmm_fp8")
    ap.add_argument("--m", default="1,16,64", help="comma-separated M values")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run on the host backend")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    import torch

    import kiln
    from kiln import autotuner

    dev = torch.device(args.device)
    flush = autotuner._flusher(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    ms = [int(v) for v in args.m.split(",")]
    for op, s in _cases(args.ops.split(","), ms):
        call, peer, ref = _build(op, s, gen, dev)
        got, want = call().float(), ref()
        err = (got - want).abs().max().item()
        scale = want.abs().max().item()
        assert err <= 0.02 * scale + 1e-2, f"{op} {s}: max error {err} (reference max {scale})"
        with kiln.autotune(tune_mode=True, cold_l2=True, repeats=args.repeats) as ctx:
            call()
        (entry,) = ctx.tuned.values()
        autotuner.clear()  # the next shape is tuned from scratch, its default measured again
        peer_us = _time_peer(peer, args.repeats, flush, dev) * 1e6
        row = {
            "op": op, **s, "default": entry.default, "default_us": entry.timings_us.get(entry.default),
            "best": min(entry.timings_us, key=entry.timings_us.get),
            "best_us": min(entry.timings_us.values()),
            "peer": "torch._scaled_mm" if op == "bmm_fp8" else "torch (cuBLAS)", "peer_us": peer_us,
            "timings_us": entry.timings_us, "timer": entry.timer, "repeats": args.repeats, "cold_l2": True,
            "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (host backend)",
            "reference_check": "passed",
        }
        d = row["default_us"] or float("nan")
        label = " ".join(f"{k}={v}" for k, v in s.items())
        print(f"{op:9s} {label:34s} default {entry.default:24s} {d:8.1f} us"
              f" | best {row['best']:24s} {row['best_us']:8.1f} us | peer {peer_us:8.1f} us", flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
