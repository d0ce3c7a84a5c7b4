"""Paged decode attention benchmark (interim, until the unified harness carries a decode routine):
kiln.BatchDecodeWithPagedKVCacheWrapper vs torch SDPA (enable_gqa=True) on the same data laid out
contiguously, and FlashInfer 0.7's wrapper (default and use_tensor_cores=True) when importable.

Shape: bf16, 32 q heads, 8 kv heads, head_dim 128, page 16, NHD, pages handed out in random order.
Every backend is checked against a float32 reference first; a failing backend is not timed.
Effective KV bandwidth = bytes of K and V read (batch x kv_len x kv_heads x head_dim x 2 x 2) /
time. When one layer's KV fits in the L2, `layers` copies are rotated so every call reads HBM.
Timing as in bench_norm.py: `cuda_events` (eager batches) and `cuda_graph` (replayed batches).

    python benchmarks/bench_decode.py --out decode.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interim import copy_bandwidth, git_commit, stats, time_backend  # noqa: E402

import kiln  # noqa: E402

SHAPES = [(64, 4096), (256, 2048), (1, 4096), (1, 32768), (16, 8192)]
HQ, HK, D, PAGE = 32, 8, 128, 16


def make_layer(batch, kv_len, gen):
    pages_per = kv_len // PAGE
    total = batch * pages_per
    k = torch.randn(total, PAGE, HK, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(total, PAGE, HK, D, device="cuda", generator=gen).bfloat16()
    return k, v


def reference(q, dense_k, dense_v):
    kf = dense_k.float().repeat_interleave(HQ // HK, 1)
    vf = dense_v.float().repeat_interleave(HQ // HK, 1)
    logits = torch.einsum("bhd,bhtd->bht", q.float(), kf) / math.sqrt(D)
    return torch.einsum("bht,bhtd->bhd", torch.softmax(logits, -1), vf)


def bench_shape(batch, kv_len, fi, gpu, ceiling, l2, repeats):
    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + kv_len)
    kv_bytes = batch * kv_len * HK * D * 2 * 2
    layers = max(1, min(24, math.ceil(3 * l2 / kv_bytes)))
    caches = [make_layer(batch, kv_len, gen) for _ in range(layers)]
    pages_per = kv_len // PAGE
    perm = torch.randperm(batch * pages_per, device="cuda", generator=gen).int()
    indptr = torch.arange(0, batch * pages_per + 1, pages_per, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), PAGE, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, HQ, D, device="cuda", generator=gen).bfloat16()

    def contiguous(k):  # [pages, PAGE, HK, D] -> [batch, HK, kv_len, D] in each request's page order
        return k[perm.long()].view(batch, kv_len, HK, D).transpose(1, 2).contiguous()

    dense = [(contiguous(k), contiguous(v)) for k, v in caches]
    ref = reference(q, *dense[0])
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, perm, last, HQ, HK, D, PAGE, q_data_type=torch.bfloat16)
    out = torch.empty_like(q)
    qs = q.unsqueeze(2)
    backends = {
        "kiln": lambda i: w.run(q, caches[i], out=out),
        "torch_sdpa": lambda i: F.scaled_dot_product_attention(qs, *dense[i], enable_gqa=True).squeeze(2),
    }
    if fi is not None:
        for name, tc in (("flashinfer", False), ("flashinfer_tc", True)):
            fws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
            fw = fi.BatchDecodeWithPagedKVCacheWrapper(fws, "NHD", use_tensor_cores=tc)
            fw.plan(indptr, perm, last, HQ, HK, D, PAGE, q_data_type=torch.bfloat16,
                    kv_data_type=torch.bfloat16)
            backends[name] = lambda i, fw=fw: fw.run(q, caches[i])
    plan_info = w.plan_info
    records = []
    for name, fn in backends.items():
        got = fn(0)
        torch.cuda.synchronize()
        err = (got.float() - ref).abs().max().item()
        check = "passed" if err <= 2e-2 else f"FAILED: max abs error {err:.3e}"
        for mode in ("cuda_events", "cuda_graph"):
            rec = {"routine": "batch_decode_paged", "backend": name,
                   "shape": {"batch": batch, "kv_len": kv_len, "num_qo_heads": HQ, "num_kv_heads": HK,
                             "head_dim": D, "page_size": PAGE, "layout": "NHD"},
                   "dtype": "bf16", "gpu": gpu, "timing": mode, "layers_rotated": layers,
                   "measurements": repeats, "kv_bytes": kv_bytes, "reference_check": check,
                   "max_abs_error": err, "kiln_version": kiln.__version__, "git_commit": git_commit(),
                   "torch": torch.__version__, "python": platform.python_version(),
                   "copy_bandwidth_tbps": ceiling / 1e12, "plan": plan_info if name == "kiln" else None,
                   "repro": "python benchmarks/bench_decode.py --out decode.json"}
            if check == "passed":
                n = max(layers, min(100, int(2e-3 / max(kv_bytes / ceiling, 5e-6))))
                n = -(-n // layers) * layers
                per_call = time_backend(lambda x, _w, _o, fn=fn: fn(x), list(range(layers)), [None] * layers,
                                        [None] * layers, n, repeats, mode)
                rec.update(stats(per_call))
                rec["calls_per_measurement"] = n
                rec["kv_tbps"] = kv_bytes / (rec["median_us"] * 1e-6) / 1e12
                rec["fraction_of_copy_bw"] = rec["kv_tbps"] * 1e12 / ceiling
            records.append(rec)
            shown = (f"{rec['median_us']:9.2f} us  KV {rec['kv_tbps']:5.2f} TB/s "
                     f"({rec['fraction_of_copy_bw']:.0%})" if "median_us" in rec else check)
            print(f"B{batch:<4} L{kv_len:<6} {name:<14} {mode:<11} {shown}", flush=True)
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
    gpu = {"name": props.name, "arch": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
           "l2_bytes": l2}
    ceiling = copy_bandwidth()
    print(f"{props.name}: measured copy bandwidth {ceiling / 1e12:.2f} TB/s", flush=True)
    fi = None
    if not args.no_flashinfer:
        try:
            import flashinfer as fi
        except Exception as e:  # noqa: BLE001
            print(f"flashinfer not available: {e!r}", file=sys.stderr)
    records = []
    for batch, kv_len in SHAPES:
        records += bench_shape(batch, kv_len, fi, gpu, ceiling, l2, args.repeats)
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
