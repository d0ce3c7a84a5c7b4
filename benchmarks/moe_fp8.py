"""The DeepSeek-V3 MoE layer with fp8 block-scaled weights, at its real size (256 experts), on one GPU.

    python benchmarks/moe_fp8.py [--tokens 1 16 64 512 4096] [--reps 10] [--out moe_fp8.jsonl] [--grouped-too]

The harness's `fused_moe` routine holds three copies of a case's inputs, so its DeepSeek-V3
workloads keep 128 of the 256 bf16 experts; fp8 weights are half the bytes, and this script holds
one copy of each: the e4m3 weights with float32 scales per 128 x 128 block (amax / 448, the
checkpoint's format; 11.3 GB), and their dequantised bf16 copy (22.5 GB) for the torch pipeline,
which has no fp8 grouped GEMM (`benchmarks/routines/moe.py`'s `torch_pipeline`: sort by expert,
`torch._grouped_mm` up, silu * up, `torch._grouped_mm` down, weighted `index_add_`). Routing is
DeepSeek-V3's (sigmoid scores, 8 groups, the best 4 of them, top 8, routed scaling 2.5) from
`kiln.moe_topk` on random logits.

Per token count: a reference check of each backend (NaN-filled output; the float32 layer on the
dequantised weights, `kiln.trace.moe.fused_moe_float`, at the bf16 layer tolerance; kiln above the
small-batch limit runs the fp8 grouped GEMMs on activations quantised per 1 x 128, so it is checked
against `fused_moe_fp8_activations_float`, the same quantisation points, at the fp8 GEMM
tolerance, and the record keeps its relative error against the unquantised layer), then CUDA
events around 4 back-to-back calls per sample, --reps samples, the median with p10/p90; kiln also
under a CUDA graph at decode sizes (T <= 64), and with --grouped-too the fp8 grouped path there
as well (`kiln_grouped_fp8`: kiln.moe.SMALL_BATCH_TOKENS set to 0 around the call). The floor is
the bytes of the selected experts' fp8 weights (and their scales) / 4.3 TB/s; the torch pipeline
reads bf16 weights, twice the bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.routines, from any cwd

E, K, H, INTER = 256, 8, 7168, 2048
BLOCK = 128
COPY_TBPS = 4.3


def _time(fn, reps: int, per_sample: int = 4) -> list[float]:
    import torch

    for _ in range(3):
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


def _graphed(fn):
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _quantised(rows: int, cols: int, gen):
    """(e4m3 [E, rows, cols], float32 block scales [E, rows/128, cols/128], bf16 dequantised copy),
    from N(0, 1/cols) weights, one expert at a time (no full-size float32 temporary)."""
    import torch

    from kiln.trace.moe import dequantize

    q = torch.empty((E, rows, cols), dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty((E, rows // BLOCK, cols // BLOCK), dtype=torch.float32, device="cuda")
    deq = torch.empty((E, rows, cols), dtype=torch.bfloat16, device="cuda")
    for e in range(E):
        w = torch.randn((rows, cols), generator=gen, device="cuda") / math.sqrt(cols)
        blocks = w.view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        s[e] = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
        full = s[e].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        q[e] = (w / full).to(torch.float8_e4m3fn)
        deq[e] = dequantize(q[e : e + 1], s[e : e + 1])[0].to(torch.bfloat16)
    return q, s, deq


def _measure(t: int, up, down, gen, reps: int, grouped_too: bool = False) -> list[dict]:
    """One token count: each backend checked, then timed (kiln also on a graph at T <= 64)."""
    import torch

    import kiln
    import kiln.moe as kiln_moe
    from benchmarks.routines.moe import torch_pipeline
    from kiln.trace.moe import LAYER_TOLERANCE, dequantize, fused_moe_float, fused_moe_fp8_activations_float

    (q13, s13, d13), (q2, s2, d2) = up, down
    rtol, atol = LAYER_TOLERANCE["bfloat16"]
    x = torch.randn((t, H), generator=gen, device="cuda").bfloat16()
    logits = torch.randn((t, E), generator=gen, device="cuda")
    w, ids = kiln.moe_topk(
        logits, K, scoring="sigmoid", num_expert_group=8, topk_group=4, routed_scaling_factor=2.5
    )
    want = fused_moe_float(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2)
    small = t <= kiln_moe.SMALL_BATCH_TOKENS and t * K <= kiln_moe.SMALL_BATCH_ROWS_PER_EXPERT * E
    fp8_path = kiln_moe.FP8_GROUPED_GEMM and not small
    want_q = None
    if kiln_moe.FP8_GROUPED_GEMM and (
        fp8_path or grouped_too
    ):  # the fp8 grouped path's own quantisation points (fp8 GEMM tolerance: 2e-2, 0.1)
        want_q = torch.zeros_like(want)
        for lo in range(0, E, 32):  # 32 experts' float32 weights at a time (~5.6 GB)
            sel = slice(lo, lo + 32)
            ids_local = torch.where((ids >= lo) & (ids < lo + 32), ids - lo, torch.full_like(ids, -1))
            want_q += fused_moe_fp8_activations_float(
                x, dequantize(q13[sel], s13[sel]), dequantize(q2[sel], s2[sel]), w, ids_local
            )
    experts = int(torch.unique(ids).numel())
    floor_us = experts * (3 * H * INTER + 3 * (H // BLOCK) * (INTER // BLOCK) * 4) / (COPY_TBPS * 1e6)
    out = torch.empty_like(x)

    def kiln_call():
        return kiln.fused_moe(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, out=out)

    def torch_call():
        return torch_pipeline(x, d13, d2, w, ids)

    def kiln_grouped_call():  # the grouped path at a decode size (the small-batch limit off)
        limit = kiln_moe.SMALL_BATCH_TOKENS
        kiln_moe.SMALL_BATCH_TOKENS = 0
        try:
            return kiln_call()
        finally:
            kiln_moe.SMALL_BATCH_TOKENS = limit

    cases = [("kiln", False, kiln_call), ("torch_grouped_mm", False, torch_call)]
    if t <= 64:
        replay = _graphed(kiln_call)
        cases.append(("kiln", True, lambda: (replay(), out)[1]))
    if small and grouped_too:
        cases.append(("kiln_grouped_fp8", False, kiln_grouped_call))
    rows = []
    for backend, graph, fn in cases:
        out.fill_(float("nan"))
        got = fn()
        torch.cuda.synchronize()
        err = (got.float() - want).abs().max().item()
        rel = ((got.float() - want).norm() / want.norm()).item()
        check = (want, rtol, atol)
        quantised = (backend == "kiln" and fp8_path) or backend == "kiln_grouped_fp8"
        if quantised and want_q is not None:
            check = (want_q, 2e-2, 1e-1)
        torch.testing.assert_close(
            got.float(), check[0], rtol=check[1], atol=check[2], msg=f"{backend} at T={t}"
        )
        times = _time(fn, reps)
        med = statistics.median(times)
        rows.append(
            {
                "layer": "deepseek-v3 fp8 block-128 (E 256, k 8, H 7168, I 2048, grouped 8/4 sigmoid)",
                "tokens": t,
                "backend": backend,
                "cuda_graph": graph,
                "weights": "fp8 e4m3" if backend.startswith("kiln") else "bf16 (dequantised)",
                "median_us": med,
                "p10_us": sorted(times)[len(times) // 10],
                "p90_us": sorted(times)[-1 - len(times) // 10],
                "reps": len(times),
                "timing": "cuda_events, 4 calls per sample",
                "experts_selected": experts,
                "fp8_weight_floor_us": floor_us,
                "fraction_of_fp8_floor": floor_us / med,
                "reference_check": "passed" if check[0] is want else "passed (fp8-activation reference)",
                "max_abs_err": err,
                "rel_err_vs_float32_layer": rel,
                "rtol": check[1],
                "atol": check[2],
                "activations": "e4m3 per 1 x 128" if quantised and want_q is not None else "bf16",
                "gpu": torch.cuda.get_device_name(),
                "dtype": "bfloat16",
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 512, 4096])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument(
        "--grouped-too",
        action="store_true",
        help="at decode sizes also time the fp8 grouped path (kiln_grouped_fp8: the small-batch limit off)",
    )
    args = ap.parse_args()
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    q13, s13, d13 = _quantised(2 * INTER, H, gen)
    q2, s2, d2 = _quantised(H, INTER, gen)
    for t in args.tokens:
        for row in _measure(t, (q13, s13, d13), (q2, s2, d2), gen, args.reps, args.grouped_too):
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
