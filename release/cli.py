"""`python -m release build|verify|pin`: precompiled packages from the command line.

Exit status 0 on success; otherwise non-zero, and the last line on stderr says why in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.codegen.batch import build_all
from kiln.codegen.cli import jobs_arg, run_command
from kiln.codegen.dispatch import released
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import compile_spec
from kiln.runtime import env, jit, sources
from kiln.runtime.arch import ArchContext, ArchError, format_arch_list, parse_arch_list
from kiln.runtime.artifacts import ReleaseId, tag_for
from kiln.runtime.build import plan
from kiln.runtime.manifest import MANIFEST, Manifest, digest

from . import package, verify, wheel

PINS = Path(__file__).resolve().parent / "pins.json"


class CliError(Exception):
    pass



def _specs(label: str, toolchain: str, ctx: ArchContext) -> list:
    graph = load_graph()
    out = []
    for t in graph.resolve(label):
        if toolchain not in t.toolchains:
            print(f"  skipped {t.label}: it has no {toolchain} implementation")
            continue
        shipped = released(t)
        if not shipped:
            print(f"  skipped {t.label}: it registers no specialisation for release (release= in "
                  f"{t.build_file.relative_to(graph.root)})")
            continue
        for s in shipped:
            spec = compile_spec(s, toolchain, graph)
            if toolchain in ("cuda", "triton"):
                try:
                    ctx.restrict(spec.arch_families, spec.what)
                except ArchError as e:
                    print(f"  skipped {spec.name}: {e}")
                    continue
            out.append(spec)
    if not out:
        raise CliError(f"{label} has nothing to release for {toolchain}")
    return out


def cmd_build(args) -> int:
    changed = {k: v for k, v in env.build_affecting().items() if v != env.get_default(env.KNOBS[k])}
    if changed:
        raise CliError(f"a release is built with the default build settings; unset "
                       f"{', '.join(changed)}")
    arch_list = ""
    if args.toolchain in ("cuda", "triton"):
        arch_list = format_arch_list(parse_arch_list(
            args.arch_list or load_graph().workspace["RELEASE_ARCH_LIST"]))
    # Exactly the release's arch list: never KILN_CUDA_ARCH_LIST or the local devices.
    ctx = ArchContext(parse_arch_list(arch_list), f"release arch list {arch_list!r}")
    specs = _specs(args.label, args.toolchain, ctx)
    what = args.toolchain + (f" for [{arch_list}]" if arch_list else "")
    print(f"building {len(specs)} module(s) of {args.label} with {what}; ", end="", flush=True)
    build_all(specs, ctx, toolchain=args.toolchain, jobs=args.jobs, force=args.force)
    built = []
    for spec in specs:
        p = plan(spec, ctx)
        md, reason = jit.check(p)
        if reason is not None:
            raise CliError(f"{spec.name} is not usable after its build: {reason}")
        built.append((p, md))
    out = Path(args.out)
    rid = ReleaseId(sources.kiln_version(), tag_for(args.toolchain, ctx.requested),
                    sources.python_abi())
    artifact_dir = rid.dir_in(out / "artifacts")
    m, manifest_digest = package.stage(built, artifact_dir, args.toolchain, arch_list)
    size = sum(e.size for e in m.modules)
    print(f"staged {len(m.modules)} module(s) ({size / 1e6:.1f} MB) in {artifact_dir}")
    print(f"  manifest {rid.path}/{MANIFEST} sha256 {manifest_digest}")
    whl = wheel.write_wheel(artifact_dir, m, out)
    print(f"wheel {whl}")
    print(f"publish: copy {out / 'artifacts'}/ to the repository root; pin: python -m release pin "
          f"{out / 'artifacts'}")
    return 0


def cmd_verify(args) -> int:
    path = Path(args.path)
    if path.is_file():
        m, problems = verify.verify_wheel(path, sass=args.sass)
    else:
        m, problems = verify.verify_directory(path, sass=args.sass)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    if problems:
        raise CliError(f"{path}: {len(problems)} problem(s)")
    archs = f" [{m.arch_list}]" if m.arch_list else ""
    print(f"{path}: kiln {m.kiln_version} {m.toolchain}{archs} {m.python_abi}: {len(m.modules)} "
          f"module(s) verified" + (" (SASS included)" if args.sass else ""))
    return 0


def cmd_pin(args) -> int:
    root = Path(args.artifacts)
    found = sorted(root.glob(f"*/*/*/{MANIFEST}"))
    if not found:
        raise CliError(f"no <version>/<tag>/<abi>/{MANIFEST} below {root}")
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
    for path in found:
        data = path.read_bytes()
        rid = ReleaseId.of(Manifest.from_bytes(data, str(path)))
        if path.parent != rid.dir_in(root):
            raise CliError(f"{path} describes {rid.path}; it is in the wrong directory")
        pins[rid.path] = digest(data)
        print(f"pinned {rid.path} {pins[rid.path]}")
    PINS.write_text(json.dumps(dict(sorted(pins.items())), indent=1) + "\n")
    print(f"wrote {PINS}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m release", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build the registered specialisations and package them")
    p.add_argument("label", nargs="?", default="//ops/...", help="targets: //ops:norm, //ops/...")
    p.add_argument("--arch-list", help="CUDA archs, e.g. '8.0 9.0a' (default: WORKSPACE.py's "
                                       "RELEASE_ARCH_LIST)")
    p.add_argument("--toolchain", choices=("cuda", "host", "triton"), default="cuda")
    p.add_argument("--out", default="dist", help="where the wheel and artifacts/ go (dist)")
    p.add_argument("-j", "--jobs", type=jobs_arg, default=0,
                   help="parallel compile jobs (0: the estimate from cores and free memory)")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("verify", help="check a wheel or an artifact directory")
    p.add_argument("path")
    p.add_argument("--sass", action="store_true", help="also check each module's SASS per arch")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("pin", help="record the manifest digests of an artifacts/ tree in "
                                   "release/pins.json")
    p.add_argument("artifacts")
    p.set_defaults(func=cmd_pin)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_command("release", parser(), argv)
