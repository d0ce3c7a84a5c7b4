"""The build graph: WORKSPACE.py, the BUILD.py files under its roots, and label resolution.

Labels:
    //ops:norm         the target `norm` declared in some BUILD.py under ops/
    //ops/norm:norm    the same, naming the directory of its BUILD file
    //ops/...          every target under ops/ (also //ops:all)
    //ops/norm/...     every target whose BUILD file is under ops/norm/
    norm               shorthand for the one target of that name
An unknown label is an error that lists the nearest known labels.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime import sources

from .rules import BuildFileError, Target, make_target, unsupported


class LabelError(LookupError):
    pass


@dataclass(frozen=True)
class Graph:
    root: Path  # the source root holding WORKSPACE.py
    workspace: dict
    targets: tuple[Target, ...]

    def labels(self) -> list[str]:
        return [t.label for t in self.targets]

    def target(self, label: str) -> Target:
        found = self.resolve(label)
        if len(found) != 1:
            raise LabelError(f"{label!r} names {len(found)} targets; name exactly one")
        return found[0]

    def resolve(self, pattern: str) -> list[Target]:
        """The targets a label or pattern names, in declaration order."""
        pat = pattern.strip()
        if not pat.startswith("//"):
            named = [t for t in self.targets if t.name == pat]
            if len(named) == 1:
                return named
            if not named:
                raise self._unknown(pat)
            raise LabelError(f"{pat!r} is ambiguous: {', '.join(t.label for t in named)}")
        body = pat[2:]
        if body.endswith("/...") or body.endswith(":all") or body == "...":
            prefix = body.rsplit("/...", 1)[0] if body.endswith("/...") else body.split(":")[0]
            prefix = "" if prefix == "..." else prefix
            base = (self.root / prefix).resolve()
            found = [t for t in self.targets if t.build_file.resolve().is_relative_to(base)]
            if not found:
                raise self._unknown(pat)
            return found
        pkg, sep, name = body.partition(":")
        if not sep:
            pkg, name = body, body.rsplit("/", 1)[-1]
        for t in self.targets:
            if t.name != name:
                continue
            if pkg == t.root or t.package_dir.resolve() == (self.root / pkg).resolve():
                return [t]
        raise self._unknown(pat)

    def _unknown(self, pat: str) -> LabelError:
        known = self.labels()
        name = pat.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
        near = difflib.get_close_matches(name, [t.name for t in self.targets], n=3, cutoff=0.6)
        labels = [t.label for n in near for t in self.targets if t.name == n]
        hint = f"; did you mean {' or '.join(labels)}?" if labels else ";"
        return LabelError(f"no target matches {pat!r}{hint} Known targets: {', '.join(known)}")


def _exec_file(path: Path, namespace: dict) -> dict:
    code = compile(path.read_text(), str(path), "exec")
    exec(code, namespace)  # noqa: S102 - BUILD and WORKSPACE files are kiln's own sources
    return namespace


def load_workspace(root: Path) -> dict:
    ns = _exec_file(root / "WORKSPACE.py", {"__file__": str(root / "WORKSPACE.py")})
    return {k: v for k, v in ns.items() if k.isupper()}


def load_graph(root: Path | None = None) -> Graph:
    """Load WORKSPACE.py and every BUILD.py under its BUILD_ROOTS (cached per source root)."""
    return _load_graph(Path(root or sources.source_root()).resolve())


@functools.lru_cache(maxsize=4)
def _load_graph(root: Path) -> Graph:
    ws = load_workspace(root)
    targets: list[Target] = []
    for build_root in ws.get("BUILD_ROOTS", ()):
        for build_file in sorted((root / build_root).rglob("BUILD.py")):
            declared: list[Target] = []

            def op_library(_bf=build_file, _root=build_root, _out=declared, **kwargs):
                _out.append(make_target(_bf, _root, **kwargs))

            _exec_file(build_file, {"op_library": op_library, "unsupported": unsupported,
                                    "__file__": str(build_file)})
            targets.extend(declared)
    seen: dict[str, Path] = {}
    for t in targets:
        if t.label in seen:
            raise BuildFileError(f"{t.label} is declared twice: in {seen[t.label]} and {t.build_file}")
        seen[t.label] = t.build_file
        unknown = [a.rstrip("a") for a in t.archs if a.rstrip("a") not in ws["ARCH_FAMILIES"]]
        if unknown:
            raise BuildFileError(
                f"{t.build_file}: {t.label} names unknown arch families {unknown}; WORKSPACE.py "
                f"declares {sorted(ws['ARCH_FAMILIES'])}"
            )
    return Graph(root, ws, tuple(targets))
