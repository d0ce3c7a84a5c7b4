"""Times the torch peers of //ops/gemm at the issue's shapes, for docs/perf/gemm.md: torch.matmul
(a @ w.t(), bf16), torch._scaled_mm (fp8 e4m3 per-tensor, bf16 out, use_fast_accum False and
True) and torch._grouped_mm (bf16, E=128, k=2048, n=3072, 65536 routed rows). CUDA events, median
of 20 after 3 warm-ups, a 256 MB L2 flush before each run (as gemm_selftest's timing).

    python tests/cuda/gemm_torch_peers.py [out.csv]

Not a test (pytest collects test_*.py only): the C++ self-test checks kiln; this names the peers'
numbers on the same GPU in the same session.
"""

import statistics
import sys

import torch

NK = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (57344, 8192), (8192, 28672)]
MS = [1, 16, 64, 1024, 4096, 16384]


def bench(fn, reps=20):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    events = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def main():
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else None
    dev = torch.cuda.get_device_name()
    print(f"torch {torch.__version__} on {dev}")

    def emit(what, m, n, k, us, extra=""):
        rate = 2.0 * m * n * k / (us * 1e-6) / 1e12
        print(f"{what:12s} m {m:6d} n {n:6d} k {k:6d} {us:10.1f} us {rate:7.1f} TFLOP/s {extra}")
        if out:
            out.write(f"{what},{m},{n},{k},{us:.2f},{extra}\n")
            out.flush()

    for n, k in NK:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in MS:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            emit("matmul", m, n, k, bench(lambda a=a, w=w: a @ w.t()))
        w8 = w.to(torch.float8_e4m3fn)
        scale = torch.tensor(0.02, device="cuda")
        for m in [1024, 4096, 16384]:
            a8 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            for fast in (False, True):

                def run(a8=a8, w8=w8, s=scale, fast=fast):
                    return torch._scaled_mm(
                        a8, w8.t(), scale_a=s, scale_b=s, out_dtype=torch.bfloat16, use_fast_accum=fast
                    )

                emit("scaled_mm" + ("_fast" if fast else ""), m, n, k, bench(run))
        torch.cuda.empty_cache()

    # grouped: the MoE shape
    E, K, N, rows = 128, 2048, 3072, 8192 * 8
    g = torch.Generator().manual_seed(42)
    counts = torch.bincount(torch.randint(0, E, (rows,), generator=g), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32).cuda()
    x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
    if hasattr(torch, "_grouped_mm"):
        try:
            us = bench(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
            emit("grouped_mm", rows, N, K, us)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print("torch._grouped_mm failed:", exc)
    bounds = [0] + torch.cumsum(counts, 0).tolist()

    def loop():
        for e in range(E):
            if bounds[e + 1] > bounds[e]:
                torch.matmul(x[bounds[e] : bounds[e + 1]], w[e].t())

    emit("matmul_loop", rows, N, K, bench(loop))


if __name__ == "__main__":
    main()
