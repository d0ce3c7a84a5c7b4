"""Render benchmark result JSON (from bench_norm.py) as a Markdown table, so the numbers in docs
are generated from the committed results, never typed by hand.

    python benchmarks/summarize.py benchmarks/results/h200-2026-11-30/norm_h200.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(records: list[dict]) -> str:
    rows = ["| tokens x hidden | backend | timing | median us | min-max us | std us | n | GB/s | "
            "of copy BW | check |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        shape = f"{r['shape']['tokens']} x {r['shape']['hidden']}"
        if "median_us" not in r:
            rows.append(f"| {shape} | {r['backend']} | {r['timing']} | - | - | - | - | - | - | "
                        f"{r['reference_check']} |")
            continue
        rows.append(
            f"| {shape} | {r['backend']} | {r['timing']} | {r['median_us']:.2f} | "
            f"{r['min_us']:.2f}-{r['max_us']:.2f} | {r['std_us']:.2f} | "
            f"{r['measurements']}x{r['calls_per_measurement']} | {r['gbps']:.0f} | "
            f"{r['fraction_of_copy_bw']:.0%} | {r['reference_check']} |")
    first = records[0]
    head = (f"{first['gpu']['name']} (sm {first['gpu']['arch']}, {first['gpu']['sms']} SMs), "
            f"{first['dtype']}, torch {first['torch']}, kiln {first['kiln_version']} "
            f"({first['git_commit'][:12]}), measured copy bandwidth "
            f"{first['copy_bandwidth_tbps']:.2f} TB/s. n = measurements x calls per measurement.")
    return head + "\n\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(table(json.loads(Path(path).read_text())))
