"""Where kiln's read-only kernel sources are, which kiln version this is, and the Python ABI.

In a source checkout (and an editable install) the sources are the repository itself: this file
is `<repo>/python/kiln/runtime/sources.py`. An installed wheel ships them as `kiln/_src/` beside
`kiln/runtime/`. Either way they are only ever read.

A kiln file has a *portable name* that is the same on every machine and in both layouts: its path
relative to the source root (`ops/norm/norm.cuh`) or, for the Python side, to the package root
(`codegen/render.py`). Precompiled modules record their inputs by portable name. Only what kiln
ships has one: a virtual environment or build output inside a checkout is not kiln's, even though
it lies below the same directory.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from pathlib import Path


class SourceTreeError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def source_root() -> Path:
    """The directory holding WORKSPACE.py, version.txt, ops/ and bindings/: `kiln/_src` in a wheel,
    the repository (two levels above the package, python/kiln) in a checkout."""
    package = package_root()
    candidates = (package / "_src", package.parent.parent)
    for candidate in candidates:
        if (candidate / "WORKSPACE.py").is_file():
            return candidate
    raise SourceTreeError(
        f"kiln's kernel sources were not found (no WORKSPACE.py in {' or '.join(map(str, candidates))}); "
        f"the installation of {package} is incomplete: reinstall kiln-kernels"
    )


@functools.lru_cache(maxsize=1)
def package_root() -> Path:
    """The `kiln` package directory (python/kiln in a checkout), holding runtime/ and codegen/."""
    return Path(__file__).resolve().parent.parent


# kiln's own files, by their first path component below each root: the kernel sources a wheel
# ships as kiln/_src (setup.py's SOURCES) and the Python packages that build and render them.
_OWNED = (("source", ("ops", "bindings", "WORKSPACE.py", "version.txt", "release")),
          ("package", ("codegen", "runtime")))


def _roots() -> list[tuple[Path, tuple[str, ...]]]:
    roots = {"source": source_root(), "package": package_root()}
    return [(roots[which], owned) for which, owned in _OWNED]


def portable_name(path: str | Path) -> str | None:
    """`path` relative to the source root or the package root ("." for the source root itself),
    or None when it is not one of kiln's own files."""
    path = Path(os.path.realpath(path))
    if path == source_root():
        return "."
    for root, owned in _roots():
        if path.is_relative_to(root):
            rel = path.relative_to(root)
            if rel.parts[0] in owned:
                return rel.as_posix()
    return None


def portable_path(name: str) -> Path | None:
    """The local file with portable name `name` (one of kiln's, no '..'), or None."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    for root, owned in _roots():
        candidate = root.joinpath(*parts)
        if parts[0] in owned and candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def kiln_version() -> str:
    """The one version: version.txt, shipped with the sources."""
    return (source_root() / "version.txt").read_text().strip()


# sysconfig fills its tables on first use, and not thread-safely: a thread that asks while another
# fills them sees EXT_SUFFIX as None (CPython 3.11). Builds plan modules in parallel threads, so
# every read goes through this lock.
_sysconfig_lock = threading.Lock()


def _config_var(name: str):
    with _sysconfig_lock:
        return sysconfig.get_config_var(name)


@functools.lru_cache(maxsize=1)
def python_abi() -> str:
    """The tag of the Python ABI a module is built for, e.g. 'cpython-311-x86_64-linux-gnu'."""
    return extension_suffix().strip(".").rsplit(".", 1)[0] or sys.implementation.cache_tag


def extension_suffix() -> str:
    return _config_var("EXT_SUFFIX") or ".so"


def python_include_dirs() -> tuple[str, ...]:
    with _sysconfig_lock:
        paths = sysconfig.get_paths()
    dirs = [paths["include"], paths.get("platinclude", paths["include"])]
    return tuple(dict.fromkeys(dirs))
