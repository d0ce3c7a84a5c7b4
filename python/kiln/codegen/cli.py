"""`python -m codegen query|gen|build|explain|inspect|clean|where`: the build graph from the command
line.

Exit status 0 on success; otherwise non-zero, and the last line on stderr says why in one line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kiln.runtime import arch as arch_mod
from kiln.runtime import build as rt_build
from kiln.runtime import jit, ninja, resources
from kiln.runtime.arch import ArchContext
from kiln.runtime.lock import ModuleLock
from kiln.runtime.spec import CompileSpec
from kiln.runtime.toolchain import available
from kiln.runtime.workspace import Workspace

from . import inspection
from .batch import BuildFailed, build_all
from .dispatch import expand, released
from .graph import LabelError, load_graph
from .specs import compile_spec


class CliError(Exception):
    pass


def _selection(sets: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in sets or []:
        axis, sep, values = s.partition("=")
        if not sep or not axis or not values:
            raise CliError(f"--set expects axis=value[,value...], got {s!r}")
        out.setdefault(axis.strip(), []).extend(v.strip() for v in values.split(",") if v.strip())
    return out


def _specs(args, toolchain: str | None) -> list[CompileSpec]:
    graph = load_graph()
    targets = graph.resolve(args.label)
    selection = _selection(args.set)
    out = []
    for t in targets:
        chosen = [toolchain] if toolchain else list(t.toolchains)
        chosen = [tc for tc in chosen if tc in t.toolchains]
        if not chosen:
            continue
        # --set only constrains the targets that have the axis (a label may name several).
        sel = {a: v for a, v in selection.items() if a in t.axes} if len(targets) > 1 else selection
        for spec in expand(t, sel):
            out.extend(compile_spec(spec, tc, graph) for tc in chosen)
    if not out:
        raise CliError(f"{args.label} has no {toolchain or ''} specialisation to act on".replace("  ", " "))
    return out


def _default_toolchain(args) -> str:
    """--toolchain, else cuda when there is something to compile CUDA for, else host."""
    if args.toolchain:
        return args.toolchain
    if args.arch_list or ArchContext.current().requested:
        if not available("cuda"):
            raise CliError("CUDA archs were requested but nvcc is not available; install the CUDA "
                           "toolkit, set KILN_NVCC, or pass --toolchain host")
        return "cuda"
    return "host"


def cmd_query(args) -> int:
    graph = load_graph()
    targets = graph.resolve(args.label)
    for g in graph.groups:
        members = graph.resolve(g.label)
        if g.label == args.label.strip() or g.full_label == args.label.strip() or all(
                m in targets for m in members):
            print(f"{g.label}  -- group: {', '.join(m.label for m in members)}"
                  + (f"; {g.doc}" if g.doc else ""))
    for t in targets:
        specs = expand(t)
        fams = ", ".join(str(f) for f in _families(graph, t)) or "-"
        print(f"{t.label}" + (f"  -- {t.doc}" if t.doc else ""))
        print(f"  build file     {t.build_file.relative_to(graph.root)}")
        print(f"  toolchains     {', '.join(t.toolchains)}")
        print(f"  arch families  {fams}")
        for axis, values in t.dispatch:
            print(f"  axis {axis:<10}{', '.join(values)}")
        for ex in t.exclude:
            print(f"  unsupported    {', '.join(f'{a}={v}' for a, v in ex.match)}: {ex.reason}")
        print(f"  specialisations {len(specs)} (x {len(t.toolchains)} toolchain(s) = "
              f"{len(specs) * len(t.toolchains)} modules)")
        shipped = released(t)
        print(f"  release        {len(shipped)} specialisation(s) ship precompiled" +
              ("" if t.release is not None else " (no release= in its BUILD file)"))
        if args.specs:
            for s in specs:
                mods = ", ".join(s.module_name(tc) for tc in t.toolchains)
                print(f"    {s.uri:<40} {mods}" + ("  [release]" if s in shipped else ""))
    return 0


def _families(graph, target):
    from .specs import arch_families

    return arch_families(graph, target)


def cmd_gen(args) -> int:
    ws = Workspace.current()
    for spec in _specs(args, args.toolchain):
        gen_dir = rt_build.generated_dir(spec, ws)
        rt_build.generate_sources(spec, gen_dir, ws)
        print(f"{spec.name:<44} {gen_dir}")
    return 0


def cmd_build(args) -> int:
    toolchain = _default_toolchain(args)
    ctx = ArchContext.current(args.arch_list)
    specs = _specs(args, toolchain)
    what = f"{toolchain}" + (f" for [{arch_mod.format_arch_list(ctx.requested)}]"
                             if toolchain == "cuda" else "")
    print(f"building {len(specs)} module(s) of {args.label} with {what}; ", end="", flush=True)
    try:
        build_all(specs, ctx, toolchain=toolchain, jobs=args.jobs, force=args.force)
    except BuildFailed as e:
        raise CliError(str(e)) from None
    return 0


def _diff_parts(old: dict, new: dict, prefix="") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff_parts(a, b, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}: {json.dumps(a)} -> {json.dumps(b)}")
    return out


def cmd_explain(args) -> int:
    toolchain = _default_toolchain(args)
    ctx = ArchContext.current(args.arch_list)
    specs = _specs(args, toolchain)
    est = resources.estimate_jobs(toolchain)
    print(f"arch list in force: [{arch_mod.format_arch_list(ctx.requested)}] ({ctx.source})")
    print(f"parallel jobs: {est.jobs}  ({est.reason}); nvcc threads per job: {est.nvcc_threads}")
    for spec in specs:
        p = rt_build.plan(spec, ctx)
        md, reason = jit.check(p)
        print(f"\n== {p.describe()}  ({spec.label}, uri {spec.uri})")
        print(f"spec key    {p.spec_key}")
        print(f"portable key {p.portable_key}  (finds precompiled modules; docs/release.md)")
        print(f"cache slot  {p.key_dir}")
        print(f"generated   {p.gen_dir}")
        print("key parts:")
        for line in json.dumps(p.key_parts, indent=2, sort_keys=True).splitlines():
            print(f"  {line}")
        if p.toolchain_problem:
            print(f"compile commands: none, the toolchain is unavailable: {p.toolchain_problem}")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rt_build.write_manifest(p, Path(tmp))
                print("compile commands:")
                for c in ninja.commands(Path(tmp)):
                    print(f"  {c}")
        if reason is None:
            print(f"status: up to date (action key {md.action_key[:16]}, built "
                  f"{time.ctime(md.built_at)} in {md.build_seconds:.1f}s); no build would happen")
            continue
        print(f"status: a build would happen now: {reason}")
        # Name what changed against the most recent other build of this module, if any.
        others = []
        for d in p.module_dir.glob("*/metadata.json") if p.module_dir.exists() else []:
            try:
                others.append(json.loads(d.read_text()))
            except ValueError:
                continue
        others = [o for o in others if o.get("spec_key") != p.spec_key]
        if others:
            last = max(others, key=lambda o: o.get("built_at", 0))
            print("  compared with the last build of this module "
                  f"({time.ctime(last.get('built_at', 0))}), the key changed in:")
            for line in _diff_parts(last.get("key_parts", {}), p.key_parts):
                print(f"    {line}")
    return 0


def cmd_inspect(args) -> int:
    specs = inspection.specs_named(args.label, args.toolchain)
    if not specs:
        try:
            specs = _specs(args, args.toolchain)
        except LabelError:
            raise CliError(f"{args.label!r} is not a URI, module name or label "
                           f"({inspection.near_names(args.label)}); known targets: "
                           f"{', '.join(load_graph().labels())}") from None
    ctx = ArchContext.current(args.arch_list)
    reports = [inspection.inspect_spec(s, ctx, full=args.full) for s in specs]
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        print("\n\n".join(inspection.format_text(r, full=args.full) for r in reports))
    return 0


def cmd_clean(args) -> int:
    ws = Workspace.current()
    if not args.label:
        for d in (ws.generated, ws.artifacts):
            if d.exists():
                shutil.rmtree(d)
        print(f"removed {ws.generated} and {ws.artifacts}")
        return 0
    graph = load_graph()
    removed = 0
    for t in graph.resolve(args.label):
        for spec in expand(t):
            gen = ws.generated / spec.uri
            if gen.exists():
                shutil.rmtree(gen)
                removed += 1
            for tc in t.toolchains:
                mod_dir = ws.module_dir(spec.module_name(tc))
                if mod_dir.exists():
                    with ModuleLock(mod_dir / ".lock", spec.module_name(tc)):
                        for child in mod_dir.iterdir():
                            if child.is_dir():
                                shutil.rmtree(child)
                    removed += 1
    print(f"removed {removed} generated/artifact director{'y' if removed == 1 else 'ies'} "
          f"of {args.label}")
    return 0


def _size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def cmd_where(args) -> int:
    ws = Workspace.current()
    print(f"workspace base  {ws.base}  (KILN_WORKSPACE_BASE)")
    for title, d in (("generated", ws.generated), ("artifacts", ws.artifacts),
                     ("downloads", ws.downloads)):
        n, size = _size(d)
        mods = sorted(p.name for p in d.iterdir()) if d.exists() else []
        print(f"{title:<15} {d}  ({len(mods)} entries, {n} files, {size / 1e6:.1f} MB)")
        if args.verbose:
            for m in mods:
                print(f"  {m}")
    from kiln.runtime import sources

    print(f"sources         {sources.source_root()}  (read-only)")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p, label_required=True):
        p.add_argument("label", nargs=None if label_required else "?",
                       help="a label or pattern: //ops:norm, //ops/..., norm")
        p.add_argument("--set", action="append", metavar="AXIS=VALUE",
                       help="restrict a dispatch axis (repeatable; comma-separated values)")
        p.add_argument("--toolchain", choices=("cuda", "host"))

    p = sub.add_parser("query", help="targets, toolchains, arch families, axes, specialisations")
    p.add_argument("label", nargs="?", default="//ops/...")
    p.add_argument("--specs", action="store_true", help="list every specialisation URI")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("gen", help="render sources only; print where")
    common(p)
    p.set_defaults(func=cmd_gen)

    for name, func, help_ in (("build", cmd_build, "compile into the JIT cache"),
                              ("explain", cmd_explain, "commands, key parts, would it build now")):
        p = sub.add_parser(name, help=help_)
        common(p)
        p.add_argument("--arch-list", help="CUDA archs, e.g. '8.0 9.0a' (cross-compiles)")
        if name == "build":
            p.add_argument("-j", "--jobs", type=int, default=0, help="parallel compile jobs")
            p.add_argument("--force", action="store_true", help="rebuild even when cached")
        p.set_defaults(func=func)

    p = sub.add_parser("inspect", help="generated sources, build manifest, compiled module and cache "
                                       "metadata of a module, together")
    common(p)
    p.add_argument("--arch-list", help="CUDA archs for the current plan, e.g. '9.0a'")
    p.add_argument("--full", action="store_true", help="also the copied units and every header read")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("clean", help="remove generated sources and artifacts (of a label)")
    p.add_argument("label", nargs="?")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("where", help="the workspaces and what they hold")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_where)
    return ap


def run_command(prog: str, ap: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse and run a subcommand: exit 0 on success, 130 when interrupted, else 1 with the error
    on stderr ending in one line that says why. Shared by the codegen and release CLIs."""
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure ends in one line that says why
        msg = str(e).strip()
        if "\n" in msg:
            print(msg, file=sys.stderr)
            msg = msg.splitlines()[0]
        print(f"{prog} {args.command}: error: {msg}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    return run_command("codegen", parser(), argv)
