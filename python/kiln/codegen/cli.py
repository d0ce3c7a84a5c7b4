"""`python -m kiln.codegen query|gen|build|explain|inspect|clean|where` (also `kiln-build`, and
`python -m codegen` from the repository root): the build graph from the command line.

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
from kiln.runtime import jit, metadata, ninja, resources
from kiln.runtime.arch import ArchContext, ArchError
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


def _arch_notes(args, toolchain: str, ctx: ArchContext, specs: list[CompileSpec]) -> None:
    """Say what happens to the arch list: ignored by the host toolchain; archs a target does not
    support are dropped (named here), and a target that supports none of them is an error."""
    if toolchain == "host":
        if args.arch_list:
            print(f"note: --toolchain host ignores --arch-list {args.arch_list!r}: host modules "
                  "are compiled for this CPU", file=sys.stderr)
        return
    seen = set()
    for spec in specs:
        if spec.label in seen or spec.toolchain not in ("cuda", "triton"):
            continue
        seen.add(spec.label)
        try:
            ctx.restrict(spec.arch_families, spec.label or spec.name)
        except ArchError as e:
            raise CliError(str(e)) from None
        dropped = [a for a in ctx.requested if not arch_mod.supports(spec.arch_families, a)]
        if dropped:
            families = ", ".join(str(f) for f in spec.arch_families)
            print(f"note: {spec.label or spec.name} does not support "
                  f"{arch_mod.format_arch_list(dropped)} ({ctx.source}); it is built for the "
                  f"rest (its families: {families})", file=sys.stderr)


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
        if t.deps:
            print(f"  deps           {', '.join(t.deps)} (source libraries: their units are compiled in)")
        for k in t.triton_kernels:
            consts = ", ".join(f"{a}={v}" for a, v in k.constexprs)
            print(f"  triton kernel  {k.name or k.entry} ({t.package}/{k.unit}: {k.entry}; {consts}; "
                  f"{k.num_warps} warps, {k.num_stages} stages)")
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
    _arch_notes(args, toolchain, ctx, specs)
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
    _arch_notes(args, toolchain, ctx, specs)
    est = resources.estimate_jobs(toolchain)
    print(f"arch list in force: [{arch_mod.format_arch_list(ctx.requested)}] ({ctx.source})")
    print(f"parallel jobs: {est.jobs}  ({est.reason}); nvcc threads per job: {est.nvcc_threads}")
    for spec in specs:
        p = rt_build.plan(spec, ctx)
        md, reason = jit.check(p)
        print(f"\n== {p.describe()}  ({spec.label}, uri {spec.uri})")
        print(f"spec key    {p.spec_key}")
        print(f"portable key {p.portable_key}  (finds precompiled modules; docs/release.md)")
        if p.archs:
            print(f"archs       {arch_mod.format_arch_list(p.archs)} (the arch list in force, "
                  "restricted to the target's families)")
        print(f"cache slot  {p.key_dir}")
        print(f"generated   {p.gen_dir}")
        print("key parts:")
        for line in json.dumps(p.key_parts, indent=2, sort_keys=True).splitlines():
            print(f"  {line}")
        if p.toolchain_problem:
            print(f"compile commands: none, the toolchain is unavailable: {p.toolchain_problem}")
        elif p.spec.toolchain == "triton":
            print("compile commands:")
            for c in rt_build.triton_commands(p):
                print(f"  {c}")
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
                md_other = metadata.read(d.parent)  # strict: a damaged one is skipped
            except metadata.CorruptMetadata:
                continue
            if md_other is not None and md_other.spec_key != p.spec_key:
                others.append(md_other)
        if others:
            last = max(others, key=lambda o: o.built_at)
            print("  compared with the last build of this module "
                  f"({time.ctime(last.built_at)}), the key changed in:")
            for line in _diff_parts(last.key_parts, p.key_parts):
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


def _clean_module(mod_dir: Path) -> bool:
    """Remove a module's cache slots, quarantine and lock files, if no process holds its lock;
    False (and nothing removed) when one does."""
    lock = ModuleLock(mod_dir / ".lock", mod_dir.name)
    if not lock.try_acquire():
        return False
    for child in mod_dir.iterdir():
        if child.name in (lock.path.name, lock.owner_path.name):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    lock.remove()  # unlinks the lock file while holding it, then releases it
    try:
        mod_dir.rmdir()
    except OSError:
        pass  # another process created something meanwhile: it stays
    return True


def cmd_clean(args) -> int:
    """Remove generated sources and artifacts, with the lock files no process holds. A module
    whose lock is held (a build in progress) is left as it is, and named."""
    ws = Workspace.current()
    busy: list[str] = []
    if not args.label:
        mods = sorted(ws.artifacts.iterdir()) if ws.artifacts.is_dir() else []
        for mod_dir in mods:
            if mod_dir.is_dir() and not mod_dir.is_symlink() and not _clean_module(mod_dir):
                busy.append(mod_dir.name)
        if not busy and ws.generated.exists():
            shutil.rmtree(ws.generated)  # while nothing builds: a build reads its sources
        if ws.artifacts.is_dir() and not busy:
            shutil.rmtree(ws.artifacts)
        print(f"removed {ws.generated} and {ws.artifacts}" if not busy else
              f"removed the artifacts of {len(mods) - len(busy)} module(s); kept {ws.generated} "
              f"and {len(busy)} module(s) being built now (their lock is held): {', '.join(busy)}")
        return 0
    graph = load_graph()
    removed = 0
    for t in graph.resolve(args.label):
        for spec in expand(t):
            mods = [ws.module_dir(spec.module_name(tc)) for tc in t.toolchains]
            held = False
            for mod_dir in mods:
                if mod_dir.is_symlink():  # kiln never follows one: remove the link itself
                    mod_dir.unlink()
                    removed += 1
                elif mod_dir.is_dir():
                    if _clean_module(mod_dir):
                        removed += 1
                    else:
                        held = True
                        busy.append(mod_dir.name)
            gen = ws.generated / spec.uri
            if gen.exists() and not held:
                shutil.rmtree(gen)
                removed += 1
    print(f"removed {removed} generated/artifact director{'y' if removed == 1 else 'ies'} "
          f"of {args.label}" + (f"; kept {len(busy)} module(s) being built now (their lock is "
                                f"held): {', '.join(busy)}" if busy else ""))
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


def jobs_arg(text: str) -> int:
    """-j/--jobs: 0 (the estimate from cores and memory) or a positive number of jobs."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number of jobs, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"must be 0 (the estimate from cores and free memory) or a positive number of jobs, "
            f"got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kiln.codegen",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p, label_required=True):
        p.add_argument("label", nargs=None if label_required else "?",
                       help="a label or pattern: //ops:norm, //ops/..., norm")
        p.add_argument("--set", action="append", metavar="AXIS=VALUE",
                       help="restrict a dispatch axis (repeatable; comma-separated values)")
        p.add_argument("--toolchain", choices=("cuda", "host", "triton"))

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
        p.add_argument("--arch-list", help="CUDA archs, e.g. '8.0 9.0a' (cross-compiles); archs a "
                                           "target does not support are dropped, with a note")
        if name == "build":
            p.add_argument("-j", "--jobs", type=jobs_arg, default=0,
                           help="parallel compile jobs; 0 (the default): min(cores, free memory / "
                                "memory per job)")
            p.add_argument("--force", action="store_true",
                           help="rebuild every unit even when cached (from an empty build "
                                "directory)")
        p.set_defaults(func=func)

    p = sub.add_parser("inspect", help="generated sources, build manifest, compiled module and cache "
                                       "metadata of a module, together")
    common(p)
    p.add_argument("--arch-list", help="CUDA archs for the current plan, e.g. '9.0a'")
    p.add_argument("--full", action="store_true", help="also the copied units and every header read")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("clean", help="remove generated sources, artifacts and the lock files no "
                                     "process holds (of a label)")
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
