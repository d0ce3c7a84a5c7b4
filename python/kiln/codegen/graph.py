"""The build graph: WORKSPACE.py, the BUILD.py files under its roots, and label resolution.

Labels:
    //ops/attention:decode   the target `decode` of ops/attention/BUILD.py
    //ops:norm               the target named after its package (ops/norm/BUILD.py's `norm`); a
                             group such as //ops:attention names its member targets
    //ops/norm:norm          the same, in full; //ops/norm for short
    //ops/...                every target under ops/ (also //ops:all)
    //ops/attention/...      every target whose BUILD file is under ops/attention/
    norm, decode             shorthand for the one target (or group) of that name
An unknown label is an error that lists the nearest known labels.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from kiln.runtime import sources
from kiln.runtime.record import Record

from .entries import BUILD_FUNCTIONS, EntryError
from .rules import (
    BuildFileError,
    Group,
    SourceLibrary,
    Target,
    make_group,
    make_library,
    make_target,
    no_release,
    triton_kernel,
    unsupported,
    with_deps,
)


class LabelError(LookupError):
    pass


class Graph(Record):
    """The loaded build graph: the source root holding WORKSPACE.py, its names, the targets, the
    groups and the source libraries (source_library(...): units targets take by deps)."""

    __slots__ = ("root", "workspace", "targets", "groups", "libraries")

    def __init__(self, root: Path, workspace: dict, targets: tuple[Target, ...],
                 groups: tuple[Group, ...] = (), libraries: tuple[SourceLibrary, ...] = ()):
        self._init(root, workspace, targets, groups, libraries)

    def labels(self) -> list[str]:
        return [t.label for t in self.targets]

    def target(self, label: str) -> Target:
        found = self.resolve(label)
        if len(found) != 1:
            raise LabelError(f"{label!r} names {len(found)} targets "
                             f"({', '.join(t.label for t in found)}); name exactly one")
        return found[0]

    def resolve(self, pattern: str) -> list[Target]:
        """The targets a label or pattern names, in declaration order (a group: its members)."""
        pat = pattern.strip()
        if not pat.startswith("//"):
            named = [x for x in (*self.targets, *self.groups) if x.name == pat]
            if len(named) == 1:
                return self._expand(named[0])
            if not named:
                raise self._unknown(pat)
            raise LabelError(f"{pat!r} is ambiguous: {', '.join(x.label for x in named)}")
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
        pkg = pkg.strip("/")
        every = (*self.targets, *self.groups)
        for x in every:
            if x.name == name and (x.package == pkg or x.label == pat):
                return self._expand(x)
        # //ops:decode: the one target of that name anywhere below the BUILD root `ops`.
        below = [x for x in every if x.name == name and x.root == pkg]
        if len(below) == 1:
            return self._expand(below[0])
        if below:
            raise LabelError(f"{pat!r} is ambiguous: {', '.join(x.full_label for x in below)}")
        raise self._unknown(pat)

    def _expand(self, x: Target | Group) -> list[Target]:
        if isinstance(x, Target):
            return [x]
        out: list[Target] = []
        for member in x.member_labels():
            for t in self.resolve(member):
                if t not in out:
                    out.append(t)
        return out

    def group_of(self, target: Target) -> list[Group]:
        return [g for g in self.groups if target in self._expand(g)]

    def _unknown(self, pat: str) -> LabelError:
        known = self.labels() + [g.label for g in self.groups]
        name = pat.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
        every = (*self.targets, *self.groups)
        near = difflib.get_close_matches(name, [x.name for x in every], n=3, cutoff=0.6)
        labels = [x.label for n in near for x in every if x.name == n]
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
    groups: list[Group] = []
    libraries: list[SourceLibrary] = []
    for build_root in ws.get("BUILD_ROOTS", ()):
        for build_file in sorted((root / build_root).rglob("BUILD.py")):
            package = build_file.parent.relative_to(root).as_posix()
            where = (build_file, build_root, package)

            def op_library(_where=where, **kwargs):
                targets.append(make_target(*_where, **kwargs))

            def op_group(_where=where, **kwargs):
                groups.append(make_group(*_where, **kwargs))

            def source_library(_where=where, **kwargs):
                libraries.append(make_library(*_where, **kwargs))

            try:
                _exec_file(build_file, {"op_library": op_library, "op_group": op_group,
                                        "source_library": source_library,
                                        "unsupported": unsupported, "no_release": no_release,
                                        "triton_kernel": triton_kernel, **BUILD_FUNCTIONS,
                                        "__file__": str(build_file)})
            except EntryError as e:
                raise BuildFileError(f"{build_file}: {e}") from None
    seen: dict[str, Path] = {}
    for t in (*targets, *groups, *libraries):
        for label in {t.label, t.full_label}:
            if label in seen:
                raise BuildFileError(f"{label} is declared twice: in {seen[label]} and {t.build_file}")
            seen[label] = t.build_file
    by_label = {lib.label: lib for lib in libraries}
    targets = [with_deps(t, by_label) for t in targets]
    for t in targets:
        unknown = [a.rstrip("a") for a in t.archs if a.rstrip("a") not in ws["ARCH_FAMILIES"]]
        if unknown:
            raise BuildFileError(
                f"{t.build_file}: {t.label} names unknown arch families {unknown}; WORKSPACE.py "
                f"declares {sorted(ws['ARCH_FAMILIES'])}"
            )
    graph = Graph(root, ws, tuple(targets), tuple(groups), tuple(libraries))
    uris: dict[str, str] = {}
    for t in targets:
        if uris.setdefault(t.uri_prefix, t.label) != t.label:
            raise BuildFileError(f"{t.label} and {uris[t.uri_prefix]} would both name their modules "
                                 f"{t.uri_prefix}_...; rename one")
    for g in groups:
        for member in g.member_labels():
            try:
                graph.resolve(member)
            except LabelError as e:
                raise BuildFileError(f"{g.build_file}: op_group {g.label} names {member}: {e}") from None
    return graph
