"""Cold compile time of modules, one at a time, each into an empty workspace: the wall clock of
`jit.build` (render, ninja with every job, publish), for the specialisations a label and --set
name. It imports kiln from --root's python/ (or, for a tree of the older layout with codegen/ and
runtime/ at the top, from there), so two trees can be compared on one machine:

    python benchmarks/compile_modules.py --root . --label //ops:attention \\
        --set dtype=bf16 --set head_dim=128 --set soft_cap=false --toolchain cuda --arch-list 9.0a
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _import_kiln(root: Path) -> None:
    sys.path.insert(0, str(root / "python"))
    import kiln

    if not (root / "python" / "kiln" / "runtime").is_dir():  # the older layout
        kiln.__path__.append(str(root))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="the source tree to build from")
    ap.add_argument("--label", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="AXIS=VALUE")
    ap.add_argument("--toolchain", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--arch-list", default="9.0a")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", help="append one JSON line per module here")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    _import_kiln(root)
    from kiln.codegen.dispatch import expand
    from kiln.codegen.graph import load_graph
    from kiln.codegen.specs import compile_spec
    from kiln.runtime import jit
    from kiln.runtime.arch import ArchContext, parse_arch_list
    from kiln.runtime.workspace import Workspace

    graph = load_graph(root)
    sel: dict[str, list[str]] = {}
    for s in args.set:
        axis, _, value = s.partition("=")
        sel.setdefault(axis, []).append(value)
    ctx = ArchContext(parse_arch_list(args.arch_list), f"--arch-list {args.arch_list}")
    rows = []
    for target in graph.resolve(args.label):
        for spec in expand(target, {a: v for a, v in sel.items() if a in target.axes}):
            cs = compile_spec(spec, args.toolchain, graph)
            with tempfile.TemporaryDirectory(prefix="kiln-compile-") as ws:
                start = time.perf_counter()
                status, _ = jit.build(cs, ctx if args.toolchain == "cuda" else None,
                                      workspace=Workspace(Path(ws)), jobs=args.jobs, quiet=True)
                seconds = time.perf_counter() - start
            assert status == "built", status
            row = {"module": cs.name, "label": target.label, "toolchain": args.toolchain,
                   "archs": args.arch_list if args.toolchain == "cuda" else "", "seconds": round(seconds, 2),
                   "jobs": args.jobs, "cores": os.cpu_count(), "tree": str(root)}
            rows.append(row)
            print(f"{cs.name:<60} {seconds:7.1f} s", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"total {sum(r['seconds'] for r in rows):.1f} s for {len(rows)} module(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
