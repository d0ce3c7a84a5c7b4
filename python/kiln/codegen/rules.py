"""Rule functions available in BUILD.py files, and the Target they declare.

    op_library(
        name="norm",
        srcs=["norm_cuda.cu"],            # CUDA toolchain compile units, beside the BUILD file
        host_srcs=["norm_host.cc"],       # host toolchain compile units
        binding="bindings/norm.cc",       # the pybind11 launcher (path from the source root)
        dispatch={"dtype": ["f32", "f16", "bf16"]},   # compile-time matrix, one module per point
        exclude=[unsupported({"dtype": "f32"}, "why")],  # combinations refused with a reason
        archs=["sm80", "sm90", "sm100", "sm120"],        # WORKSPACE families; "sm90a" = needs 9.0a
        templates=["decode_config.h.jinja"],             # Jinja files rendered per specialisation
        cflags=[], cuda_flags=[], ldflags=[],
        release="all",                    # which specialisations ship precompiled (R3.12):
                                          # "all", {"dtype": ["bf16"]} (a selection), or omitted
        doc="one line: what the target provides",
    )
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VALUE = re.compile(r"^[a-z0-9]+$")


class BuildFileError(ValueError):
    """A BUILD file declares something invalid; the message names the file and the target."""


@dataclass(frozen=True)
class Unsupported:
    match: tuple[tuple[str, str], ...]  # axis -> value; a specialisation matching all is refused
    reason: str

    def matches(self, params: dict[str, str]) -> bool:
        return all(params.get(a) == v for a, v in self.match)


def unsupported(match: dict, reason: str) -> Unsupported:
    if not match or not reason:
        raise BuildFileError("unsupported() needs a non-empty match and a reason")
    return Unsupported(tuple((str(a), _value(v)) for a, v in match.items()), reason)


@dataclass(frozen=True)
class Target:
    name: str
    root: str  # the BUILD root it belongs to ("ops"): its label is //<root>:<name>
    build_file: Path
    srcs: tuple[str, ...]
    host_srcs: tuple[str, ...]
    binding: str
    dispatch: tuple[tuple[str, tuple[str, ...]], ...]
    exclude: tuple[Unsupported, ...]
    archs: tuple[str, ...]
    templates: tuple[str, ...]
    cflags: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    ldflags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    doc: str = ""
    toolchains: tuple[str, ...] = field(default=())
    # The specialisations precompiled packages ship (R3.12): None = none, () = all, otherwise the
    # selection per axis (axes not named: every value).
    release: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @property
    def label(self) -> str:
        return f"//{self.root}:{self.name}"

    @property
    def package_dir(self) -> Path:
        return self.build_file.parent

    @property
    def axes(self) -> dict[str, tuple[str, ...]]:
        return dict(self.dispatch)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v).lower()


def _release(where: str, release, axes: dict[str, tuple[str, ...]]):
    """Validate `release=`: None, "all", or {axis: [values]} naming only the target's axes."""
    if release is None:
        return None
    if release == "all":
        return ()
    if not isinstance(release, dict) or not release:
        raise BuildFileError(f'{where}: release= takes "all" or {{axis: [values]}}, got {release!r}')
    out = []
    for axis, values in release.items():
        vals = tuple(_value(v) for v in (values if isinstance(values, (list, tuple)) else [values]))
        if axis not in axes:
            raise BuildFileError(f"{where}: release= names axis {axis!r}; the dispatch axes are "
                                 f"{', '.join(axes) or '(none)'}")
        bad = [v for v in vals if v not in axes[axis]]
        if bad or not vals:
            raise BuildFileError(f"{where}: release= names {axis}={','.join(bad) or '(nothing)'}; "
                                 f"{axis} takes {', '.join(axes[axis])}")
        out.append((axis, vals))
    return tuple(out)


def make_target(build_file: Path, root: str, *, name: str, binding: str, srcs=(), host_srcs=(),
                dispatch=None, exclude=(), archs=(), templates=(), cflags=(), cuda_flags=(),
                ldflags=(), include_dirs=(), release=None, doc: str = "") -> Target:
    where = f"{build_file}: op_library(name={name!r})"
    if not _NAME.match(name):
        raise BuildFileError(f"{where}: name must match {_NAME.pattern}")
    axes = []
    for axis, values in (dispatch or {}).items():
        if not _NAME.match(axis) or "__" in axis:
            raise BuildFileError(f"{where}: dispatch axis {axis!r} must match {_NAME.pattern}")
        vals = tuple(_value(v) for v in values)
        bad = [v for v in vals if not _VALUE.match(v)]
        if bad or not vals or len(set(vals)) != len(vals):
            raise BuildFileError(
                f"{where}: axis {axis!r} needs distinct values matching {_VALUE.pattern}, got "
                f"{list(values)}"
            )
        axes.append((axis, vals))
    toolchains = tuple(t for t, units in (("cuda", srcs), ("host", host_srcs)) if units)
    if not toolchains:
        raise BuildFileError(f"{where}: needs srcs (CUDA) or host_srcs (CPU backend), or both")
    if srcs and not archs:
        raise BuildFileError(f"{where}: a target with CUDA srcs must declare archs=[families]")
    for ex in exclude:
        if not isinstance(ex, Unsupported):
            raise BuildFileError(f"{where}: exclude= takes unsupported(...) entries")
        known = dict(axes)
        for a, v in ex.match:
            if a not in known or v not in known[a]:
                raise BuildFileError(f"{where}: unsupported() names {a}={v}, not in the dispatch")
    return Target(
        release=_release(where, release, dict(axes)),
        name=name, root=root, build_file=build_file, srcs=tuple(srcs), host_srcs=tuple(host_srcs),
        binding=binding, dispatch=tuple(axes), exclude=tuple(exclude), archs=tuple(archs),
        templates=tuple(templates), cflags=tuple(cflags), cuda_flags=tuple(cuda_flags),
        ldflags=tuple(ldflags), include_dirs=tuple(include_dirs), doc=doc, toolchains=toolchains,
    )
