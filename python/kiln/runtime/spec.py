"""The one compile-spec interface every toolchain is driven through.

A CompileSpec says everything the JIT needs to build one module: its unique name, the compile units
and the files they are produced from, flags, linker flags, and the arch families it supports. It
is built by codegen from a BUILD target and one point of its dispatch matrix; tests build small
ones directly. The runtime never looks inside a BUILD file.

Three toolchains: `host` (the C++ compiler), `cuda` (nvcc) and `triton` (the Triton DSL). A triton
spec's units are Python files holding `@triton.jit` kernels (lang "triton", read in place from the
source tree), and its `kernels` name the entry points to compile: each with its signature, its
`tl.constexpr` values (the specialisation, from the dispatch axes) and its launch options. One
module holds one cubin per kernel and arch (runtime/triton_build.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .arch import ArchFamily
from .record import Record

TOOLCHAINS = ("host", "cuda", "triton")
_LANGS = {"host": ("cxx",), "cuda": ("cxx", "cuda"), "triton": ("triton",)}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Unit(Record):
    """One compile unit, by its file name in the spec's generated directory; `lang` is "cxx" (the
    host compiler), "cuda" (nvcc) or "triton" (a Python kernel file)."""

    __slots__ = ("name", "lang")

    def __init__(self, name: str, lang: str):
        self._init(name, lang)

    @property
    def obj(self) -> str:
        return self.name.replace("/", "_") + ".o"


@dataclass(frozen=True)
class TritonKernel:
    """One entry point of a triton module: the `@triton.jit` function `entry` of unit `unit`,
    compiled with `signature` (argument -> triton type, "*bf16", "i32", ...; the constexpr
    arguments as "constexpr"), `constexprs` (argument -> value) and the launch options. `name`
    (default: `entry`) is what the module calls this compiled kernel: one function compiled with
    several configs (tile sizes, warps, stages: autotuner tactics) is several names."""

    entry: str
    unit: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    name: str = ""

    @property
    def key(self) -> str:
        """The compiled kernel's name in its module (its launch metadata, cubins, launcher)."""
        return self.name or self.entry

    def __post_init__(self):
        if not _IDENT.match(self.entry) or not _IDENT.match(self.key):
            raise ValueError(f"triton entry point {self.entry!r} and name {self.key!r} must be "
                             "Python identifiers")
        names = [a for a, _ in self.signature]
        missing = [c for c, _ in self.constexprs if c not in names]
        if missing:
            raise ValueError(f"{self.entry}: constexprs {missing} are not in its signature")
        for a, t in self.signature:
            if (t == "constexpr") != (a in dict(self.constexprs)):
                raise ValueError(f"{self.entry}: argument {a} is typed {t!r}; an argument is "
                                 "'constexpr' exactly when constexprs gives its value")
        if self.num_warps not in (1, 2, 4, 8, 16, 32) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"{self.entry}: num_warps {self.num_warps} must be a power of two "
                             f"<= 32 and num_stages {self.num_stages} in 1..8")

    def to_json(self) -> dict:
        return {"entry": self.entry, "name": self.key, "unit": self.unit,
                "signature": [list(x) for x in self.signature],  # in parameter order
                "constexprs": dict(self.constexprs), "num_warps": self.num_warps,
                "num_stages": self.num_stages}


@dataclass(frozen=True)
class CompileSpec:
    name: str  # module name: unique across the build graph and a C identifier (PyInit_<name>)
    uri: str  # the specialisation's URI; the toolchains of one specialisation share it
    toolchain: str  # "host" | "cuda" | "triton"
    units: tuple[Unit, ...]
    # Every file whose bytes determine the generated directory (templates, copied units, the
    # BUILD file). Their digests are part of the cache key; headers come from the depfiles.
    inputs: tuple[Path, ...]
    params: tuple[tuple[str, str], ...] = ()
    include_dirs: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    arch_families: tuple[ArchFamily, ...] = ()
    label: str = ""  # the build-graph label, quoted in messages
    kernels: tuple[TritonKernel, ...] = ()  # triton: the entry points compiled
    # Writes the compile units (and anything they include from there) into the generated dir.
    generate: Callable[[Path], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not _IDENT.match(self.name):
            raise ValueError(f"module name {self.name!r} must be a C identifier")
        if self.toolchain not in TOOLCHAINS:
            raise ValueError(f"toolchain {self.toolchain!r} is not one of {TOOLCHAINS}")
        if not self.units:
            raise ValueError(f"spec {self.name} has no compile units")
        for u in self.units:
            if u.lang not in _LANGS[self.toolchain]:
                raise ValueError(f"unit {u.name}: lang {u.lang!r} is not one of "
                                 f"{_LANGS[self.toolchain]} (spec {self.name} is for "
                                 f"{self.toolchain})")
        if self.toolchain in ("cuda", "triton") and not self.arch_families:
            raise ValueError(f"{self.toolchain} spec {self.name} declares no arch families")
        if (self.toolchain == "triton") != bool(self.kernels):
            raise ValueError(f"spec {self.name}: kernels= is for (and required by) the triton "
                             "toolchain")
        units = {u.name for u in self.units}
        for k in self.kernels:
            if k.unit not in units:
                raise ValueError(f"triton kernel {k.entry}: unit {k.unit} is not one of {units}")
        if self.toolchain == "triton":
            stems = [u.name[:-3] for u in self.units]
            if len(set(k.key for k in self.kernels)) != len(self.kernels):
                raise ValueError(f"spec {self.name}: triton kernel names must be distinct (name= "
                                 "tells configs of one entry point apart)")
            if not all(u.name.endswith(".py") and _IDENT.match(st) for u, st in
                       zip(self.units, stems, strict=True)):
                raise ValueError(f"spec {self.name}: triton units must be <identifier>.py files")

    @property
    def what(self) -> str:
        """How messages name this module."""
        return f"{self.name}" + (f" ({self.label})" if self.label else "")
