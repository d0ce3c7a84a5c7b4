"""Where kiln's read-only kernel sources are, which kiln version this is, and the Python ABI.

In a source checkout (and an editable install) the sources are the repository itself: this file
is `<repo>/runtime/sources.py`. An installed wheel ships them as `kiln/_src/` beside `kiln/runtime/`.
Either way they are only ever read (R2.7).
"""

from __future__ import annotations

import functools
import sys
import sysconfig
import threading
from pathlib import Path


class SourceTreeError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def source_root() -> Path:
    """The directory holding WORKSPACE.py, version.txt, ops/ and bindings/."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_src", here):
        if (candidate / "WORKSPACE.py").is_file():
            return candidate
    raise SourceTreeError(
        f"kiln's kernel sources were not found beside {here} (no WORKSPACE.py in {here / '_src'} "
        f"or {here}); the installation is incomplete: reinstall kiln-kernels"
    )


@functools.lru_cache(maxsize=1)
def kiln_version() -> str:
    """The one version (R7.15): version.txt, shipped with the sources."""
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
