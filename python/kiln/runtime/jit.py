"""The one build-and-load template (R2.3-5): every module of every toolchain is loaded through
`load()`:

    in-process cache -> precompiled module (runtime/precompiled.py: packages, artifact directory,
      download cache, artifact repository) -> disk cache (metadata validated, no lock)
      -> KILN_DISABLE_JIT or no compiler? clear error
      -> module lock -> re-check the disk cache -> generate + compile + publish -> load

Nothing is written anywhere before a cache miss (a download writes only to the download cache).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import env, metadata, precompiled, sources
from .arch import ArchContext
from .build import BuildPlan, compile_plan, plan
from .loader import import_library
from .lock import ModuleLock
from .log import logger
from .spec import CompileSpec
from .toolchain import ToolchainError
from .workspace import Workspace


class JITDisabledError(RuntimeError):
    pass


@dataclass
class Stats:
    """Per-process counters, for tests and `python -m kiln env`."""

    compiled: int = 0
    disk_hits: int = 0
    memory_hits: int = 0
    precompiled_hits: int = 0


stats = Stats()
_loaded: dict[tuple[str, str], ModuleType] = {}
_mutex = threading.Lock()


def check(p: BuildPlan) -> tuple[metadata.Metadata | None, str | None]:
    """The cached artifact of `p` and None, or (metadata or None, why it cannot be used)."""
    if p.toolchain_problem:  # the key names the compiler, so without one no artifact can match
        return None, f"no compiler to check it against: {p.toolchain_problem}"
    try:
        md = metadata.read(p.key_dir)
    except metadata.CorruptMetadata as e:
        return None, str(e)
    return md, metadata.problem(md, p.key_dir, p.spec_key, p.key_parts["kiln_version"],
                                p.key_parts["python_abi"])


def _load_published(p: BuildPlan, md: metadata.Metadata, key_dir: Path) -> ModuleType:
    p.workspace.check_private(key_dir)
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
    log = logger()
    module, searched = precompiled.lookup(p)
    if module is not None:
        stats.precompiled_hits += 1
        return module

    if env.get("KILN_NO_CACHE"):
        return _build_uncached(p)

    md, reason = check(p)
    if reason is None:
        stats.disk_hits += 1
        return _load_published(p, md, p.key_dir)

    if env.get("KILN_DISABLE_JIT"):
        raise JITDisabledError(
            f"kiln: module {p.describe()} is needed but KILN_DISABLE_JIT=1 forbids compiling it, "
            f"and no valid artifact exists: no precompiled module ({searched}), and the disk "
            f"cache {p.key_dir} has none ({reason}). Install a precompiled package for this kiln "
            f"version and arch, run 'python -m codegen build {p.spec.label or p.spec.name}' "
            f"beforehand, or unset KILN_DISABLE_JIT."
        )
    if p.toolchain_problem:
        raise ToolchainError(
            f"kiln: cannot build {p.describe()}: {p.toolchain_problem}. No precompiled module "
            f"serves it ({searched})."
        )

    log.debug("kiln: cache miss for %s: %s", p.describe(), reason)
    p.workspace.ensure(p.module_dir)
    with ModuleLock(p.module_dir / ".lock", p.describe()):
        md, reason = check(p)  # another process may have built it while we waited
        if reason is not None:
            md = compile_plan(p)
            stats.compiled += 1
        else:
            stats.disk_hits += 1
    return _load_published(p, md, p.key_dir)


def _build_uncached(p: BuildPlan) -> ModuleType:
    """KILN_NO_CACHE=1: build into a fresh temporary directory, load, and delete it (R5.10)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"kiln-{p.spec.name}-"))
    try:
        md = compile_plan(p, key_dir=tmp)
        stats.compiled += 1
        return _load_published(p, md, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the loaded library stays mapped


def build(spec: CompileSpec, arch_ctx: ArchContext | None = None,
          workspace: Workspace | None = None, jobs: int | None = None,
          force: bool = False, quiet: bool = False) -> tuple[str, BuildPlan]:
    """Build `spec` into the disk cache without loading it. Returns ("built"|"cached", plan)."""
    p = plan(spec, arch_ctx, workspace)
    if not force and check(p)[1] is None:
        return "cached", p
    p.workspace.ensure(p.module_dir)
    with ModuleLock(p.module_dir / ".lock", p.describe()):
        if force or check(p)[1] is not None:
            compile_plan(p, jobs=jobs, quiet=quiet)
            stats.compiled += 1
            return "built", p
    return "cached", p


def clear_memory_cache() -> None:
    """Forget loaded modules (the libraries stay mapped); for tests."""
    with _mutex:
        _loaded.clear()


__all__ = ["load", "build", "check", "plan", "stats", "JITDisabledError", "sources"]
