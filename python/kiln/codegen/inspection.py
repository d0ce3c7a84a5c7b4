"""`kiln-build inspect <uri|module|label>`: what kiln generated, built and cached for a
module, shown together:

    spec       label, URI, module name, toolchain, parameters
    sources    the generated directory: rendered files in full, copied units by name and origin
    plan       the cache slot and spec key for the arch list in force (or why there is none)
    builds     every build of the module in the cache, the current one marked: whether it is usable
               now (and why not), the compiled library, its metadata (versions, keys, archs,
               toolchain, commands, headers read) and its build manifest (build.ninja)

It only reads: nothing is generated or built. `--json` gives the same as one list of objects.
"""

from __future__ import annotations

import difflib
import tempfile
import time
from pathlib import Path

from kiln.runtime import build as rt_build
from kiln.runtime import jit, metadata, sources
from kiln.runtime.arch import ArchContext
from kiln.runtime.spec import CompileSpec
from kiln.runtime.triton_module import TritonLoadError, TritonModule
from kiln.runtime.workspace import Workspace

from .dispatch import expand
from .graph import load_graph
from .specs import compile_spec


def specs_named(name: str, toolchain: str | None) -> list[CompileSpec]:
    """The specs whose URI or module name is `name` (both toolchains of a URI unless restricted)."""
    graph = load_graph()
    out = []
    for target in graph.targets:
        for spec in expand(target):
            for tc in target.toolchains:
                if name in (spec.uri, spec.module_name(tc)) and toolchain in (None, tc):
                    out.append(compile_spec(spec, tc, graph))
    return out


def near_names(name: str) -> str:
    """'did you mean ...' among every URI and module name, for an error message."""
    graph = load_graph()
    names = [n for t in graph.targets for s in expand(t)
             for n in (s.uri, *(s.module_name(tc) for tc in t.toolchains))]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(near)}?" if near else f"URIs look like {names[0]}" if names else ""


def _sources(spec: CompileSpec, ws: Workspace, full: bool) -> dict:
    gen = rt_build.generated_dir(spec, ws)
    units = {u.name for u in spec.units}
    root = sources.source_root()
    origins = {Path(p).name: Path(p) for p in spec.inputs}
    files = []
    for f in sorted(gen.iterdir()) if gen.is_dir() else []:
        item = {"name": f.name, "bytes": f.stat().st_size,
                # a unit without a source file is generated (a binding from entries): shown in full
                "kind": "copied" if f.name in units and f.name in origins else "rendered"}
        origin = origins.get(f.name)
        if item["kind"] == "copied" and origin is not None:
            item["from"] = str(origin.relative_to(root)) if origin.is_relative_to(root) else str(origin)
        if item["kind"] == "rendered" or full:
            item["text"] = f.read_text(errors="replace")
        files.append(item)
    return {"dir": str(gen), "exists": gen.is_dir(), "files": files}


def _library(key_dir: Path, md: metadata.Metadata) -> dict:
    lib = key_dir / md.library
    return {"path": str(lib), "exists": lib.is_file(),
            "bytes": lib.stat().st_size if lib.is_file() else None, "sha256": md.library_sha256}


def _triton(key_dir: Path, md: metadata.Metadata) -> dict:
    """A triton module's kernel sources (portable name: SHA-256), the Python files they import,
    the triton version, and each cubin's resources (kernel name, shared memory, warps, stages)."""
    out = {"version": md.toolchain.get("triton", {}).get("version"),
           "sources": md.key_parts.get("inputs", {}),
           "imports": {d.path: d.sha256 for d in md.deps}}
    try:
        out["cubins"] = TritonModule.from_slot(md.module, key_dir, md.library).resources()
    except (OSError, ValueError, KeyError, TritonLoadError) as e:
        out["cubins_error"] = str(e)
    return out


def _build(key_dir: Path, plan: rt_build.BuildPlan | None) -> dict:
    current = plan is not None and key_dir == plan.key_dir
    out: dict = {"key_dir": str(key_dir), "current": current}
    manifest = key_dir / "build" / "build.ninja"
    if manifest.is_file():
        out["manifest"] = {"path": str(manifest), "text": manifest.read_text(errors="replace")}
    try:
        md = metadata.read(key_dir)
    except metadata.CorruptMetadata as e:
        out["status"] = f"not usable: {e}"
        return out
    if md is None:
        out["status"] = "not usable: no metadata.json (an unfinished or interrupted build)"
        return out
    out["metadata"] = md.to_json()
    out["library"] = _library(key_dir, md)
    if metadata.is_triton(md):
        out["triton"] = _triton(key_dir, md)
    if current:
        reason = jit.check(plan)[1]
        out["status"] = "usable: the JIT loads this one" if reason is None else f"not usable: {reason}"
    else:
        reason = metadata.problem(md, key_dir, md.spec_key, sources.kiln_version(), sources.python_abi())
        if reason is not None:
            out["status"] = f"not usable: {reason}"
        elif plan is not None:
            out["status"] = ("intact, not current: built for another spec key (other sources, flags, "
                             "archs or toolchain)")
        else:
            out["status"] = "intact"
    return out


def inspect_spec(spec: CompileSpec, ctx: ArchContext, full: bool = False) -> dict:
    ws = Workspace.current()
    out: dict = {"module": spec.name, "uri": spec.uri, "label": spec.label,
                 "toolchain": spec.toolchain, "params": dict(spec.params),
                 "sources": _sources(spec, ws, full)}
    try:
        plan = rt_build.plan(spec, ctx, ws)
        out["plan"] = {"spec_key": plan.spec_key, "key_dir": str(plan.key_dir),
                       "archs": [str(a) for a in plan.archs]}
        if plan.toolchain_problem:  # the spec key names the compiler: nothing can be current
            out["plan"]["error"] = plan.toolchain_problem
            plan = None
    except Exception as e:  # no arch to build for, no nvcc: the cache can still be shown
        plan = None
        out["plan"] = {"error": str(e)}
    module_dir = ws.module_dir(spec.name)
    key_dirs = sorted(d for d in module_dir.iterdir() if d.is_dir()) if module_dir.is_dir() else []
    out["builds"] = [_build(d, plan) for d in key_dirs]
    if plan is not None and spec.toolchain != "triton" and not any(b["current"] for b in out["builds"]):
        with tempfile.TemporaryDirectory() as tmp:  # what a build would write; nothing is kept
            path = rt_build.write_manifest(plan, Path(tmp))
            out["plan"]["manifest_would_be"] = path.read_text()
    return out


def _indent(text: str, prefix: str = "    | ") -> list[str]:
    return [prefix + line for line in text.rstrip("\n").splitlines()]


def _size(n: int | None) -> str:
    return "missing" if n is None else f"{n} B" if n < 10_000 else f"{n / 1e6:.2f} MB"


def format_text(r: dict, full: bool = False) -> str:
    params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
    lines = [f"== {r['module']}  ({r['label']}, uri {r['uri']}, {r['toolchain']} toolchain"
             f"{', ' + params if params else ''})", ""]
    src = r["sources"]
    if not src["exists"]:
        lines.append(f"generated sources  none yet at {src['dir']} (a build, or 'python -m kiln.codegen "
                     "gen', renders them)")
    else:
        lines.append(f"generated sources  {src['dir']}")
        width = max((len(f["name"]) for f in src["files"]), default=0)
        for f in src["files"]:
            origin = f" from {f['from']}" if f.get("from") else ""
            lines.append(f"  {f['name']:<{width}}  ({f['kind']}{origin}, {_size(f['bytes'])})")
            if "text" in f:
                lines += _indent(f["text"])
    lines.append("")
    plan = r["plan"]
    if "error" in plan:
        lines.append(f"plan               none for the arch list in force: {plan['error']}")
    else:
        archs = f", archs {' '.join(plan['archs'])}" if plan["archs"] else ""
        lines.append(f"plan               spec key {plan['spec_key'][:24]}{archs}")
        lines.append(f"                   cache slot {plan['key_dir']}")
        if "manifest_would_be" in plan:
            lines.append("                   not built yet; the build manifest a build would write:")
            lines += _indent(plan["manifest_would_be"])
    if not r["builds"]:
        lines.append("\nbuilds             none in the cache")
    for b in r["builds"]:
        lines.append("")
        lines.append(f"build {Path(b['key_dir']).name}{'  (current)' if b['current'] else ''}")
        lines.append(f"  status           {b['status']}")
        md = b.get("metadata")
        if md:
            lib = b["library"]
            lines.append(f"  library          {lib['path']}  ({_size(lib['bytes'])}, sha256 "
                         f"{lib['sha256'][:16]})")
            lines.append(f"  metadata         {Path(b['key_dir']) / metadata.METADATA}")
            lines.append(f"    kiln {md['kiln_version']}, Python ABI {md['python_abi']}, built "
                         f"{time.ctime(md['built_at'])} in {md['build_seconds']:.1f}s")
            lines.append(f"    spec key {md['spec_key']}")
            lines.append(f"    action key {md['action_key']}")
            lines.append(f"    archs {' '.join(md['archs']) or '-'}; toolchain "
                         + "; ".join(f"{k} {v['path']} ({v['version']})"
                                     for k, v in md["toolchain"].items() if isinstance(v, dict)))
            lines.append(f"    build env {md['key_parts'].get('env')}")
            lines.append("    commands:")
            lines += [f"      {c}" for c in md["commands"]]
            deps = md["deps"]
            lines.append(f"    headers read by the compiler: {len(deps)}"
                         + ("" if full else " (--full lists them)"))
            if full:
                lines += [f"      {d[0]}" for d in deps]  # [path, size, mtime_ns, sha256]
        if "triton" in b:
            t = b["triton"]
            lines.append(f"  triton {t['version']}; kernel sources:")
            lines += [f"      {name}  sha256 {sha[:16]}" for name, sha in sorted(t["sources"].items())]
            if t["imports"]:
                lines.append("    imported by them:")
                lines += [f"      {path}  sha256 {sha[:16]}" for path, sha in sorted(t["imports"].items())]
            lines.append("  cubins:" if "cubins" in t else f"  cubins: not readable: {t['cubins_error']}")
            for c in t.get("cubins", []):
                lines.append(f"      {c['name']:<36} sm {c['arch']:<5} shared {c['shared_bytes']:>6} B  "
                             f"warps {c['num_warps']}  stages {c['num_stages']}  "
                             f"{_size(c['cubin_bytes'])}  sha256 {c['cubin_sha256'][:16]}")
        if "manifest" in b:
            lines.append(f"  build manifest   {b['manifest']['path']}")
            lines += _indent(b["manifest"]["text"])
    return "\n".join(lines)
