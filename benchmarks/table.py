"""Results as a readable table (aligned text for a terminal, or Markdown for docs). Failed and
unavailable results show why, never numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .results import mode_label, shape_label

COLUMNS = ("routine", "example", "shape", "backend", "timing", "median us", "min-max us", "std us",
           "n", "GB/s", "TFLOP/s", "of copy BW", "status")


def _example(r: dict[str, Any]) -> str:
    d = r.get("definition")
    return d.split("/", 1)[1] if d else "-"


def row(r: dict[str, Any]) -> list[str]:
    head = [r["routine"], _example(r), f"{shape_label(r)} ({' x '.join(r['axes'])})", r["backend"]]
    if r["status"] != "ok":
        why = r.get("error") or ""
        return head + [mode_label(r) if r.get("timing", {}).get("mechanism") else "-"] + ["-"] * 7 + [
            f"{r['status'].upper()}: {why}"]
    t = r["timing"]
    frac = r.get("fraction_of_copy_bandwidth")
    return head + [
        mode_label(r),
        f"{r['median_us']:.2f}",
        f"{r['min_us']:.2f}-{r['max_us']:.2f}",
        f"{r['std_us']:.2f}",
        f"{t['measurements']}x{t['calls_per_measurement']}",
        f"{r['gbps']:.1f}" if r.get("gbps") is not None else "-",
        f"{r['tflops']:.3f}" if r.get("tflops") is not None else "-",
        f"{frac:.0%}" if frac is not None else "-",
        "ok",
    ]


def header(records: Sequence[dict[str, Any]]) -> str:
    """One line naming where the numbers come from: device, dtype, software, ceilings."""
    if not records:
        return "no results"
    r = records[0]
    dev, sw = r["device"], r["software"]
    arch = f"sm {dev['arch']}" if dev["type"] == "cuda" else dev.get("arch", "")
    parts = [f"{dev['name']} ({arch})", ", ".join(sorted({x['dtype'] for x in records})),
             f"torch {sw['torch_version']}", f"kiln {sw['kiln_version']} ({str(sw['git_commit'])[:12]}"
             + (", dirty" if sw.get("git_dirty") else "") + ")"]
    ceil = r.get("ceilings")
    if ceil:
        parts.append(f"measured copy bandwidth {ceil['copy_gbps']:.0f} GB/s")
        if ceil.get("gemm_tflops"):
            parts.append(f"GEMM {ceil['gemm_tflops']:.1f} TFLOP/s ({ceil['gemm_how']})")
    parts.append("n = measurements x calls per measurement")
    return "; ".join(parts)


def render(records: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    rows = [row(r) for r in records]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in rows]
        return header(records) + "\n\n" + "\n".join(lines) + "\n"
    widths = [max(len(c) for c in col) for col in zip(COLUMNS, *rows, strict=True)]
    # The status column is last and may be long: no padding for it.

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)) + "  " + cells[-1]

    return "\n".join([header(records), fmt(list(COLUMNS)), *[fmt(c) for c in rows]]) + "\n"
