"""`python -m kiln env|replay|download`: kiln's command line.

    python -m kiln env [--json]                       what a bug report needs about this machine
    python -m kiln replay <dump> [--device D] [--exact]   re-run dumped calls, compare the outputs
    python -m kiln download --arch-list "8.0 9.0a"    prefetch precompiled modules (docs/release.md)

The build graph has its own command line: `kiln-build` (or `python -m kiln.codegen`; `python -m
codegen` from the repository root).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import download


def cmd_env(args) -> int:
    from .diagnostics import env_report

    report = env_report.collect()
    print(json.dumps(report, indent=2, default=str) if args.json else env_report.format_text(report))
    return 0


def cmd_replay(args) -> int:
    from .diagnostics import replay

    try:
        dumps = replay.find_dumps(Path(args.dump))
    except replay.ReplayError as e:
        print(f"kiln replay: error: {e}", file=sys.stderr)
        return replay.UNUSABLE
    worst = 0
    for d in dumps:
        worst = max(worst, replay.replay(d, device=args.device, exact=args.exact))
    if len(dumps) > 1:
        print(f"{len(dumps)} dumps replayed; "
              f"{'all reproduced' if worst == 0 else 'some were not reproduced or could not be replayed'}")
    return worst


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kiln", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env", help="kiln, Python, torch, CUDA, GPUs, archs, workspaces, variables")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("replay", help="re-run dumped calls (KILN_DUMP) and compare their outputs",
                       description="Exit status: 0 reproduced, 1 not reproduced, 2 not replayable.")
    p.add_argument("dump", help="a call directory, its call.json, or a directory of dumps")
    p.add_argument("--device", help="run on this device instead of the recorded one, e.g. cpu")
    p.add_argument("--exact", action="store_true", help="outputs must be bitwise identical")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("download", help=download.HELP, description=download.HELP)
    download.add_arguments(p)
    p.set_defaults(func=download.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
