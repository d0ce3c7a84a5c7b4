"""kiln's two prefill kernels side by side (backend="fa2", "fa3" and what "auto" picks) over the
shapes the committed definitions hold constant: head_dim 64 / 128 / 256, causal and not, short
and long prompts, uniform and skewed paged batches, page sizes the sm90a kernel tiles by TMA and
ones its gather producer serves (pages 1 and 8). It is the evidence behind `auto`'s choice
(python/kiln/_attention.py prefill_kernel); the harness (`python -m benchmarks run`) covers the
definitions' shapes against the peers.

    python -m benchmarks.prefill_backends --output results.jsonl   # CUDA, compute capability 9.0
    python -m benchmarks.prefill_backends --cases small-pages        # pages 1, 8 against 16

Each case is checked first: every backend's output against float32 SDPA on the same fresh random
inputs (bf16 tolerance 2e-2), then timed with benchmarks.timing (50 measurements, CUPTI when
available else CUDA events). One JSON line per (case, backend); a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

import kiln
from benchmarks import environment, timing

HQ, HK = 32, 8
BACKENDS = ("fa2", "fa3", "auto")


def reference(q, k, v, causal):
    """float32 SDPA of one request: q [L, HQ, d], k/v [kv_len, HK, d] -> [L, HQ, d]."""
    qf, kf, vf = (x.float().transpose(0, 1) for x in (q, k, v))
    if causal and q.shape[0] != k.shape[0]:  # end-aligned mask (SDPA's is_causal is top-left)
        i = torch.arange(q.shape[0], device=q.device)[:, None] + k.shape[0] - q.shape[0]
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= i
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=True)
    return out.transpose(0, 1)


def single_case(d, causal, length, dev):
    q = torch.randn(length, HQ, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(length, HK, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(length, HK, d, device=dev, dtype=torch.bfloat16)
    ref = reference(q, k, v, causal)

    def make(backend):
        return lambda: kiln.single_prefill_with_kv_cache(q, k, v, causal=causal, backend=backend)

    flops = 4 * length * length * HQ * d / (2 if causal else 1)
    return {"case": f"single L={length} d={d} {'causal' if causal else 'full'}"}, make, ref, flops


def batch_case(lens, page_size, dev, ragged=False, d=128, causal=True):
    """A batch of requests with qo_len = kv_len = lens[i], paged (NHD) or ragged."""
    qs = [torch.randn(n, HQ, d, device=dev, dtype=torch.bfloat16) for n in lens]
    ks = [torch.randn(n, HK, d, device=dev, dtype=torch.bfloat16) for n in lens]
    vs = [torch.randn(n, HK, d, device=dev, dtype=torch.bfloat16) for n in lens]
    ref = torch.cat([reference(q, k, v, causal) for q, k, v in zip(qs, ks, vs, strict=True)])
    q = torch.cat(qs)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    qo_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens_t, 0)]).int().to(dev)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    name = "ragged" if ragged else f"paged p{page_size}"
    label = f"{name} {len(lens)}x{lens[0]}" if len(set(lens)) == 1 else f"{name} skewed {lens}"
    label += (f" d={d}" if d != 128 else "") + ("" if causal else " full")
    flops = sum(4 * n * n * HQ * d / (2 if causal else 1) for n in lens)
    if ragged:
        k, v = torch.cat(ks), torch.cat(vs)

        def make(backend):
            w = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(qo_indptr, qo_indptr, HQ, HK, d, causal=causal, q_data_type=q.dtype, kv_data_type=q.dtype)
            return lambda: w.run(q, k, v)

        return {"case": label}, make, ref, flops
    pages = [(n + page_size - 1) // page_size for n in lens]
    kc = torch.zeros(sum(pages), page_size, HK, d, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    perm = torch.randperm(sum(pages), device=dev)  # pages scattered over the cache
    first = 0
    for n, npg, k, v in zip(lens, pages, ks, vs, strict=True):
        idx = perm[first : first + npg]
        pad = npg * page_size - n
        kc[idx] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(npg, page_size, HK, d)
        vc[idx] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(npg, page_size, HK, d)
        first += npg
    kv_indptr = torch.tensor(
        [0, *torch.cumsum(torch.tensor(pages), 0).tolist()], dtype=torch.int32, device=dev
    )
    last = torch.tensor(
        [n - (p - 1) * page_size for n, p in zip(lens, pages, strict=True)], dtype=torch.int32, device=dev
    )

    def make(backend):
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(
            qo_indptr,
            kv_indptr,
            perm.int(),
            last,
            HQ,
            HK,
            d,
            page_size,
            causal=causal,
            q_data_type=q.dtype,
            kv_data_type=q.dtype,
        )
        return lambda: w.run(q, (kc, vc))

    return {"case": label}, make, ref, flops


def cases(dev):
    for d in (64, 128, 256):
        for causal in (True, False):
            for length in (512, 2048, 8192):
                yield lambda d=d, c=causal, n=length: single_case(d, c, n, dev)
    yield lambda: batch_case([1024] * 16, 16, dev)
    yield lambda: batch_case([2048] * 16, 16, dev)
    yield lambda: batch_case([4096, 1024, 512, 256, 128, 64, 7, 1], 16, dev)
    yield lambda: batch_case([2048] * 4, 32, dev)
    yield lambda: batch_case([2048] * 4, 1, dev)
    yield lambda: batch_case([2048] * 4, 0, dev, ragged=True)


def small_page_cases(dev):
    """The gather producer (pages under 16 tokens, and those dividing the tile) against TMA boxes
    (pages a multiple of the tile) and fa2 on the issue's shape, 16 x 2048 causal, GQA 32/8,
    head_dim 128; then where auto must choose: a skewed batch, short prompts, other head dims, an
    odd page size."""
    for page in (1, 8, 16, 32, 64, 128):
        yield lambda p=page: batch_case([2048] * 16, p, dev)
    yield lambda: batch_case([4096, 1024, 512, 256, 128, 64, 7, 1], 16, dev)
    for page in (1, 16):
        yield lambda p=page: batch_case([512] * 4, p, dev)
    for d in (64, 256):
        yield lambda d=d: batch_case([2048] * 16, 1, dev, d=d)
    yield lambda: batch_case([2048] * 16, 5, dev)
    yield lambda: batch_case([2048] * 16, 1, dev, causal=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", help="JSON lines file")
    ap.add_argument("--measurements", type=int, default=50)
    ap.add_argument("--cases", choices=("all", "small-pages"), default="all")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        print("prefill_backends: needs a compute capability 9.0 GPU (backend fa3)", file=sys.stderr)
        return 2
    settings = timing.Settings(measurements=args.measurements)
    env = {"device": environment.device_info(dev), "software": environment.software()}
    out = open(args.output, "w") if args.output else None
    print("| case | fa2 us | fa3 us | auto us | fa3 TFLOP/s | fa2 / fa3 |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for build in (cases if args.cases == "all" else small_page_cases)(dev):
        torch.manual_seed(0)
        info, make, ref, flops = build()
        row = {}
        for backend in BACKENDS:
            fn = make(backend)
            got = fn().float()
            err = (got - ref).abs().max().item()
            ok = bool(torch.allclose(got, ref, atol=2e-2, rtol=2e-2))
            if not ok:
                failed += 1
                row[backend] = math.nan
                rec = {**info, "backend": backend, "check": "failed", "max_abs_err": err}
            else:
                m = timing.measure([fn], dev, settings)
                stats = timing.summarize(m.per_call_s)
                row[backend] = stats["median_us"]
                rec = {
                    **info,
                    "backend": backend,
                    "check": "passed",
                    "max_abs_err": err,
                    "dtype": "bfloat16",
                    "timing": m.mechanism,
                    "measurements": len(m.per_call_s),
                    "calls_per_measurement": m.calls_per_measurement,
                    **stats,
                    "tflops": flops / (stats["median_us"] * 1e-6) / 1e12,
                }
            if out:
                out.write(json.dumps({**rec, **env}) + "\n")
        tf = flops / (row["fa3"] * 1e-6) / 1e12
        print(
            f"| {info['case']} | {row['fa2']:.1f} | {row['fa3']:.1f} | {row['auto']:.1f} | {tf:.0f} | "
            f"{row['fa2'] / row['fa3']:.2f} |",
            flush=True,
        )
        del make, ref
        torch.cuda.empty_cache()
    if out:
        out.close()
    print(f"{failed} failed reference checks", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
