"""The compilers behind the three toolchains, found once per process, and their identity.

`host`: the C++ compiler (CXX, else c++ / g++ on PATH) builds the CPU backend and every binding.
`cuda`: nvcc (KILN_NVCC, else $CUDA_HOME/bin/nvcc, else nvcc on PATH) builds device code, with the
host compiler as its -ccbin. `triton`: the `triton` Python package of this interpreter (its
compiler runs in a child process, runtime/triton_build.py; nothing here imports it), identified by
its distribution version and where it is installed. A toolchain's identity (resolved path and
version text) is part of every cache key: a compiler upgrade rebuilds everything.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import env


class ToolchainError(RuntimeError):
    """A compiler kiln needs was not found or does not run."""


@dataclass(frozen=True)
class Compiler:
    path: str  # absolute path of what is executed
    version: str  # the first line(s) of its --version output that name the release

    def identity(self) -> dict:
        return {"path": self.path, "version": self.version}


def _version_text(path: str, keep) -> str:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"cannot run '{path} --version': {e}") from e
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return " | ".join(keep(lines)) or out.strip()


@functools.lru_cache(maxsize=8)
def _compiler(path: str, mtime_ns: int, kind: str) -> Compiler:
    if kind == "nvcc":
        # "Cuda compilation tools, release 13.0, V13.0.88" and "Build cuda_13.0.r13.0/..."
        version = _version_text(path, lambda ls: [x for x in ls if "release" in x or "Build" in x])
    else:
        version = _version_text(path, lambda ls: ls[:1])
    return Compiler(path, version)


def _resolve(path: str) -> str:
    return str(Path(path).resolve())


def host_compiler() -> Compiler:
    cxx = env.get("CXX")
    candidates = [cxx] if cxx else ["c++", "g++", "clang++"]
    for c in candidates:
        found = shutil.which(c)
        if found:
            resolved = _resolve(found)
            return _compiler(resolved, os.stat(resolved).st_mtime_ns, "cxx")
    raise ToolchainError(
        f"no C++ compiler found (looked for {', '.join(candidates)} on PATH); install g++ or set CXX"
    )


def nvcc() -> Compiler:
    explicit = env.get("KILN_NVCC")
    cuda_home = env.get("CUDA_HOME")
    looked = []
    candidates = []
    if explicit:
        candidates.append(explicit)
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", "nvcc"))
    candidates.append("nvcc")
    for c in candidates:
        looked.append(c)
        found = shutil.which(c)
        if found:
            resolved = _resolve(found)
            return _compiler(resolved, os.stat(resolved).st_mtime_ns, "nvcc")
    raise ToolchainError(
        f"nvcc not found (looked for {', '.join(looked)}); install the CUDA toolkit, set "
        "KILN_NVCC or CUDA_HOME, or use the CPU backend"
    )


@functools.lru_cache(maxsize=4)
def cuda_home(nvcc_path: str) -> str:
    """The toolkit root: CUDA_HOME, else the one holding nvcc, else /usr/local/cuda."""
    candidates = [env.get("CUDA_HOME"), str(Path(nvcc_path).resolve().parents[1]),
                  "/usr/local/cuda"]
    for c in candidates:
        if c and Path(c, "include", "cuda_runtime.h").is_file():
            return str(Path(c).resolve())
    raise ToolchainError(
        f"cannot find the CUDA toolkit headers for {nvcc_path} (looked in "
        f"{', '.join(c for c in candidates if c)}); set CUDA_HOME"
    )


def cuda_lib_dir(home: str) -> str:
    for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if Path(home, sub, "libcudart_static.a").is_file():
            return str(Path(home, sub))
    raise ToolchainError(f"libcudart_static.a not found under {home}; set CUDA_HOME")


def triton_version() -> str | None:
    """The installed triton's version ("3.6.0"), without importing it; None when absent."""
    import importlib.metadata

    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _triton_location() -> str | None:
    import importlib.util

    found = importlib.util.find_spec("triton")
    return None if found is None or not found.origin else str(Path(found.origin).parent)


def triton() -> Compiler:
    """The triton package as a compiler: path = its package directory, version = its release."""
    where, version = _triton_location(), triton_version()
    if where is None or version is None:
        raise ToolchainError("triton is not installed in this Python "
                             "(pip install 'kiln-kernels[triton]' or pip install triton==3.6.0); "
                             "the triton toolchain needs it to compile, not to load a cached "
                             "module")
    return Compiler(where, version)


def available(name: str) -> bool:
    try:
        if name == "triton":
            triton()
            return True
        host_compiler()
        if name == "cuda":
            nvcc()
        return True
    except ToolchainError:
        return False
