"""The committed benchmark definitions: benchmarks/definitions/<op>/<example>.json, one per
trace template x example, written from the templates and read back by the harness.

    python -m benchmarks definitions               # list them, and say whether any is stale
    python -m benchmarks definitions --regenerate  # rewrite them from the templates
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.trace import traced_apis
from kiln.trace.definition import definitions as template_definitions

DEFINITIONS_DIR = Path(__file__).resolve().parent / "definitions"


def dumps(obj: Any, indent: int = 0, width: int = 100) -> str:
    """JSON with containers kept on one line when they fit in `width`: diffs stay readable."""
    flat = json.dumps(obj)
    if not isinstance(obj, dict | list) or len(flat) + indent <= width:
        return flat
    pad = " " * (indent + 2)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 2, width)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dumps(v, indent + 2, width) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def generate() -> dict[str, str]:
    """Relative path -> file text for every definition of every traced API."""
    files = {}
    for traced in traced_apis().values():
        for d in template_definitions(traced):
            files[f"{d['name']}.json"] = dumps(d) + "\n"
    return files


def stale(root: Path = DEFINITIONS_DIR) -> list[str]:
    """What differs between the committed files and the templates: '<path>: why' lines."""
    want = generate()
    have = {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*.json")}
    problems = [f"{p}: missing" for p in sorted(set(want) - set(have))]
    problems += [f"{p}: no template example produces it" for p in sorted(set(have) - set(want))]
    problems += [f"{p}: differs from its template" for p in sorted(set(want) & set(have))
                 if want[p] != have[p]]
    return problems


def regenerate(root: Path = DEFINITIONS_DIR) -> list[str]:
    """Write every definition, remove files no template produces; returns the paths changed."""
    want = generate()
    changed = []
    for rel, text in want.items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    for path in sorted(root.rglob("*.json")):
        rel = path.relative_to(root).as_posix()
        if rel not in want:
            path.unlink()
            changed.append(f"{rel} (removed)")
    for d in sorted(root.glob("*"), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return changed


@dataclass(frozen=True)
class Definition:
    """One definition file, as the harness uses it."""

    name: str  # "<op>/<example>"
    op: str
    example: str
    consts: dict[str, int]
    scalars: dict[str, Any]
    dtypes: tuple[str, ...]
    workloads: tuple[dict[str, int], ...]
    small_workloads: tuple[dict[str, int], ...]
    model: str
    phase: str
    path: Path

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> Definition:
        return cls(
            name=data["name"],
            op=data["op"],
            example=data["name"].split("/", 1)[1],
            consts={n: a["value"] for n, a in data["axes"].items() if a["type"] == "const"},
            scalars={n: s["value"] for n, s in data["inputs"].items() if "value" in s},
            dtypes=tuple(data["dtypes"]),
            workloads=tuple(data["workloads"]),
            small_workloads=tuple(data["small_workloads"]),
            model=data["example"]["model"],
            phase=data["example"]["phase"],
            path=path,
        )


def load(op: str, root: Path = DEFINITIONS_DIR) -> list[Definition]:
    """The committed definitions of `op`, in its template's example order."""
    order = {ex.name: i for i, ex in enumerate(traced_apis()[op].template.examples)} \
        if op in traced_apis() else {}
    paths = sorted((root / op).glob("*.json"), key=lambda p: (order.get(p.stem, len(order)), p.stem))
    if not paths:
        raise FileNotFoundError(
            f"no benchmark definitions for {op!r} under {root}; run "
            "`python -m benchmarks definitions --regenerate` and commit the result")
    return [Definition.from_json(json.loads(p.read_text()), p) for p in paths]


def names(defs: Iterable[Definition]) -> list[str]:
    return [d.example for d in defs]
