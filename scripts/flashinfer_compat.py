"""FlashInfer's test cases against kiln: a run's summary, and README's table made from summaries.

tests/flashinfer re-creates FlashInfer 0.7's test files (tests/flashinfer/conftest.py). A run of
them with `--junitxml` is summarised per test module (passed, failed, skipped and each skip's
reason) into a small JSON file that is committed beside the tests; README's FlashInfer table is
made from those files, never typed by hand:

    python scripts/flashinfer_compat.py summarise run.xml --device cpu \
        --out tests/flashinfer/results/cpu.json
    python scripts/flashinfer_compat.py readme tests/flashinfer/results/*.json

Each module's entry says which kiln commit ran it and how: the N of pytest's `--sample` (every
N-th case kept; tests/conftest.py records it on each case as the junit property "sample") and
`--stopped` (the run hit its time limit: the counts are the cases that finished). `merge` joins
runs of one device, a later file's modules replacing an earlier's (a round of the modules a fix
touched on top of a full one); the table's footnote says each module's run.

A skip whose reason begins neither "kiln does not claim" (conftest.not_claimed) nor "FlashInfer's
own test skips" (conftest.flashinfer_skips) is counted apart: the table shows it, so a skip that
is not declared cannot hide.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests" / "flashinfer"
NOT_CLAIMED = "kiln does not claim"
FLASHINFER_SKIP = "FlashInfer's own test skips"  # a case FlashInfer's test skips itself, kept as it is
BEGIN, END = "<!-- flashinfer:table:begin -->", "<!-- flashinfer:table:end -->"
_SOURCE = re.compile(r"FlashInfer 0\.7's ((?:tests/)?\S+\.py)")


def _module_of(classname: str) -> str | None:
    parts = classname.split(".")
    if "flashinfer" not in parts:
        return None
    rest = parts[parts.index("flashinfer") + 1:]
    # test_compat_report tests this script: it re-creates nothing of FlashInfer's
    return rest[0] if rest and rest[0].startswith("test_") and rest[0] != "test_compat_report" else None


def flashinfer_sources(module: str) -> list[str]:
    """The FlashInfer test files a module says (in its docstring's first lines) it re-creates."""
    path = TESTS / f"{module}.py"
    head = path.read_text().split('"""')[1] if path.is_file() else ""
    return sorted(set(_SOURCE.findall(head)))


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()


def _sample_of(case: ET.Element) -> int:
    for prop in case.iter("property"):
        if prop.get("name") == "sample":
            return int(prop.get("value"))
    return 1


def summarise(junit: Path, device: str, stopped: bool = False, commit: str | None = None) -> dict:
    modules: dict[str, dict] = {}
    samples: dict[str, set[int]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = _module_of(case.get("classname", ""))
        if module is None:
            continue
        m = modules.setdefault(module, {"passed": 0, "failed": 0, "skipped": 0, "not_claimed": {},
                                        "other_skips": {}, "failures": []})
        samples.setdefault(module, set()).add(_sample_of(case))
        skipped = case.find("skipped")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        if skipped is not None:
            reason = (skipped.get("message") or "").removeprefix("Skipped: ").strip()
            key = "not_claimed" if reason.startswith((NOT_CLAIMED, FLASHINFER_SKIP)) else "other_skips"
            m[key][reason] = m[key].get(reason, 0) + 1
            m["skipped"] += 1
        elif failed is not None:
            m["failed"] += 1
            if len(m["failures"]) < 20:
                m["failures"].append(case.get("name"))
        else:
            m["passed"] += 1
    for name, m in modules.items():
        m["flashinfer_files"] = flashinfer_sources(name)
        # one rate per module (--sample sets it per module); the sparsest if a file mixed runs
        m["run"] = {"kiln_commit": commit or _head(), "sample": max(samples[name]), "stopped": stopped}
    return {"device": device, "modules": dict(sorted(modules.items()))}


def merge(summaries: list[dict]) -> dict:
    """One device's summaries as one: each module as the last summary that has it ran it."""
    devices = {s["device"] for s in summaries}
    if len(devices) != 1:
        raise SystemExit(f"merge joins runs of one device, got {sorted(devices)}")
    modules: dict[str, dict] = {}
    for s in summaries:
        modules.update(s["modules"])
    return {"device": devices.pop(), "modules": dict(sorted(modules.items()))}


def _describe(run: dict) -> str:
    how = "every case" if run["sample"] == 1 else f"one case in {run['sample']}"
    stopped = ", stopped at its time limit (the cases that finished)" if run["stopped"] else ""
    return f"{how} at {run['kiln_commit']}{stopped}"


def _cell(m: dict | None) -> str:
    if m is None:
        return "not run"
    run = m["passed"] + m["failed"]
    text = f"{m['passed']} / {run}"
    if m["failed"]:
        text += f" (**{m['failed']} fail**)"
    other = sum(m["other_skips"].values())
    if other:
        text += f", {other} other skips"
    return text


def table(summaries: list[dict]) -> str:
    devices = [s["device"] for s in summaries]
    modules = sorted({name for s in summaries for name in s["modules"]})
    lines = [
        "| FlashInfer test file | re-created as | " + " | ".join(f"{d}: passed / run" for d in devices)
        + " | skipped: not claimed by kiln, or skipped by FlashInfer's own test (cases) |",
        "|---|---|" + "---|" * len(devices) + "---|",
    ]
    for name in modules:
        per = [s["modules"].get(name) for s in summaries]
        sources = next((m["flashinfer_files"] for m in per if m and m["flashinfer_files"]), [])
        reasons: Counter = Counter()
        for m in per:
            if m:
                reasons.update(m["not_claimed"])
        skips = "; ".join(f"{r.removeprefix(NOT_CLAIMED).strip()} ({n})" for r, n in sorted(reasons.items()))
        lines.append(f"| {', '.join(f'`{s}`' for s in sources) or '-'} | "
                     f"[{name}.py](tests/flashinfer/{name}.py) | "
                     + " | ".join(_cell(m) for m in per) + f" | {skips or '-'} |")
    runs = []
    for s in summaries:
        groups: dict[str, list[str]] = {}
        for name, m in s["modules"].items():
            groups.setdefault(_describe(m["run"]), []).append(name.removeprefix("test_"))
        parts = [f"{how} ({', '.join(names)})" if len(groups) > 1 else how for how, names in groups.items()]
        runs.append(f"{s['device']}: " + "; ".join(parts))
    return "\n".join(lines) + "\n\nCounts per case (a parametrisation). Runs: " + ". ".join(runs) + ".\n"


def write_readme(summaries: list[dict], paths: list[Path]) -> None:
    readme = REPO / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} section")
    shown = " ".join(str(p.relative_to(REPO)) for p in paths)
    command = f"<!-- generated by: python scripts/flashinfer_compat.py readme {shown} -->"
    body = f"{BEGIN}\n{command}\n{table(summaries)}"
    head, rest = text.split(BEGIN, 1)
    readme.write_text(head + body + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarise", help="a junit XML of tests/flashinfer -> a JSON summary")
    s.add_argument("junit", type=Path)
    s.add_argument("--device", required=True, help="the column's name: cpu, h200, ...")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--stopped", action="store_true", help="the run stopped at its time limit")
    s.add_argument("--commit", help="the kiln commit that ran (default: this checkout's HEAD)")
    g = sub.add_parser("merge", help="one device's summaries as one, later files' modules first")
    g.add_argument("summaries", type=Path, nargs="+")
    g.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("readme", help="rewrite README.md's FlashInfer table from JSON summaries")
    r.add_argument("summaries", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "summarise":
        summary = summarise(args.junit, args.device, args.stopped, args.commit)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        for name, m in summary["modules"].items():
            print(f"{name}: {m['passed']} passed, {m['failed']} failed, {m['skipped']} skipped")
        return 0
    if args.cmd == "merge":
        merged = merge([json.loads(p.read_text()) for p in args.summaries])
        args.out.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        return 0
    paths = [p.resolve() for p in args.summaries]
    write_readme([json.loads(p.read_text()) for p in paths], paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
