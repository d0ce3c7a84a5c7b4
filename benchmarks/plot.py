"""Achieved bandwidth (or throughput) against workload size, one panel per routine, one line per
backend and timing mode, the measured ceiling dashed. Needs matplotlib (pip install
'kiln-kernels[bench]')."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .results import mode_label


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("plot needs matplotlib: pip install 'kiln-kernels[bench]' "
                         f"(or pip install matplotlib) ({e})") from e
    return plt


def plot(records: Sequence[dict[str, Any]], out: Path) -> Path:
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        raise ValueError("no successful results to plot (every record failed or was unavailable)")
    plt = _matplotlib()
    routines = list(dict.fromkeys(r["routine"] for r in ok))
    fig, axes = plt.subplots(len(routines), 1, figsize=(9, 3.6 * len(routines)), squeeze=False)
    for ax, routine in zip(axes[:, 0], routines, strict=True):
        rs = [r for r in ok if r["routine"] == routine]
        use_bw = all(r.get("gbps") is not None for r in rs)
        lines = defaultdict(list)
        for r in rs:
            y = r["gbps"] if use_bw else r.get("tflops")
            if y is not None:
                lines[(r["backend"], mode_label(r))].append((r["bytes_per_call"], y))
        # One colour per backend, dashed for CUDA-graph timings.
        colours = {b: f"C{i}" for i, b in enumerate(sorted({b for b, _ in lines}, key=lambda b: b != "kiln"))}
        for (backend, mode), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    color=colours[backend], linestyle="--" if "graph" in mode else "-",
                    label=f"{backend} ({mode})")
        ceil = rs[0].get("ceilings") or {}
        limit = ceil.get("copy_gbps") if use_bw else ceil.get("gemm_tflops")
        if limit:
            ax.axhline(limit, linestyle="--", color="grey",
                       label=f"measured {'copy bandwidth' if use_bw else 'GEMM rate'}")
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved per call (counted)")
        ax.set_ylabel("achieved GB/s" if use_bw else "achieved TFLOP/s")
        ax.set_title(f"{routine}, {rs[0]['dtype']}, {rs[0]['device']['name']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
