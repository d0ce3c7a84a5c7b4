"""`python -m kiln env [--json]`: what a bug report needs to say about this machine.

kiln, Python, torch and their CUDA; the driver, nvcc and the host compiler; the GPUs and their
archs; the arch list in force and where it comes from; the workspaces and what the cache holds;
the API-logging settings; and every KILN_* / MAX_JOBS / declared variable that is set, marked when
it differs from its default (those are the controls to name beside a result), unknown (a typo?) or
invalid. Every probe is independent: one that fails is reported, never fatal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from kiln.runtime import arch, env, sources, toolchain
from kiln.runtime.workspace import Workspace

from .settings import LEVELS, Settings

# Not kiln's, but they change what a CUDA run does; a report names them when set.
RELATED = ("CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "TORCH_CUDA_ARCH_LIST")


def _probe(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # a broken probe is part of the report, not the end of it
        return {"error": f"{type(e).__name__}: {e}"}


def _tree(path: Path) -> dict:
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    entries = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    return {"path": str(path), "entries": len(entries), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


def _torch() -> dict:
    import torch

    out = {"version": torch.__version__, "cuda_runtime": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "devices": []}
    for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
        major, minor = torch.cuda.get_device_capability(i)
        out["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                               "arch": f"{major}.{minor}"})
    return out


def _arch_list() -> dict:
    bad = env.snapshot().errors.get("KILN_CUDA_ARCH_LIST")
    if bad is not None:
        raise bad.__cause__ or bad  # the arch list's own error (ArchError), not the table's
    ctx = arch.ArchContext.current()
    return {"archs": [str(a) for a in ctx.requested], "source": ctx.source}


def _diagnostics() -> dict:
    s = Settings.from_env(env.snapshot())  # the report is made whatever else is malformed
    return {"level": s.level, "level_name": LEVELS.get(s.level) or f"as level {s.level - 1}", "dest": s.dest,
            "dump": s.dump, "dump_dir": s.dump_dir, "dump_max_count": s.dump_max_count,
            "dump_max_bytes": s.dump_max_bytes, "include": list(s.include),
            "exclude": list(s.exclude), "force_backend": s.force_backend or None}


def variables() -> list[dict]:
    """Every KILN_* variable set, every declared knob set, and the related CUDA ones."""
    names = sorted({k for k in os.environ if k.startswith("KILN_")}
                   | {k for k in env.KNOBS if k in os.environ}
                   | {k for k in RELATED if k in os.environ})
    out = []
    snap = env.snapshot()
    for name in names:
        row = {"name": name, "value": os.environ[name]}
        knob = env.KNOBS.get(name)
        if knob is None:
            row["status"] = ("related" if name in RELATED else
                             "script" if name in env.SCRIPT_VARIABLES else "unknown")
        else:
            row["default"] = env.get_default(knob)
            try:
                value = snap.value(name)
                row["status"] = "non-default" if value != env.get_default(knob) else "default"
            except env.EnvError as e:
                row["status"], row["error"] = "invalid", str(e)
        out.append(row)
    return out


def collect() -> dict:
    ws = Workspace(Path(env.snapshot().value("KILN_WORKSPACE_BASE")).absolute())
    return {
        "kiln": {"version": sources.kiln_version(), "package": str(Path(__file__).resolve().parents[1]),
                 "sources": str(_probe(sources.source_root))},
        "python": {"version": sys.version.split()[0], "executable": sys.executable,
                   "abi": sources.python_abi()},
        "torch": _probe(_torch),
        "cuda_driver": _probe(arch.driver_version),
        "nvcc": _probe(lambda: toolchain.nvcc().identity()),
        "host_compiler": _probe(lambda: toolchain.host_compiler().identity()),
        "triton": _probe(lambda: toolchain.triton().identity()),
        "gpus": _probe(lambda: [{"index": d.index, "name": d.name, "arch": str(d.arch)}
                                for d in arch.detect_devices()]),
        "arch_list": _probe(_arch_list),
        "workspace": {"base": str(ws.base), "generated": _probe(lambda: _tree(ws.generated)),
                      "artifacts": _probe(lambda: _tree(ws.artifacts))},
        "api_logging": _probe(_diagnostics),
        "variables": variables(),
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _line(label: str, value: object, render: Callable[[dict], str] = str) -> str:
    if isinstance(value, dict) and "error" in value and len(value) == 1:
        text = f"unavailable: {value['error']}"
    else:
        text = render(value)
    return f"{label:<20} {text}"


def format_text(r: dict) -> str:
    t = r["torch"]
    lines = [
        _line("kiln", r["kiln"], lambda k: f"{k['version']}  {k['package']} (sources {k['sources']})"),
        _line("Python", r["python"], lambda p: f"{p['version']}  {p['executable']} ({p['abi']})"),
        _line("torch", t, lambda t: f"{t['version']}, CUDA runtime {t['cuda_runtime'] or 'none (CPU build)'}"
              f", CUDA available: {'yes' if t['cuda_available'] else 'no'}"),
        _line("CUDA driver", r["cuda_driver"], lambda d: d or "none (no libcuda.so.1)"),
        _line("nvcc", r["nvcc"], lambda n: f"{n['path']}: {n['version']} (kiln's CUDA modules link "
              "this toolkit's runtime statically)"),
        _line("host compiler", r["host_compiler"], lambda c: f"{c['path']}: {c['version']}"),
        _line("triton", r["triton"], lambda t: f"{t['version']}  {t['path']} (compiles the triton "
              "toolchain's modules; not needed to load them)"),
        _line("GPUs", r["gpus"], lambda g: "; ".join(f"{d['index']}: {d['name']} (arch {d['arch']})"
                                                    for d in g) or "none detected"),
        _line("arch list in force", r["arch_list"],
              lambda a: f"[{' '.join(a['archs'])}] ({a['source']})"),
        _line("workspace", r["workspace"]["base"], lambda b: f"{b} (KILN_WORKSPACE_BASE)"),
    ]
    for part, unit in (("generated", "specialisations"), ("artifacts", "modules")):
        lines.append(_line(f"  {part}", r["workspace"][part],
                           lambda w, unit=unit: f"{w['path']}: {w['entries']} {unit}, "
                                                f"{w['files']} files, {_mb(w['bytes'])}"))

    def logging_line(d: dict) -> str:
        dumps = (f"dumps to {d['dump_dir']} (at most {d['dump_max_count']} calls, "
                 f"{d['dump_max_bytes']} bytes)" if d["dump"] else "dumps off")
        forced = f"; FORCED BACKEND {d['force_backend']}" if d["force_backend"] else ""
        return f"level {d['level']} ({d['level_name']}) to {d['dest']}; {dumps}{forced}"

    lines.append(_line("API logging", r["api_logging"], logging_line))
    lines.append("")
    lines.append("variables set (* not the default: name it beside any result it produced; "
                 "? not a kiln variable; ! invalid)")
    marks = {"non-default": "*", "default": " ", "unknown": "?", "invalid": "!", "related": " ",
             "script": " "}
    width = max((len(v["name"]) + len(v["value"]) + 1 for v in r["variables"]), default=0)
    for v in r["variables"]:
        note = {"non-default": f"default {v.get('default')!r}", "default": "the default",
                "unknown": "not a kiln variable: a typo?", "invalid": v.get("error", ""),
                "related": "CUDA/torch", "script": "read by kiln's scripts"}[v["status"]]
        setting = f"{v['name']}={v['value']}"
        lines.append(f"  {marks[v['status']]} {setting:<{width}}  ({note})")
    if not r["variables"]:
        lines.append("  none")
    return "\n".join(lines)
