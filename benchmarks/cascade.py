"""Shared-prefix (cascade) decode against plain paged decode over the full caches: 64 requests
sharing a 4096-token prefix with 128 tokens of their own (GQA 32/8, head_dim 128, pages of 16,
bf16), on one GPU, in one process:

    python benchmarks/cascade.py [--batch 64 --shared 4096 --unique 128] [--out results.jsonl]

Backends: kiln's MultiLevelCascadeAttentionWrapper (two levels), kiln's
BatchDecodeWithPagedKVCacheWrapper over each request's full page list (prefix pages + its own),
and FlashInfer 0.7's two where it imports. Each is checked first against a float32 attention over
the request's keys (every request, every head), then timed with CUDA events: the median of --reps
samples of 25 back-to-back calls (p10, p90 too), after a warm-up, eagerly and replayed from a
CUDA graph (`graph_*`); each record also lists the kernels one call launches (torch.profiler).
The floor of plain decode is its KV bytes over the copy bandwidth; cascade reads the prefix once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bounds_overhead import _kernels, _time  # noqa: E402

PAGE, HQ, HK, D = 16, 32, 8, 128


def _reference(q, cache, pages_of, b):
    from kiln.trace.attention import attention

    ids = torch.tensor(pages_of(b), dtype=torch.long, device=cache.device)
    k = cache[ids, 0].reshape(-1, HK, D)
    v = cache[ids, 1].reshape(-1, HK, D)
    return attention(q[b : b + 1], k, v)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shared", type=int, default=4096, help="prefix tokens (a multiple of 16)")
    ap.add_argument("--unique", type=int, default=128, help="tokens of each request (a multiple of 16)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-peers", action="store_true", help="leave FlashInfer out (its JIT takes minutes)")
    ap.add_argument("--out")
    args = ap.parse_args()
    import kiln

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, sp, up = args.batch, args.shared // PAGE, args.unique // PAGE
    pool = sp + b * up
    cache = torch.randn(pool, 2, PAGE, HK, D, device=dev, dtype=bf16, generator=gen)
    perm = torch.randperm(pool, device=dev, generator=gen).to(torch.int32)
    prefix, own = perm[:sp], perm[sp:].view(b, up)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    q = torch.randn(b, HQ, D, device=dev, dtype=bf16, generator=gen)
    full = lambda r: prefix.tolist() + own[r].tolist()  # noqa: E731
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    full_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * (sp + up)
    full_indices = torch.cat([torch.cat([prefix, own[r]]) for r in range(b)])
    last = torch.full((b,), PAGE, dtype=torch.int32, device=dev)
    levels = dict(
        qo=[i32([0, b]), torch.arange(b + 1, dtype=torch.int32, device=dev)],
        indptr=[i32([0, sp]), torch.arange(b + 1, dtype=torch.int32, device=dev) * up],
        indices=[prefix.contiguous(), own.reshape(-1).contiguous()],
        last=[i32([PAGE]), last],
    )

    def cascade(lib):
        w = lib.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        w.plan(levels["qo"], levels["indptr"], levels["indices"], levels["last"], HQ, HK, D, PAGE,
               q_data_type=bf16)
        return lambda: w.run(q, cache)

    def decode(lib):
        w = lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(full_indptr, full_indices, last, HQ, HK, D, PAGE, q_data_type=bf16)
        return lambda: w.run(q, cache)

    backends = [("kiln cascade", lambda: cascade(kiln)), ("kiln decode", lambda: decode(kiln))]
    try:
        if args.no_peers:
            raise ImportError("--no-peers")
        import flashinfer

        fv = getattr(flashinfer, "__version__", "?")
        backends += [(f"flashinfer {fv} cascade", lambda: cascade(flashinfer)),
                     (f"flashinfer {fv} decode", lambda: decode(flashinfer))]
    except Exception as e:  # noqa: BLE001 - any import failure: the peer is absent
        print(f"flashinfer: not available ({type(e).__name__}: {e})", file=sys.stderr)

    refs = torch.cat([_reference(q, cache, full, r) for r in range(b)])
    kv_bytes = b * (sp + up) * PAGE * HK * D * 2 * 2
    rows = []
    for name, make in backends:
        fn = make()
        out = fn()
        torch.cuda.synchronize()
        err = (out.float() - refs).abs().max().item()
        ok = torch.allclose(out.float(), refs, rtol=2e-2, atol=2e-2)
        row = {"workload": f"B{b} shared {args.shared} + unique {args.unique}, 32/8 d128 page16 bf16",
               "backend": name, "gpu": torch.cuda.get_device_name(dev), "max_abs_err": err,
               "reference_check": "passed" if ok else "FAILED", "plain_decode_kv_bytes": kv_bytes}
        if ok:
            t = _time(fn, args.reps)
            qs = statistics.quantiles(t, n=10)
            row.update(timing="cuda_events, 25 calls per sample", reps=args.reps,
                       median_us=statistics.median(t), p10_us=qs[0], p90_us=qs[-1], kernels=_kernels(fn))
            # The same call replayed from a CUDA graph (as a serving engine runs decode): the
            # launches' host cost leaves the measurement.
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                captured = fn()
            graph.replay()
            torch.cuda.synchronize()
            same = torch.equal(captured, out)
            tg = _time(graph.replay, args.reps)
            qg = statistics.quantiles(tg, n=10)
            row.update(graph_median_us=statistics.median(tg), graph_p10_us=qg[0], graph_p90_us=qg[-1],
                       graph_replay_matches_eager=same)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}))
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0 if all(r["reference_check"] == "passed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
