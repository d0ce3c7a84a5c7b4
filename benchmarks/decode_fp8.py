"""Paged decode over an fp8 E4M3 KV cache against the bf16 cache it was quantised from, on one GPU.

    python benchmarks/decode_fp8.py [--workloads 64x4096 256x2048 1x4096 1x32768] [--peers]
                                    [--min-chunk 256 128] [--out decode_fp8.jsonl]

Llama-3.1-8B attention (GQA 32/8, head_dim 128), page 16, bf16 queries. Each workload holds
several input sets (fresh random caches, pages handed out in random order), enough that the
rotation touches more than the 50 MB L2 between calls; the fp8 caches are the bf16 ones quantised
per tensor (scale = absmax / 448), so both backends read the same values up to E4M3 rounding.

Per workload and backend: a reference check first (NaN-filled output against the float32
reference on what the backend reads: the bf16 cache, or the fp8 cache times its scales, at the
bf16 decode tolerance), then the harness's timer (benchmarks/timing.py: CUDA events, 30
measurements of ~2 ms each) eager and replaying a CUDA graph. torch's SDPA runs on the bf16 K/V
gathered into contiguous [batch, kv_heads, kv_len, head_dim] tensors (what a user without a paged
kernel would run). `--peers` adds FlashInfer 0.7's decode wrapper on both caches (k_scale /
v_scale) where it imports. `--min-chunk` times kiln once per split-KV minimum chunk (the
schedule's MIN_CHUNK; the first value is also the one the other backends' rows go with). The
floor is the cache bytes read / 4.3 TB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.*, from any cwd

HQ, HK, D, PAGE = 32, 8, 128, 16
COPY_TBPS = 4.3
L2_BYTES = 50 << 20
TOL = (2e-2, 2e-2)  # bf16 output: the decode trace's tolerance


def _inputs(batch: int, kv_len: int, gen, device):
    """One input set: the page table (the decode trace's), q, the bf16 cache and its fp8 copy."""
    import torch

    from kiln.trace.attention import paged_decode_inputs

    axes = {"batch_size": batch, "kv_len": kv_len, "page_size": PAGE}
    cpu_gen = torch.Generator().manual_seed(int(torch.randint(1 << 30, (1,), generator=gen, device=device)))
    table = paged_decode_inputs(None, axes, "bfloat16", device, cpu_gen)
    pages = int(table["indptr"][-1])
    cache = torch.randn((pages, 2, PAGE, HK, D), generator=gen, device=device).bfloat16()
    k_scale = float(cache[:, 0].abs().max()) / 448.0
    v_scale = float(cache[:, 1].abs().max()) / 448.0
    fp8 = torch.stack(
        [(cache[:, i].float() / s).clamp(-448, 448) for i, s in enumerate((k_scale, v_scale))], 1
    )
    q = torch.randn((batch, HQ, D), generator=gen, device=device).bfloat16()
    return {
        **table,
        "q": q,
        "bf16": cache,
        "fp8": fp8.to(torch.float8_e4m3fn),
        "k_scale": k_scale,
        "v_scale": v_scale,
    }


def _reference(inp, which: str):
    import torch

    from kiln.trace.attention import attend

    cache = inp[which]
    if which == "fp8":
        cache = torch.stack([cache[:, 0].float() * inp["k_scale"], cache[:, 1].float() * inp["v_scale"]], 1)
    out = torch.empty(inp["q"].shape, dtype=torch.float32, device=inp["q"].device)
    for b in range(inp["q"].shape[0]):
        pages = inp["indices"][inp["indptr"][b] : inp["indptr"][b + 1]].long()
        kv_len = (len(pages) - 1) * PAGE + int(inp["last_page_len"][b])
        k, v = (cache[pages, i].reshape(-1, HK, D)[:kv_len] for i in (0, 1))
        out[b] = attend(inp["q"][b], k, v)[0]
    return out


def _plan(w, inp, which: str):
    """Plan wrapper `w` (kiln's or FlashInfer's: the same arguments) for input set `inp`'s cache
    `which`; (q, cache, the run's scale arguments)."""
    import torch

    kv_dtype = torch.float8_e4m3fn if which == "fp8" else torch.bfloat16
    w.plan(
        inp["indptr"],
        inp["indices"],
        inp["last_page_len"],
        HQ,
        HK,
        D,
        PAGE,
        q_data_type=torch.bfloat16,
        kv_data_type=kv_dtype,
    )
    scales = {"k_scale": inp["k_scale"], "v_scale": inp["v_scale"]} if which == "fp8" else {}
    return inp["q"], inp[which], scales


def _kiln(inp, which: str, workspace, min_chunk: int | None = None):
    import torch

    import kiln
    from kiln import _decode_schedule

    w = kiln.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    default = _decode_schedule.MIN_CHUNK
    _decode_schedule.MIN_CHUNK = min_chunk or default
    try:
        q, cache, scales = _plan(w, inp, which)
    finally:
        _decode_schedule.MIN_CHUNK = default
    out = torch.full_like(q, float("nan"))
    return out, lambda: w.run(q, cache, out=out, **scales)


def _sdpa(inp, which: str, workspace):
    import torch
    import torch.nn.functional as F

    from benchmarks.routines.attention import dense_kv

    k, v = dense_kv({**inp, "paged_kv_cache": inp["bf16"], "page_size": PAGE})
    q = inp["q"].unsqueeze(2)
    out = torch.empty_like(inp["q"])

    def run():
        out.copy_(F.scaled_dot_product_attention(q, k, v, enable_gqa=True).squeeze(2))

    return out, run


def _flashinfer(inp, which: str, workspace):
    import flashinfer
    import torch

    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=False)
    q, cache, scales = _plan(w, inp, which)
    out = torch.empty_like(q)

    def run():
        out.copy_(w.run(q, cache, **scales))

    return out, run


def _measure(batch: int, kv_len: int, sets: list, backends: list, graphs: bool) -> list[dict]:
    import torch

    from benchmarks.timing import Settings, measure

    rows = []
    kv_bytes = {"bf16": batch * kv_len * HK * D * 2 * 2, "fp8": batch * kv_len * HK * D * 2}
    for name, which, make, min_chunk in backends:
        workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        runs = []
        for i, inp in enumerate(sets):
            out, run = make(inp, which, workspace)
            if i == 0:  # the reference check, on a NaN-filled output
                run()
                torch.cuda.synchronize()
                want = _reference(inp, which)
                err = (out.float() - want).abs().max().item()
                torch.testing.assert_close(out.float(), want, rtol=TOL[0], atol=TOL[1], msg=f"{name} {which}")
            runs.append(run)
        for cuda_graph in (False, True) if graphs else (False,):
            m = measure(
                runs,
                torch.device("cuda"),
                Settings(measurements=30, timer="cuda_events", cuda_graph=cuda_graph),
            )
            us = sorted(t * 1e6 for t in m.per_call_s)
            med = statistics.median(us)
            floor = kv_bytes[which] / (COPY_TBPS * 1e6)
            rows.append(
                {
                    "workload": f"paged decode B{batch} L{kv_len}",
                    "batch_size": batch,
                    "kv_len": kv_len,
                    "num_qo_heads": HQ,
                    "num_kv_heads": HK,
                    "head_dim": D,
                    "page_size": PAGE,
                    "backend": name,
                    "kv_cache": which,
                    "min_chunk": min_chunk,
                    "cuda_graph": cuda_graph,
                    "median_us": med,
                    "p10_us": us[len(us) // 10],
                    "p90_us": us[-1 - len(us) // 10],
                    "measurements": len(us),
                    "calls_per_measurement": m.calls_per_measurement,
                    "timing": m.mechanism,
                    "input_sets": len(sets),
                    "kv_bytes": kv_bytes[which],
                    "floor_us": floor,
                    "tb_per_s": kv_bytes[which] / med / 1e6,
                    "reference_check": "passed",
                    "max_abs_err": err,
                    "rtol": TOL[0],
                    "atol": TOL[1],
                    "gpu": torch.cuda.get_device_name(),
                    "dtype": "bfloat16",
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["64x4096", "256x2048", "1x4096", "1x32768"])
    ap.add_argument("--peers", action="store_true", help="also FlashInfer's decode on the same caches")
    ap.add_argument("--min-chunk", nargs="+", type=int, default=[])
    ap.add_argument("--no-sdpa", action="store_true", help="leave torch's SDPA out")
    ap.add_argument("--out")
    args = ap.parse_args()
    import functools

    import torch

    from kiln import _decode_schedule

    gen = torch.Generator(device="cuda").manual_seed(0)
    chunks = args.min_chunk or [_decode_schedule.MIN_CHUNK]
    backends = [
        ("kiln", which, functools.partial(_kiln, min_chunk=c), c) for c in chunks for which in ("bf16", "fp8")
    ]
    if not args.no_sdpa:
        backends.append(("torch_sdpa", "bf16", _sdpa, None))
    if args.peers:
        try:
            import flashinfer  # noqa: F401

            backends += [("flashinfer", "bf16", _flashinfer, None), ("flashinfer", "fp8", _flashinfer, None)]
        except ImportError as e:
            print(f"# flashinfer not importable: {e}", flush=True)
    for spec in args.workloads:
        batch, kv_len = (int(x) for x in spec.split("x"))
        bf16_bytes = batch * kv_len * HK * D * 2 * 2
        sets = [
            _inputs(batch, kv_len, gen, "cuda") for _ in range(max(1, min(8, -(-2 * L2_BYTES // bf16_bytes))))
        ]
        for row in _measure(batch, kv_len, sets, backends, graphs=True):
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
        del sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
