"""The one build-and-load template: every module of every toolchain is loaded through
`load()`:

    in-process cache -> precompiled module (runtime/precompiled.py: packages, artifact directory,
      download cache, artifact repository) -> disk cache (verified, no lock)
      -> KILN_DISABLE_JIT or no compiler? clear error
      -> module lock -> re-verify the slot -> recover it (runtime/cache.py: quarantine a damaged
         slot, empty an interrupted one, verify a build directory before reusing it)
      -> generate + compile + publish -> load

Nothing is written anywhere before a cache miss (a download writes only to the download cache).
Nothing is loaded that was not verified first: the library's size and SHA-256 against its
metadata, the metadata against the slot, and every file and directory against other users.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from . import cache, env, files, metadata, precompiled, sources
from .arch import ArchContext
from .build import BuildPlan, compile_plan, plan
from .loader import import_library
from .lock import ModuleLock
from .log import logger
from .spec import CompileSpec
from .toolchain import ToolchainError
from .workspace import Workspace, WorkspaceError

BUILD_COMMAND = "python -m kiln.codegen build"  # works wherever kiln is installed (also: kiln-build)


class JITDisabledError(RuntimeError):
    pass


class SanitizerRuntimeError(RuntimeError):
    """A module built with AddressSanitizer cannot be loaded into a process without its runtime."""


def _asan_runtime_loaded() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "__asan_init")


def _check_sanitizer(p: BuildPlan) -> None:
    """An ASan-instrumented module loaded into a process whose ASan runtime was not loaded first
    aborts the process; say what to do instead."""
    if "-fsanitize=address" in p.link_flags and not _asan_runtime_loaded():
        raise SanitizerRuntimeError(
            f"kiln: {p.describe()} is built with AddressSanitizer (KILN_JIT_ASAN=1), and loading "
            "it needs the ASan runtime loaded before anything else: run Python as "
            "LD_PRELOAD=\"$(c++ -print-file-name=libasan.so) $(c++ -print-file-name=libstdc++.so)\" "
            "ASAN_OPTIONS=detect_leaks=0 python ... (docs/troubleshooting.md), or unset KILN_JIT_ASAN.")


class Stats:
    """Per-process counters, for tests and `python -m kiln env` (a plain class: a dataclass costs
    ~0.5 ms to create, runtime/record.py)."""

    __slots__ = ("compiled", "disk_hits", "memory_hits", "precompiled_hits")

    def __init__(self) -> None:
        self.compiled = self.disk_hits = self.memory_hits = self.precompiled_hits = 0

    def __repr__(self) -> str:
        return (f"Stats(compiled={self.compiled}, disk_hits={self.disk_hits}, "
                f"memory_hits={self.memory_hits}, precompiled_hits={self.precompiled_hits})")


stats = Stats()
_loaded: dict[tuple[str, str], ModuleType] = {}
_mutex = threading.Lock()


def verify(p: BuildPlan) -> cache.Entry:
    """The state of `p`'s disk-cache slot (runtime/cache.py), without a lock or a write."""
    if p.toolchain_problem:  # the key names the compiler, so without one no artifact can match
        return cache.Entry("absent", None, f"no compiler to check it against: {p.toolchain_problem}")
    return cache.verify(p)


def check(p: BuildPlan) -> tuple[metadata.Metadata | None, str | None]:
    """The cached artifact of `p` and None, or (metadata or None, why it cannot be used)."""
    entry = verify(p)
    return entry.md, entry.reason


def _triton_load_error() -> type[Exception]:
    """triton_module.TritonLoadError, imported only when a load has failed (the except clause
    evaluates this then), so a process that loads no triton module never imports the loader."""
    from .triton_module import TritonLoadError

    return TritonLoadError


def _load_published(p: BuildPlan, md: metadata.Metadata, key_dir: Path) -> ModuleType:
    if p.spec.toolchain == "triton":  # the cubins and their launch metadata, verified; no import
        from .triton_module import TritonModule  # (imported by the first triton load only)

        module = TritonModule.from_slot(p.spec.name, key_dir, md.library)
        logger().debug("kiln: loaded %s from %s", p.describe(), key_dir / md.library)
        return module
    _check_sanitizer(p)
    module = import_library(p.spec.name, key_dir / md.library)
    logger().debug("kiln: loaded %s from %s", p.describe(), key_dir / md.library)
    return module


def load(spec: CompileSpec, arch_ctx: ArchContext | None = None,
         workspace: Workspace | None = None) -> ModuleType:
    """The loaded module for `spec`, building it first if no valid artifact exists."""
    p = plan(spec, arch_ctx, workspace)
    mem_key = (p.spec.name, p.spec_key)
    with _mutex:
        cached = _loaded.get(mem_key)
    if cached is not None:
        stats.memory_hits += 1
        return cached
    module = _load_uncached(p)
    with _mutex:
        _loaded[mem_key] = module
    return module


def _load_uncached(p: BuildPlan) -> ModuleType:
    module, searched = precompiled.lookup(p)
    if module is not None:
        stats.precompiled_hits += 1
        return module

    if env.get("KILN_NO_CACHE"):
        return _build_uncached(p)

    for attempt in range(2):
        entry = verify(p)
        if entry.state != "ok":
            break
        try:
            module = _load_published(p, entry.md, p.key_dir)
        except (ImportError, FileNotFoundError, _triton_load_error()):
            # Another process's rebuild may have superseded the library between verifying and
            # loading it: verify again, once. Anything else is a real error.
            if attempt or (p.key_dir / entry.md.library).exists():
                raise
            continue
        stats.disk_hits += 1
        return module

    if env.get("KILN_DISABLE_JIT"):
        raise JITDisabledError(
            f"kiln: module {p.describe()} is needed but KILN_DISABLE_JIT=1 forbids compiling it, "
            f"and no valid artifact exists: no precompiled module ({searched}), and the disk "
            f"cache {p.key_dir} has none ({entry.reason}). Install a precompiled package for this "
            f"kiln version and arch, run '{BUILD_COMMAND} {p.spec.label or p.spec.name}' "
            f"beforehand, or unset KILN_DISABLE_JIT."
        )
    if p.toolchain_problem:
        raise ToolchainError(
            f"kiln: cannot build {p.describe()}: {p.toolchain_problem}. No precompiled module "
            f"serves it ({searched})."
        )

    logger().debug("kiln: cache miss for %s: %s", p.describe(), entry.reason)
    md, _ = _build_locked(p)
    module = _load_published(p, md, p.key_dir)
    return module


def _build_locked(p: BuildPlan, force: bool = False, jobs: int | None = None,
                  quiet: bool = False) -> tuple[metadata.Metadata, bool]:
    """Under the module lock: the slot's verified metadata, building (after recovering the slot)
    when it is not usable or `force`. Returns (metadata, whether it was built now)."""
    p.workspace.check_slot(p.key_dir)  # refuse an unsafe workspace before creating anything in it
    p.workspace.ensure(p.module_dir)
    with ModuleLock(p.module_dir / ".lock", p.describe()):
        entry = verify(p)  # another process may have built it while we waited
        if entry.state == "ok" and not force:
            stats.disk_hits += 1
            return entry.md, False
        cache.prepare(p, entry, force=force)
        compile_plan(p, jobs=jobs, quiet=quiet)
        stats.compiled += 1
        entry = verify(p)
        if entry.state != "ok":  # what was just published must verify like any other slot
            raise WorkspaceError(f"kiln: {p.describe()} was built into {p.key_dir} but does not "
                                 f"verify: {entry.reason}")
        return entry.md, True


def _build_uncached(p: BuildPlan) -> ModuleType:
    """KILN_NO_CACHE=1: build into a fresh temporary directory, load, and delete it."""
    tmp = Path(tempfile.mkdtemp(prefix=f"kiln-{p.spec.name}-"))
    try:
        md = compile_plan(p, key_dir=tmp)
        stats.compiled += 1
        p.workspace.check_private(tmp)
        lib = tmp / md.library
        why = files.untrusted_file(lib.lstat())
        if why or files.verified_digest(lib) != md.library_sha256:  # a triton module's cubins:
            # checked against the launch metadata as they are read
            raise WorkspaceError(f"kiln: {lib}, just built, {why or 'does not match its digest'}")
        return _load_published(p, md, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the loaded library stays mapped


def build(spec: CompileSpec, arch_ctx: ArchContext | None = None,
          workspace: Workspace | None = None, jobs: int | None = None,
          force: bool = False, quiet: bool = False) -> tuple[str, BuildPlan]:
    """Build `spec` into the disk cache without loading it. Returns ("built"|"cached", plan).
    `force` rebuilds every unit, from an empty build directory."""
    p = plan(spec, arch_ctx, workspace)
    if not force and verify(p).state == "ok":
        return "cached", p
    if p.toolchain_problem:
        raise ToolchainError(f"kiln: cannot build {p.describe()}: {p.toolchain_problem}")
    _, built = _build_locked(p, force=force, jobs=jobs, quiet=quiet)
    return ("built" if built else "cached"), p


def clear_memory_cache() -> None:
    """Forget loaded modules (the libraries stay mapped); for tests."""
    with _mutex:
        _loaded.clear()


__all__ = ["load", "build", "check", "verify", "plan", "stats", "JITDisabledError",
           "SanitizerRuntimeError", "sources", "BUILD_COMMAND"]
