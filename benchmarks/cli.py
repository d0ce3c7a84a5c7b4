"""The command line: python -m benchmarks run|list|definitions|table|plot|readme-table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kiln.trace import dtype_name

from . import definitions as defs_mod
from . import environment, harness, readme, results, table, timing
from .routines import ROUTINES, routine
from .selection import PRESETS, select

REPO = Path(__file__).resolve().parents[1]


def _progress(rec: dict) -> None:
    shape = " ".join(f"{k}={v}" for k, v in rec["axes"].items())
    where = rec["definition"] or "ad hoc"
    if rec["status"] == "ok":
        frac = rec.get("fraction_of_copy_bandwidth")
        what = (f"{rec['median_us']:10.2f} us  {rec['gbps']:8.1f} GB/s"
                + (f" ({frac:.0%} of copy)" if frac is not None else "")
                + f"  [{results.mode_label(rec)}]")
    else:
        what = f"{rec['status'].upper()}: {rec['error']}"
    print(f"{rec['routine']:<24} {where:<40} {shape:<24} {rec['backend']:<10} {what}",
          file=sys.stderr, flush=True)


def cmd_run(a: argparse.Namespace) -> int:
    names = (list(ROUTINES) if a.routine == "all"
             else [routine(n.strip()).name for n in a.routine.split(",") if n.strip()])
    device = environment.pick_device(a.device)
    dtype = dtype_name(a.dtype)
    cuda = device.type == "cuda"
    settings = timing.Settings(
        measurements=a.repeats or (50 if cuda else 10),
        target_s=(a.target_ms or (2.0 if cuda else 5.0)) * 1e-3,
        warmup_s=0.025 if cuda else 0.005,
        timer=a.timer, cuda_graph=a.cuda_graph)
    backends = tuple(b.strip() for b in a.backends.split(",")) if a.backends else None
    for name in names:  # fail on a typo before measuring anything
        for b in backends or ():
            routine(name).backend(b)
    writer = results.JsonLinesWriter(Path(a.output) if a.output else None)
    opts = harness.Options(device, dtype, backends, settings, not a.no_ceilings, a.verbose)
    runner = harness.Runner(opts, lambda rec: (writer.write(rec), _progress(rec)))
    records, start = [], time.perf_counter()
    try:
        for name in names:
            r = routine(name)
            if dtype not in r.template.dtypes:
                print(f"{name}: skipped, it has no {dtype} (dtypes: {', '.join(r.template.dtypes)})",
                      file=sys.stderr)
                continue
            for case in select(r, defs_mod.load(name), a.shapes):
                records += runner.run_case(case)
    finally:
        writer.close()
    print(table.render(records, markdown=a.markdown))
    if a.repro:
        print("\n".join(f"# {r['routine']} {r['backend']} {results.shape_label(r)}\n{r['repro']}"
                        for r in records))
    failed = [r for r in records if r["status"] == "failed"]
    print(f"{len(records)} results ({len(failed)} failed, "
          f"{sum(r['status'] == 'unavailable' for r in records)} unavailable) in "
          f"{time.perf_counter() - start:.0f} s" + (f"; JSON lines in {a.output}" if a.output else ""),
          file=sys.stderr)
    return 1 if failed else 0


def cmd_list(a: argparse.Namespace) -> int:
    for name, r in ROUTINES.items():
        t = r.template
        axes = ", ".join(f"{n} ({ax.kind})" for n, ax in t.axes.items())
        print(f"{name}: kiln.{r.api.__qualname__}; backends {', '.join(b.name for b in r.backends)}; "
              f"axes {axes}; dtypes {', '.join(t.dtypes)}")
        for d in defs_mod.load(name):
            print(f"    {d.example}: {len(d.workloads)} workloads")
    return 0


def cmd_definitions(a: argparse.Namespace) -> int:
    if a.regenerate:
        changed = defs_mod.regenerate()
        print("\n".join(changed) if changed else "definitions are up to date")
        return 0
    problems = defs_mod.stale()
    for p in sorted(defs_mod.DEFINITIONS_DIR.rglob("*.json")):
        print(p.relative_to(REPO))
    if problems:
        print("stale (run python -m benchmarks definitions --regenerate):\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    return 0


def cmd_table(a: argparse.Namespace) -> int:
    print(table.render(results.load_all(a.results), markdown=a.markdown), end="")
    return 0


def cmd_plot(a: argparse.Namespace) -> int:
    from . import plot

    out = Path(a.output or Path(a.results[0]).with_suffix(".png"))
    print(plot.plot(results.load_all(a.results), out))
    return 0


def cmd_readme_table(a: argparse.Namespace) -> int:
    path = Path(a.readme)
    changed = readme.rewrite(path, readme.generate(a.results, path, a.rows, a.cuda_graph,
                                                   readme.parse_routines(a.routines)))
    print(f"{path}: {'updated' if changed else 'already up to date'}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="kiln's benchmark harness")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="check and time routines")
    run.add_argument("routine", help=f"one of {', '.join(ROUTINES)}, a comma-separated list "
                                     "of them (run in that order), or all")
    run.add_argument("--backends", help="comma-separated (default: every backend of the routine)")
    run.add_argument("--dtype", default="bf16", help="bf16, f16, f32 (or torch names); default bf16")
    run.add_argument("--shapes", action="append", default=[],
                     help=f"{' | '.join(PRESETS)} | <example>[:axis=v,...] | axis=v,...; repeatable "
                          "(default: examples)")
    run.add_argument("--device", default="auto", help="auto (default), cuda or cpu")
    run.add_argument("--cuda-graph", action="store_true",
                     help="time CUDA-graph replays of the batch instead of eager launches")
    run.add_argument("--timer", default="auto", choices=timing.TIMERS,
                     help="auto: cupti when importable on CUDA, else cuda_events; host on the CPU")
    run.add_argument("--repeats", type=int, help="measurements per result (default 50 CUDA, 10 CPU)")
    run.add_argument("--target-ms", type=float, help="length of one measurement (default 2 CUDA, 5 CPU)")
    run.add_argument("--no-ceilings", action="store_true", help="skip measuring copy bandwidth and GEMM rate")
    run.add_argument("--output", help="write JSON lines here (one record per result)")
    run.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    run.add_argument("--repro", action="store_true", help="print each result's repro command line")
    run.add_argument("--verbose", action="store_true", help="print tracebacks of failing backends")
    run.set_defaults(func=cmd_run)

    sub.add_parser("list", help="routines, backends and definitions").set_defaults(func=cmd_list)

    d = sub.add_parser("definitions", help="list the committed definitions, or --regenerate them")
    d.add_argument("--regenerate", action="store_true", help="rewrite them from the trace templates")
    d.set_defaults(func=cmd_definitions)

    t = sub.add_parser("table", help="print result files as a table")
    t.add_argument("results", nargs="+")
    t.add_argument("--markdown", action="store_true")
    t.set_defaults(func=cmd_table)

    pl = sub.add_parser("plot", help="PNG of achieved bandwidth vs shape per backend (matplotlib)")
    pl.add_argument("results", nargs="+")
    pl.add_argument("-o", "--output", help="PNG path (default: the first results file's, .png)")
    pl.set_defaults(func=cmd_plot)

    rt = sub.add_parser("readme-table", help="rewrite the README's headline block from result files")
    rt.add_argument("results", nargs="+")
    rt.add_argument("--readme", default=str(REPO / "README.md"))
    rt.add_argument("--rows", type=int, default=2, help="workloads per routine (largest to smallest)")
    rt.add_argument("--cuda-graph", action="store_true", help="use the CUDA-graph results")
    rt.add_argument("--routines", help="comma-separated routines to show, in that order "
                                       "(default: every routine in the results)")
    rt.set_defaults(func=cmd_readme_table)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.func(a)
    except (KeyError, ValueError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
