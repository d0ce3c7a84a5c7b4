"""The one compile-spec interface every toolchain is driven through.

A CompileSpec says everything the JIT needs to build one module: its unique name, the compile units
and the files they are produced from, flags, linker flags, and the arch families it supports. It
is built by codegen from a BUILD target and one point of its dispatch matrix; tests build small
ones directly. The runtime never looks inside a BUILD file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .arch import ArchFamily

TOOLCHAINS = ("host", "cuda")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Unit:
    """One compile unit, by its file name in the spec's generated directory."""

    name: str
    lang: str  # "cxx" (the host compiler) or "cuda" (nvcc)

    @property
    def obj(self) -> str:
        return self.name.replace("/", "_") + ".o"


@dataclass(frozen=True)
class CompileSpec:
    name: str  # module name: unique across the build graph and a C identifier (PyInit_<name>)
    uri: str  # the specialisation's URI; the toolchains of one specialisation share it
    toolchain: str  # "host" | "cuda"
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
            if u.lang not in ("cxx", "cuda"):
                raise ValueError(f"unit {u.name}: lang {u.lang!r} is not 'cxx' or 'cuda'")
            if u.lang == "cuda" and self.toolchain != "cuda":
                raise ValueError(f"unit {u.name} is CUDA but spec {self.name} is for {self.toolchain}")
        if self.toolchain == "cuda" and not self.arch_families:
            raise ValueError(f"CUDA spec {self.name} declares no arch families")

    @property
    def what(self) -> str:
        """How messages name this module."""
        return f"{self.name}" + (f" ({self.label})" if self.label else "")
