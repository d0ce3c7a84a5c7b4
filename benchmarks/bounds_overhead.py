"""What the index checks cost: paged decode (B64 x L4096, GQA 32/8, head_dim 128, pages of 16) and
single causal prefill (8192 tokens, 32/8 heads, head_dim 128), bf16, timed with CUDA events (the
median of --reps samples of 25 back-to-back calls, after a warm-up, on the same inputs), for the
kiln of one source tree. Run it
for two trees (with and without the checks), alternately, and compare the medians:

    python benchmarks/bounds_overhead.py --root . --out now.jsonl
    python benchmarks/bounds_overhead.py --root ../old --out before.jsonl

Every result passed a reference check first (a float32 attention over a few rows). Each record also
names the kernels one call launches and their device time (torch.profiler over 10 calls), so a
difference between two trees shows whether it lies in a kernel or between the launches.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def _import_kiln(root: Path):
    sys.path.insert(0, str(root / "python"))
    import kiln

    if not (root / "python" / "kiln" / "runtime").is_dir():  # the older layout
        kiln.__path__.append(str(root))
    return kiln


def _time(fn, reps: int, per_sample: int = 25) -> list[float]:
    """Microseconds per call: `per_sample` calls back to back between two events (the GPU stays
    busy, so the host's launch cost stays out of the kernel's time), `reps` such samples."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_sample):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000.0 / per_sample)
    return out


def _kernels(fn, calls: int = 10) -> list[dict]:
    """The CUDA kernels (and copies) of `calls` calls: name, count and mean device time (us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            rows.append({"name": e.key[:120], "count": e.count, "mean_us": total / e.count})
    return sorted(rows, key=lambda r: -r["mean_us"] * r["count"])


def _check(out, q, k, v, rows, causal):
    import torch

    d = q.shape[-1]
    for i in rows:  # query i of the prompt, head 0 (kv head 0)
        kk = k[: i + 1 if causal else k.shape[0], 0].float()
        vv = v[: kk.shape[0], 0].float()
        p = torch.softmax(q[i, 0].float() @ kk.T / math.sqrt(d), -1)
        ref = p @ vv
        assert torch.allclose(out[i, 0].float(), ref, rtol=3e-2, atol=3e-2), f"row {i} differs"


def _decode(kiln, reps: int, kernels) -> dict:
    """Decode B64 L4096 (GQA 32/8, head_dim 128, pages of 16, shuffled pages)."""
    import torch

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, length, page, hq, hk, d = 64, 4096, 16, 32, 8, 128
    pages = b * length // page
    k_cache = torch.randn(pages, page, hk, d, device=dev, dtype=bf16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * (length // page)
    indices = torch.randperm(pages, device=dev, generator=gen).to(torch.int32)
    last = torch.full((b,), page, dtype=torch.int32, device=dev)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev))
    w.plan(indptr, indices, last, hq, hk, d, page, q_data_type=bf16)
    q = torch.randn(b, hq, d, device=dev, dtype=bf16, generator=gen)
    out = w.run(q, (k_cache, v_cache))
    pages0 = indices[: length // page].long()
    kk, vv = k_cache[pages0].reshape(-1, hk, d), v_cache[pages0].reshape(-1, hk, d)
    ref = torch.softmax(q[0, 0].float() @ kk[:, 0].float().T / math.sqrt(d), -1) @ vv[:, 0].float()
    assert torch.allclose(out[0, 0].float(), ref, rtol=3e-2, atol=3e-2), "decode differs from the reference"
    times = _time(lambda: w.run(q, (k_cache, v_cache)), reps)
    return {"workload": "decode B64 L4096 32/8 d128 page16", "times_us": times,
            "kernels": kernels(lambda: w.run(q, (k_cache, v_cache)))}


def _prefill(kiln, reps: int, kernels) -> dict:
    """Single causal prefill of 8192 tokens (32/8 heads, head_dim 128)."""
    import torch

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(1)
    n, hq, hk, d = 8192, 32, 8, 128
    qp = torch.randn(n, hq, d, device=dev, dtype=bf16, generator=gen)
    kp = torch.randn(n, hk, d, device=dev, dtype=bf16, generator=gen)
    vp = torch.randn_like(kp)
    outp = kiln.single_prefill_with_kv_cache(qp, kp, vp, causal=True)
    _check(outp, qp, kp, vp, [0, 1, 4095, 8191], True)
    times = _time(lambda: kiln.single_prefill_with_kv_cache(qp, kp, vp, causal=True), reps)
    return {"workload": "single prefill causal 8192 32/8 d128", "times_us": times,
            "kernels": kernels(lambda: kiln.single_prefill_with_kv_cache(qp, kp, vp, causal=True))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".")
    ap.add_argument("--reps", type=int, default=20, help="samples of 25 back-to-back calls each")
    ap.add_argument("--out")
    ap.add_argument("--workloads", default="decode,prefill", help="which of decode,prefill to run")
    ap.add_argument("--no-kernel-list", action="store_true",
                    help="leave out the torch.profiler kernel list (under ncu, which holds the profiler)")
    args = ap.parse_args()
    workloads = set(args.workloads.split(","))
    kernels = (lambda fn: []) if args.no_kernel_list else _kernels
    root = Path(args.root).resolve()
    kiln = _import_kiln(root)
    import torch

    rows = []
    if "decode" in workloads:
        rows.append(_decode(kiln, args.reps, kernels))
    if "prefill" in workloads:
        rows.append(_prefill(kiln, args.reps, kernels))
    for r in rows:
        t = r.pop("times_us")
        r.update(tree=str(root), gpu=torch.cuda.get_device_name(), timing="cuda_events, 25 calls per sample",
                 reps=len(t),
                 median_us=statistics.median(t), p10_us=sorted(t)[len(t) // 10],
                 p90_us=sorted(t)[9 * len(t) // 10], reference_check="passed", dtype="bfloat16")
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
