"""Rule functions available in BUILD.py files, and the targets they declare.

    op_library(                           # one op (or a few that share kernels and a binding)
        name="norm",
        srcs=["norm_cuda.cu"],            # CUDA toolchain compile units, beside the BUILD file
        host_srcs=["norm_host.cc"],       # host toolchain compile units
        binding="bindings/norm.cc",       # the pybind11 launcher (path from the source root), or
        entries=[entry(...)],             # ... the entry points it is generated from (entries.py)
        headers=["ops/norm/norm.h"],      # what the generated launcher includes (with entries=)
        dispatch={"dtype": ["f32", "f16", "bf16"]},   # compile-time matrix, one module per point
        exclude=[unsupported({"dtype": "f32"}, "why")],  # combinations refused with a reason
        archs=["sm80", "sm90", "sm100", "sm120"],        # WORKSPACE families; "sm90a" = needs 9.0a
        templates=["decode_config.h.jinja"],             # Jinja files rendered per specialisation
        triton_srcs=["grouped_triton.py"],  # triton toolchain: Python files of @triton.jit kernels
        triton_kernels=[triton_kernel(      # ... and the entry points compiled from them
            "grouped_mm_kernel", unit="grouped_triton.py",
            signature={"a": "*{dtype}", "m": "i32", "BLOCK_M": "constexpr"},  # {axis}: its
            constexprs={"BLOCK_M": 64}, num_warps=4, num_stages=3)],  # triton spelling (WORKSPACE)
        cflags=[], cuda_flags=[], ldflags=[],
        deps=[":shared"],                 # source_library units compiled into every module
        release="all",                    # which specialisations ship precompiled: "all",
                                          # {"dtype": ["bf16"]} (a selection), or
                                          # no_release("why none ships")
        doc="one line: what the target provides",
    )
    op_group(name="attention", targets=[":decode", ":prefill"], doc="...")   # builds its members
    source_library(name="shared", srcs=["gemm_device.cu"], host_srcs=["gemm_tactics.cc"],
                   doc="...")         # units several targets compile; a target names it in deps=

A source library compiles nothing by itself: a target that names it in `deps` (":shared" in the
same package, "//ops/gemm:shared" from another) gets its CUDA and host units after its own, in
the library's order, once each; the library is the one place those units are listed.

A target's label is //<package>:<name>, its package the BUILD file's directory below the source
root (//ops/attention:decode); a target named after its package is also //<root>:<name>, the
form shown (//ops:norm, //ops:attention). Its URI (and so its modules' names) starts with the
name, prefixed by the package's name when they differ (attention_decode_dtype_bf16_...).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from kiln.runtime.record import Record

from .entries import Entry

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VALUE = re.compile(r"^[a-z0-9]+$")


class BuildFileError(ValueError):
    """A BUILD file declares something invalid; the message names the file and the target."""


class Unsupported(Record):
    """`unsupported(match, reason)`: `match` (axis -> value pairs) names specialisations that are
    refused, with the reason."""

    __slots__ = ("match", "reason")

    def __init__(self, match: tuple[tuple[str, str], ...], reason: str):
        self._init(match, reason)

    def matches(self, params: dict[str, str]) -> bool:
        return all(params.get(a) == v for a, v in self.match)


def unsupported(match: dict, reason: str) -> Unsupported:
    if not match or not reason:
        raise BuildFileError("unsupported() needs a non-empty match and a reason")
    return Unsupported(tuple((str(a), _value(v)) for a, v in match.items()), reason)


class TritonKernelDecl(Record):
    """`triton_kernel(...)` in a BUILD file: one entry point of the target's triton module.
    Strings in the signature and constexprs may name dispatch axes ("*{dtype}", "{block}"): each
    specialisation substitutes its values (codegen/specs.py)."""

    # name: the compiled kernel's name (default: entry); configs of one entry differ
    __slots__ = ("entry", "unit", "signature", "constexprs", "num_warps", "num_stages", "name")

    def __init__(self, entry: str, unit: str, signature: tuple[tuple[str, str], ...],
                 constexprs: tuple[tuple[str, object], ...], num_warps: int, num_stages: int,
                 name: str = ""):
        self._init(entry, unit, signature, constexprs, num_warps, num_stages, name)


def triton_kernel(entry: str, *, unit: str, signature: dict, constexprs: dict | None = None,
                  num_warps: int = 4, num_stages: int = 3, name: str = "") -> TritonKernelDecl:
    if not isinstance(entry, str) or not re.match(r"^[A-Za-z_]\w*$", entry):
        raise BuildFileError(f"triton_kernel({entry!r}): the entry point must be an identifier")
    if not isinstance(signature, dict) or not signature:
        raise BuildFileError(f"triton_kernel({entry!r}): signature= takes {{argument: type}}")
    if name and not re.match(r"^[A-Za-z_]\w*$", name):
        raise BuildFileError(f"triton_kernel({entry!r}, name={name!r}): the name must be an identifier")
    return TritonKernelDecl(entry, unit, tuple((str(a), str(t)) for a, t in signature.items()),
                            tuple((constexprs or {}).items()), int(num_warps), int(num_stages), name)


class NoRelease(Record):
    """`release=no_release("why")`: the target ships no precompiled module, deliberately."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self._init(reason)


def no_release(reason: str) -> NoRelease:
    if not isinstance(reason, str) or not reason.strip():
        raise BuildFileError("no_release() needs the reason no specialisation ships precompiled")
    return NoRelease(reason.strip())


def _short_label(root: str, package: str, name: str) -> str:
    """//ops:norm for the target named after its package ops/norm, else //ops/attention:decode."""
    if package.rsplit("/", 1)[-1] == name and package.count("/") == root.count("/") + 1:
        return f"//{root}:{name}"
    return f"//{package}:{name}"


@dataclass(frozen=True)
class Target:
    name: str
    root: str  # the BUILD root it belongs to ("ops")
    package: str  # the BUILD file's directory, relative to the source root ("ops/attention")
    build_file: Path
    srcs: tuple[str, ...]
    host_srcs: tuple[str, ...]
    binding: str  # "" when the binding is generated from `entries`
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
    triton_srcs: tuple[str, ...] = ()
    triton_kernels: tuple[TritonKernelDecl, ...] = ()
    deps: tuple[str, ...] = ()  # source_library labels as written; their units are in srcs
    # The specialisations precompiled packages ship: None = not declared, () = all, a NoRelease
    # = none on purpose, otherwise the selection per axis (axes not named: every value).
    release: tuple[tuple[str, tuple[str, ...]], ...] | NoRelease | None = None
    entries: tuple[Entry, ...] = ()  # the entry points the binding is generated from
    headers: tuple[str, ...] = ()  # the generated binding's includes (paths from the source root)

    @property
    def label(self) -> str:
        return _short_label(self.root, self.package, self.name)

    @property
    def full_label(self) -> str:
        return f"//{self.package}:{self.name}"

    @property
    def family(self) -> str:
        """The package's name ("attention"): the op family the target belongs to (a BUILD file
        directly in a BUILD root declares families of their own)."""
        return self.name if self.package == self.root else self.package.rsplit("/", 1)[-1]

    @property
    def uri_prefix(self) -> str:
        return self.name if self.name == self.family else f"{self.family}_{self.name}"

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
    """Validate `release=`: "all", {axis: [values]} naming only the target's axes, or
    no_release(reason); None when omitted (a test requires every kiln target to declare one)."""
    if release is None or isinstance(release, NoRelease):
        return release
    if release == "all":
        return ()
    if not isinstance(release, dict) or not release:
        raise BuildFileError(f'{where}: release= takes "all", {{axis: [values]}} or '
                             f'no_release("why"), got {release!r}')
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


def make_target(build_file: Path, root: str, package: str, *, name: str, binding: str = "", srcs=(),
                host_srcs=(), entries=(), headers=(),
                dispatch=None, exclude=(), archs=(), templates=(), cflags=(), cuda_flags=(),
                ldflags=(), include_dirs=(), release=None, doc: str = "", triton_srcs=(),
                triton_kernels=(), deps=()) -> Target:
    where = f"{build_file}: op_library(name={name!r})"
    if isinstance(deps, str) or not all(isinstance(d, str) and d for d in deps):
        raise BuildFileError(f"{where}: deps= takes a list of source_library labels (':shared')")
    if not _NAME.match(name):
        raise BuildFileError(f"{where}: name must match {_NAME.pattern}")
    if bool(binding) == bool(entries) and (srcs or host_srcs or deps):
        raise BuildFileError(f"{where}: needs binding= (a hand-written launcher) or entries= (the "
                             "entry points its launcher is generated from), not both")
    if not all(isinstance(e, Entry) for e in entries):
        raise BuildFileError(f"{where}: entries= takes entry(...) declarations")
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise BuildFileError(f"{where}: entry names repeat: {names}")
    if headers and not entries:
        raise BuildFileError(f"{where}: headers= are the generated launcher's; declare entries=")
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
    toolchains = tuple(t for t, units in (("cuda", srcs), ("host", host_srcs),
                                          ("triton", triton_srcs)) if units)
    if not toolchains and not deps:
        raise BuildFileError(f"{where}: needs srcs (CUDA) or host_srcs (CPU backend), or both")
    if (srcs or triton_srcs) and not archs:
        raise BuildFileError(f"{where}: a target with CUDA or triton srcs must declare "
                             "archs=[families]")
    if bool(triton_srcs) != bool(triton_kernels):
        raise BuildFileError(f"{where}: triton_srcs= and triton_kernels= go together")
    for k in triton_kernels:
        if not isinstance(k, TritonKernelDecl):
            raise BuildFileError(f"{where}: triton_kernels= takes triton_kernel(...) entries")
        if k.unit not in triton_srcs:
            raise BuildFileError(f"{where}: triton_kernel({k.entry!r}) names unit {k.unit!r}, "
                                 f"not one of triton_srcs {list(triton_srcs)}")
    for ex in exclude:
        if not isinstance(ex, Unsupported):
            raise BuildFileError(f"{where}: exclude= takes unsupported(...) entries")
        known = dict(axes)
        for a, v in ex.match:
            if a not in known or v not in known[a]:
                raise BuildFileError(f"{where}: unsupported() names {a}={v}, not in the dispatch")
    return Target(
        release=_release(where, release, dict(axes)),
        name=name, root=root, package=package, build_file=build_file, srcs=tuple(srcs),
        host_srcs=tuple(host_srcs),
        binding=binding, dispatch=tuple(axes), exclude=tuple(exclude), archs=tuple(archs),
        templates=tuple(templates), cflags=tuple(cflags), cuda_flags=tuple(cuda_flags),
        ldflags=tuple(ldflags), include_dirs=tuple(include_dirs), doc=doc, toolchains=toolchains,
        triton_srcs=tuple(triton_srcs), triton_kernels=tuple(triton_kernels), deps=tuple(deps),
        entries=tuple(entries), headers=tuple(headers),
    )


class SourceLibrary(Record):
    """`source_library(name=..., srcs=[...], host_srcs=[...])`: compile units that several targets
    share, listed once; each target naming it in `deps` compiles them into its own modules."""

    __slots__ = ("name", "package", "build_file", "srcs", "host_srcs", "doc")

    def __init__(self, name: str, package: str, build_file: Path, srcs: tuple[str, ...],
                 host_srcs: tuple[str, ...], doc: str = ""):
        self._init(name, package, build_file, srcs, host_srcs, doc)

    @property
    def label(self) -> str:
        return f"//{self.package}:{self.name}"

    full_label = label


def make_library(build_file: Path, root: str, package: str, *, name: str, srcs=(), host_srcs=(),
                 doc: str = "") -> SourceLibrary:
    where = f"{build_file}: source_library(name={name!r})"
    if not _NAME.match(name):
        raise BuildFileError(f"{where}: name must match {_NAME.pattern}")
    if not srcs and not host_srcs:
        raise BuildFileError(f"{where}: needs srcs (CUDA) or host_srcs (CPU backend)")
    return SourceLibrary(name, package, build_file, tuple(srcs), tuple(host_srcs), doc)


def with_deps(target: Target, libraries: dict[str, SourceLibrary]) -> Target:
    """`target` with the units of the libraries its deps name appended (paths from its package)."""
    if not target.deps:
        return target
    srcs, host_srcs = list(target.srcs), list(target.host_srcs)
    for dep in target.deps:
        label = f"//{target.package}{dep}" if dep.startswith(":") else dep
        lib = libraries.get(label)
        if lib is None:
            known = ", ".join(sorted(libraries)) or "none"
            raise BuildFileError(f"{target.build_file}: op_library(name={target.name!r}) depends on {dep!r}, "
                                 f"which is no source_library (declared: {known})")
        for own, theirs in ((srcs, lib.srcs), (host_srcs, lib.host_srcs)):
            for unit in theirs:
                rel = posixpath.relpath(f"{lib.package}/{unit}", target.package)
                if rel not in own:
                    own.append(rel)
    if srcs and not target.archs:
        raise BuildFileError(f"{target.build_file}: op_library(name={target.name!r}) gets CUDA srcs from its "
                             "deps and must declare archs=[families]")
    toolchains = tuple(t for t, units in (("cuda", srcs), ("host", host_srcs),
                                          ("triton", target.triton_srcs)) if units)
    return replace(target, srcs=tuple(srcs), host_srcs=tuple(host_srcs), toolchains=toolchains)


class Group(Record):
    """`op_group(name=..., targets=[...])`: a label that names several targets (a family), built
    and queried together; it compiles nothing of its own. `members`: labels as written (":decode"
    = the same package)."""

    __slots__ = ("name", "root", "package", "build_file", "members", "doc")

    def __init__(self, name: str, root: str, package: str, build_file: Path, members: tuple[str, ...],
                 doc: str = ""):
        self._init(name, root, package, build_file, members, doc)

    label = Target.label
    full_label = Target.full_label

    def member_labels(self) -> list[str]:
        return [f"//{self.package}{m}" if m.startswith(":") else m for m in self.members]


def make_group(build_file: Path, root: str, package: str, *, name: str, targets, doc: str = ""):
    where = f"{build_file}: op_group(name={name!r})"
    if not _NAME.match(name):
        raise BuildFileError(f"{where}: name must match {_NAME.pattern}")
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise BuildFileError(f"{where}: targets= takes a non-empty list of labels (':decode', "
                             "'//ops/norm:norm')")
    return Group(name, root, package, build_file, tuple(targets), doc)
