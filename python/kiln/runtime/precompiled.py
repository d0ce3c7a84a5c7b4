"""Precompiled modules: the step of the build-and-load template between
the in-process cache and the disk cache. It needs no compiler.

Where a module is looked for, in order (the first that has it serves it):
  1. KILN_ARTIFACT_DIR            a local directory in the artifact-repository layout
  2. installed precompiled packages, the wheels `python -m release build` makes (they declare a
                                  `kiln.precompiled` entry point naming their package directory)
  3. the download cache           $KILN_WORKSPACE_BASE/downloads
  4. KILN_ARTIFACT_REPOSITORY     a pinned release whose arch list covers the module is
                                  downloaded into the cache and served from there

A manifest entry serves a plan when (docs/release.md):
  - its portable key equals the plan's (the JIT's key parts less compilers and absolute paths),
  - its SASS runs on every arch the plan asks for (arch.uncovered),
  - every kiln header it was compiled from has, here, the digest it had there (so an edited
    kernel is never served stale), which makes its portable action key this installation's,
  - its file is the one the manifest names (SHA-256), reached through no link, and not
    replaceable by another user;
  - for an installed package: its manifest is the pinned one when this kiln pins its release
    (release/pins.json, KILN_ARTIFACT_PINS); a package of a release this kiln does not pin (a
    local build) is checked against its own manifest only (docs/release.md says what that means).
A package built for another kiln version is an error, unless KILN_SKIP_VERSION_CHECK=1,
which matches it by module, parameters, toolchain, build settings and archs, and warns on every
load. A module that must be downloaded and cannot be (offline, no network, tampered) is
an error naming it and every place looked, never a silent fallback to the JIT.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from . import env, sources
from .arch import ArchError, format_arch_list, parse_arch, uncovered
from .files import check_not_replaceable
from .key import file_digest
from .loader import import_library
from .log import logger
from .record import Record
from .workspace import Workspace

if TYPE_CHECKING:
    from .artifacts import ReleaseId
    from .manifest import Manifest, ModuleEntry

# The release tooling (artifacts, download, manifest) and the triton loader are imported by the
# functions that use them: a process with no precompiled package, artifact directory, download
# cache or repository (the usual warm start from the disk cache) never needs them, and importing
# them was a sixth of a warm first call.

ENTRY_POINT_GROUP = "kiln.precompiled"
# Compared when KILN_SKIP_VERSION_CHECK=1 loads a module of another version: what it is and how it
# was configured, not the sources and flags that legitimately differ between versions.
_COMPAT_PARTS = ("module", "uri", "params", "toolchain", "python_abi", "env")


class PrecompiledVersionError(RuntimeError):
    """An installed precompiled package was built for another kiln version."""


class PrecompiledError(RuntimeError):
    """An installed precompiled package is broken: unreadable, inconsistent or tampered."""


class Package(Record):
    """An installed precompiled package: its distribution and its directory."""

    __slots__ = ("dist", "version", "directory")

    def __init__(self, dist: str, version: str, directory: Path):
        self._init(dist, version, directory)

    @property
    def where(self) -> str:
        return f"precompiled package {self.dist} {self.version} ({self.directory})"


def _may_declare(group: str) -> bool:
    """False only when no distribution importlib.metadata would find can declare an entry point
    in `group`: none of the entry_points.txt files of the *.dist-info and *.egg-info directories
    on sys.path names it. Reading those files directly costs ~1 ms on the 2-core box, where
    importlib.metadata.entry_points() (a Distribution object and a parse of every file) costs
    ~3.7 ms; with no precompiled package installed, the usual case, the scan ends here. Anything
    this cannot read the way importlib does (another distribution finder, a zip or egg on sys.path,
    an unreadable file) answers True, so the full lookup runs."""
    if any(hasattr(f, "find_distributions") and f is not importlib.machinery.PathFinder
           for f in sys.meta_path):
        return True
    for entry in sys.path:
        try:
            it = os.scandir(entry or ".")
        except NotADirectoryError:
            return True  # a zip file
        except OSError:
            continue  # absent: importlib finds nothing there either
        if entry.endswith(".egg"):
            it.close()
            return True
        with it:
            for child in it:
                if not child.name.lower().endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(child.path, "entry_points.txt"), encoding="utf-8") as f:
                        if group in f.read():
                            return True
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except (OSError, ValueError):
                    return True
    return False


@functools.lru_cache(maxsize=1)
def installed_packages() -> tuple[Package, ...]:
    """The installed precompiled packages, found through their entry points without importing
    them (cached for the process; `installed_packages.cache_clear()` after installing one)."""
    if not _may_declare(ENTRY_POINT_GROUP):
        return ()
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist else ep.name
        version = ep.dist.version if ep.dist else "?"
        mspec = importlib.util.find_spec(ep.value)
        if mspec is None or not mspec.submodule_search_locations:
            raise PrecompiledError(
                f"{dist} {version} declares precompiled modules in package {ep.value!r}, which "
                f"is not installed; reinstall it or uninstall it (pip uninstall {dist})")
        found.append(Package(dist, version, Path(list(mspec.submodule_search_locations)[0])))
    return tuple(found)


# ---- matching a manifest entry to a plan ---------------------------------------------------

@functools.lru_cache(maxsize=1024)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    return file_digest(path)


def _local_digest(name: str) -> str | None:
    path = sources.portable_path(name)
    if path is None:
        return None
    st = os.stat(path)
    return _digest(str(path), st.st_mtime_ns, st.st_size)


def _differing_parts(a: dict, b: dict) -> str:
    return ", ".join(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _mismatch(entry: ModuleEntry, plan, compat: bool) -> str | None:
    """Why `entry` cannot serve `plan`, or None when it can."""
    if compat:  # KILN_SKIP_VERSION_CHECK=1 and another version
        mine = {k: plan.portable_parts[k] for k in _COMPAT_PARTS}
        theirs = {k: entry.portable_parts.get(k) for k in _COMPAT_PARTS}
        if mine != theirs:
            return f"it differs in {_differing_parts(mine, theirs)}"
    elif entry.portable_key != plan.portable_key:
        return f"its key differs in {_differing_parts(entry.portable_parts, plan.portable_parts)}"
    built = tuple(parse_arch(a) for a in entry.archs)
    missing = uncovered(built, plan.archs)
    if missing:
        return (f"it has code for [{format_arch_list(built)}], none of which runs on "
                f"{format_arch_list(missing)}")
    if not compat:
        for name, sha in sorted(entry.sources.items()):
            local = _local_digest(name)
            if local is None:
                return f"it was compiled from {name}, which this installation does not have"
            if local != sha:
                return f"it was compiled from another {name} than this installation's"
    return None


def _match(m: Manifest, plan, where: str, compat: bool,
           searched: list[str]) -> ModuleEntry | None:
    entries = m.entries(plan.name)
    if not entries:
        searched.append(f"{where}: has no {plan.name}")
        return None
    reasons = []
    for entry in entries:
        why = _mismatch(entry, plan, compat)
        if why is None:
            return entry
        reasons.append(why)
    searched.append(f"{where}: its {plan.name} does not match ({'; '.join(reasons)})")
    return None


# ---- loading a matched entry ------------------------------------------------------------------

def _verified_path(root: Path, entry: ModuleEntry, where: str, trust_root: Path, fix: str) -> Path:
    """The entry's file below `root`, after the path, ownership and checksum checks."""
    from . import artifacts, download, manifest

    try:
        path = manifest.resolve_inside(root, entry.file, where)
    except FileNotFoundError as e:
        raise PrecompiledError(f"{e}: the manifest lists {entry.module} but its file is "
                               "missing") from None
    except manifest.ManifestError as e:
        raise PrecompiledError(str(e)) from None
    check_not_replaceable(path, trust_root, fix)
    if artifacts.verifying():
        why = download.problem(path, entry.sha256, entry.size)
        if why is not None:
            raise PrecompiledError(f"{where}: refusing {entry.module}: {why} (corrupt or "
                                   f"tampered). Reinstall or re-download it.")
    else:
        logger().warning("kiln: WARNING: KILN_VERIFY_CHECKSUMS=0: loading %s from %s without "
                         "checking its SHA-256 (a debugging aid only)", entry.module, path)
    return path


class Found(Record):
    """A precompiled module that serves a plan: its entry, its verified file, where it is."""

    __slots__ = ("entry", "path", "where")

    def __init__(self, entry: ModuleEntry, path: Path, where: str):
        self._init(entry, path, where)


def _covers(rid: ReleaseId, plan) -> bool:
    archs = rid.archs()
    if archs is None:
        return False
    if plan.spec.toolchain == "host":
        return rid.tag == "host"
    if plan.spec.toolchain == "triton":
        return rid.tag.startswith("triton-") and not uncovered(archs, plan.archs)
    return rid.tag != "host" and not rid.tag.startswith("triton-") and \
        not uncovered(archs, plan.archs)


# ---- the four places ----------------------------------------------------------------------

def _from_directory(root: Path, label: str, plan, searched: list[str],
                    tolerate_corrupt: bool = False) -> Found | None:
    from . import artifacts

    version, abi = sources.kiln_version(), sources.python_abi()
    releases = [r for r in artifacts.local_releases(root, version, abi) if _covers(r, plan)]
    if not releases:
        searched.append(f"{label} {root}: no release of kiln {version} for {abi} covering "
                        f"{plan.describe()}")
        return None
    for rid in releases:
        where = f"{label} {rid.dir_in(root)}"
        m = artifacts.read_local(rid, root, label)
        entry = _match(m, plan, where, False, searched)
        if entry is None:
            continue
        try:
            path = _verified_path(rid.dir_in(root), entry, where, root,
                                  f"Keep {root} writable only by you.")
        except PrecompiledError as e:
            if not tolerate_corrupt:
                raise
            searched.append(f"{where}: {e}")  # the download step fetches it again
            continue
        return Found(entry, path, where)
    return None


def _from_package(pkg: Package, plan, searched: list[str]) -> Found | None:
    from . import artifacts, manifest
    from .artifacts import ReleaseId

    path = pkg.directory / manifest.MANIFEST
    try:
        m, digest = manifest.read(path)
        rid = ReleaseId.of(m)
    except (OSError, manifest.ManifestError, ArchError) as e:
        raise PrecompiledError(f"{pkg.where} is broken: {e}. Reinstall it (pip install "
                               f"--force-reinstall {pkg.dist}) or uninstall it.") from None
    pinned = artifacts.pins().get(rid.path) if artifacts.verifying() else None
    if pinned is not None and pinned != digest:
        raise PrecompiledError(
            f"{pkg.where}: its manifest has SHA-256 {digest}, but this kiln pins release "
            f"{rid.path} to {pinned}: the package is not the one released (rebuilt or re-signed "
            f"elsewhere, or tampered with); refusing it. Install the released package, or "
            f"uninstall it (pip uninstall {pkg.dist}).")
    version = sources.kiln_version()
    compat = False
    if m.kiln_version != version:
        if not env.get("KILN_SKIP_VERSION_CHECK"):
            raise PrecompiledVersionError(
                f"kiln: {pkg.where} was built for kiln {m.kiln_version}, but this is kiln "
                f"{version}; a precompiled package is used only with the kiln version it was "
                f"built for. Install the matching one (pip install "
                f"'{pkg.dist}=={version}'), or uninstall it (pip uninstall {pkg.dist}) to "
                f"compile with the JIT. KILN_SKIP_VERSION_CHECK=1 loads it anyway, for a "
                f"deliberate mixed-version experiment only.")
        compat = True
    if m.python_abi != sources.python_abi():
        raise PrecompiledError(
            f"kiln: {pkg.where} was built for Python ABI {m.python_abi}, but this Python is "
            f"{sources.python_abi()}; install the package built for this Python, or uninstall it")
    entry = _match(m, plan, pkg.where, compat, searched)
    if entry is None:
        return None
    path = _verified_path(pkg.directory, entry, pkg.where, pkg.directory.parent,
                          f"Install {pkg.dist} where only you or root can write.")
    return Found(entry, path, pkg.where)


def _from_repository(repository: str, plan, searched: list[str]) -> Found | None:
    from . import artifacts, download
    from .artifacts import ArtifactError, ReleaseId

    version, abi = sources.kiln_version(), sources.python_abi()
    releases = [r for r in artifacts.pinned_releases(version, abi) if _covers(r, plan)]
    if not artifacts.verifying():  # no pins needed: also try the tag of the plan's own archs
        own = ReleaseId(version, artifacts.tag_for(plan.spec.toolchain, plan.archs), abi)
        releases += [own] if own not in releases else []
    if not releases:
        searched.append(f"KILN_ARTIFACT_REPOSITORY={repository}: this kiln pins no release of "
                        f"kiln {version} for {abi} covering {plan.describe()}")
        logger().info("kiln: %s is not part of any release this kiln pins; not downloading it",
                      plan.describe())
        return None
    cache = artifacts.cache_root()
    for rid in releases:
        where = rid.url_in(repository)
        try:
            m = artifacts.ensure_manifest(rid, repository, cache)
            entry = _match(m, plan, where, False, searched)
            if entry is None:
                continue
            artifacts.ensure_file(rid, entry, repository, cache)
        except (download.DownloadError, ArtifactError) as e:
            archs = rid.archs()
            command = "python -m kiln download " + (
                f"--arch-list '{format_arch_list(archs)}'" if archs else "--toolchain host")
            hint = (f"Prefetch it on a connected machine with '{command}' and point "
                    "KILN_ARTIFACT_DIR at a copy (--dest), or unset KILN_OFFLINE."
                    if env.get("KILN_OFFLINE") else
                    f"Check the repository URL and the network, or prefetch with '{command}'.")
            raise ArtifactError(
                f"kiln: {plan.describe()} must come from the artifact repository, but it is not "
                f"available: {e}. Looked in: {'; '.join(searched)}; and {where}. {hint}") from e
        path = _verified_path(rid.dir_in(cache), entry, where, Workspace.current().base,
                              "Set KILN_WORKSPACE_BASE to a private directory.")
        return Found(entry, path, f"{where} (cached in {rid.dir_in(cache)})")
    return None


def find(plan, download: bool = True) -> tuple[Found | None, str]:
    """The precompiled module that serves `plan`, or (None, where it was looked for), without
    loading it. Errors (another version, tampering, a download that must happen and cannot) raise.
    download=False looks only where the module already is (no artifact repository)."""
    searched: list[str] = []
    artifact_dir = env.get("KILN_ARTIFACT_DIR")
    if artifact_dir:
        found = _from_directory(Path(artifact_dir).absolute(), "KILN_ARTIFACT_DIR", plan,
                                searched)
        if found:
            return found, ""
    packages = installed_packages()
    for pkg in packages:
        found = _from_package(pkg, plan, searched)
        if found:
            return found, ""
    if not packages:
        searched.append("no precompiled package installed")
    repository = env.get("KILN_ARTIFACT_REPOSITORY")
    cache = Workspace.current().downloads  # artifacts.cache_root(), without importing artifacts
    if cache.is_dir():
        # A missing or corrupt cached file is fetched again by the repository step, if any.
        found = _from_directory(cache, "download cache", plan, searched,
                                tolerate_corrupt=bool(repository))
        if found:
            return found, ""
    else:
        searched.append(f"download cache {cache}: empty")
    if repository and download:
        found = _from_repository(repository, plan, searched)
        if found:
            return found, ""
    else:
        searched.append("KILN_ARTIFACT_REPOSITORY unset (nothing is downloaded)")
    return None, "; ".join(searched)


def lookup(plan) -> tuple[ModuleType | None, str]:
    """The module for `plan` from a precompiled source, or (None, where it was looked for)."""
    found, searched = find(plan)
    if found is None:
        return None, searched
    entry = found.entry
    if entry.kiln_version != sources.kiln_version():
        logger().warning(
            "kiln: WARNING: KILN_SKIP_VERSION_CHECK=1: loading %s built for kiln %s into kiln %s "
            "from %s. Its kernels and this version's API may disagree; use this only for a "
            "deliberate, diagnosed mixed-version experiment.", entry.module,
            entry.kiln_version, sources.kiln_version(), found.where)
    if plan.spec.toolchain == "triton":  # a triton bundle (runtime/triton_module.py)
        from .triton_module import TritonModule

        module = TritonModule.from_bundle(plan.name, found.path)
    else:
        module = import_library(plan.name, found.path)
    logger().debug("kiln: loaded %s from %s", plan.describe(), found.path)
    return module, found.where


__all__ = ["find", "lookup", "installed_packages", "Found", "Package", "PrecompiledError",
           "PrecompiledVersionError"]
