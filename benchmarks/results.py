"""Benchmark records: one JSON object per (workload, backend, timing mode), written as JSON
lines, and read back from JSON lines or a JSON array. Results of the interim bench_norm.py
script that the harness replaced (benchmarks/results/h200-2026-11-30/norm_h200.json) are read
too, converted to this format (their `source_format` says so).

A record (docs/benchmarks.md describes every field):
  schema, routine, definition, api, backend, backend_version, status (ok | failed |
  unavailable), error, axes, scalars, dtype, device{...}, software{...}, check{...},
  timing{mechanism, cuda_graph, measurements, calls_per_measurement, warmup_calls,
  rotating_sets, set_bytes, cache_bytes, cold_cache, fallback}, median_us, mean_us, std_us,
  min_us, max_us, bytes_per_call, flops_per_call, gbps, tflops, ceilings{...},
  fraction_of_copy_bandwidth, fraction_of_gemm_rate, repro, timestamp
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

SCHEMA = "kiln-bench/1"
STATS = ("median_us", "mean_us", "std_us", "min_us", "max_us")


class JsonLinesWriter:
    """Appends records to a file as they are produced (a crash keeps what was measured)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._f: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = path.open("w")

    def write(self, record: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(record, sort_keys=False) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def load(path: Path | str) -> list[dict[str, Any]]:
    """Records from a JSON-lines file or a JSON array, each tagged with `source` (the path)."""
    path = Path(path)
    text = path.read_text()
    if text.lstrip().startswith("["):
        raw = json.loads(text)
    else:
        raw = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    raw.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not a JSON record ({e})") from e
    records = [r if r.get("schema") == SCHEMA else from_bench_norm(r, path) for r in raw]
    for r in records:
        r["source"] = str(path)
    return records


def load_all(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    return [r for p in paths for r in load(p)]


_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def from_bench_norm(r: dict[str, Any], path: Path) -> dict[str, Any]:
    """A record of the interim benchmarks/bench_norm.py in this format."""
    if "shape" not in r or "timing" not in r or "backend" not in r:
        raise ValueError(f"{path}: a record is neither {SCHEMA} nor bench_norm's format: "
                         f"{sorted(r)[:8]}...")
    ok = r.get("reference_check") == "passed" and "median_us" in r
    copy_gbps = r["copy_bandwidth_tbps"] * 1e3
    out = {
        "schema": SCHEMA, "source_format": "bench_norm", "routine": r["routine"], "definition": None,
        "api": f"kiln.{r['routine']}", "backend": r["backend"], "backend_version": None,
        "status": "ok" if ok else "failed",
        "error": None if ok else r.get("reference_check"),
        "axes": dict(r["shape"]), "scalars": {}, "dtype": _DTYPES.get(r["dtype"], r["dtype"]),
        "device": {"type": "cuda", **r["gpu"], "cache_bytes": r["gpu"].get("l2_bytes")},
        "software": {"kiln_version": r["kiln_version"], "git_commit": r["git_commit"],
                     "git_dirty": None, "torch_version": r["torch"], "python_version": r["python"]},
        "check": {"status": "passed" if r.get("reference_check") == "passed" else "failed"},
        "timing": {"mechanism": "cuda_events", "cuda_graph": r["timing"] == "cuda_graph",
                   "measurements": r["measurements"],
                   "calls_per_measurement": r["calls_per_measurement"],
                   "rotating_sets": r["rotating_buffers"]},
        "bytes_per_call": r["bytes_per_call"], "flops_per_call": None,
        "ceilings": {"copy_gbps": copy_gbps, "copy_how": "device-to-device copy of 1024 MiB"},
        "repro": r["repro"],
    }
    if ok:
        out.update({k: r[k] for k in STATS})
        out["gbps"] = r["gbps"]
        out["tflops"] = None
        out["fraction_of_copy_bandwidth"] = r["fraction_of_copy_bw"]
    return out


def shape_label(r: dict[str, Any]) -> str:
    return " x ".join(str(v) for v in r["axes"].values())


def axes_label(r: dict[str, Any]) -> str:
    return " x ".join(r["axes"])


def mode_label(r: dict[str, Any]) -> str:
    t = r["timing"]
    return t["mechanism"] + ("+graph" if t.get("cuda_graph") else "")
