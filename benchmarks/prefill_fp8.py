"""Paged prefill over an fp8 E4M3 cache (the staged 16-bit copy) against the bf16 cache, on one GPU.

    python benchmarks/prefill_fp8.py [--batches 16x2048 1x8192] [--out prefill_fp8.jsonl]

Llama-3.1-8B attention (GQA 32/8, head_dim 128), page 16, causal, bf16 queries, every request
prefilling qo_len tokens over an equal cache (batch x qo_len); backend "auto" (fa3 on the H200).
Each backend is checked first (NaN-filled output against kiln's own bf16 result on the
dequantised cache at the bf16 prefill tolerance: the float32 reference of a 16 x 2048 batch is too
large to materialise here; test_fp8_kv.py checks against it at smaller sizes), then timed with the
harness's timer (CUDA events, 20 measurements). What the fp8 path adds is the staging: a page
gather and a widening copy per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.*, from any cwd

HQ, HK, D, PAGE = 32, 8, 128, 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", default=["16x2048", "1x8192"])
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    import kiln
    from benchmarks.timing import Settings, measure

    gen = torch.Generator(device="cuda").manual_seed(0)
    for spec in args.batches:
        batch, n = (int(x) for x in spec.split("x"))
        pages = batch * (n // PAGE)
        cache = torch.randn((pages, 2, PAGE, HK, D), generator=gen, device="cuda").bfloat16()
        scales = [float(cache[:, i].abs().max()) / 448.0 for i in (0, 1)]
        fp8 = torch.stack([(cache[:, i].float() / scales[i]).clamp(-448, 448) for i in (0, 1)], 1)
        fp8 = fp8.to(torch.float8_e4m3fn)
        dequantised = torch.stack([fp8[:, i].float() * scales[i] for i in (0, 1)], 1).bfloat16()
        indptr = torch.arange(batch + 1, dtype=torch.int32) * (n // PAGE)
        indices = torch.randperm(pages, device="cuda").to(torch.int32)
        last = torch.full((batch,), PAGE, dtype=torch.int32)
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * n
        q = torch.randn((batch * n, HQ, D), generator=gen, device="cuda").bfloat16()
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        results = {}
        for which, kv, kv_dtype, kw in (
            ("bf16", dequantised, torch.bfloat16, {}),
            ("fp8", fp8, torch.float8_e4m3fn, {"k_scale": scales[0], "v_scale": scales[1]}),
        ):
            w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(
                qo_indptr,
                indptr.cuda(),
                indices,
                last.cuda(),
                HQ,
                HK,
                D,
                PAGE,
                causal=True,
                q_data_type=torch.bfloat16,
                kv_data_type=kv_dtype,
            )
            out = torch.full_like(q, float("nan"))
            w.run(q, kv, out=out, **kw)
            torch.cuda.synchronize()
            results[which] = out.clone()
            m = measure(
                [lambda w=w, q=q, kv=kv, kw=kw, out=out: w.run(q, kv, out=out, **kw)],
                torch.device("cuda"),
                Settings(measurements=20, timer="cuda_events", target_s=5e-3),
            )
            us = sorted(t * 1e6 for t in m.per_call_s)
            flops = 4 * batch * HQ * D * n * (n + 1) / 2
            row = {
                "workload": f"paged prefill {batch} x {n} causal",
                "backend": "kiln",
                "kv_cache": which,
                "median_us": statistics.median(us),
                "p10_us": us[len(us) // 10],
                "p90_us": us[-1 - len(us) // 10],
                "measurements": len(us),
                "timing": m.mechanism,
                "tflops": flops / statistics.median(us) / 1e6,
                "num_qo_heads": HQ,
                "num_kv_heads": HK,
                "head_dim": D,
                "page_size": PAGE,
                "gpu": torch.cuda.get_device_name(),
                "dtype": "bfloat16",
            }
            if which == "fp8":
                torch.testing.assert_close(
                    results["fp8"].float(), results["bf16"].float(), rtol=2.5e-2, atol=2.5e-2
                )
                row["reference_check"] = "passed (against the bf16 cache of the same values)"
            else:
                row["reference_check"] = "the comparison's reference"
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
        del cache, fp8, dequantised
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
