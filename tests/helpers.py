"""Test helpers shared across test modules: a toy compile spec with a fast-compiling unit (and an
optional second unit that does not read the toy's header), a "planted" library whose constructor
leaves a marker file (code that must never run), and subprocess runners."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kiln.runtime.spec import CompileSpec, Unit

REPO = Path(__file__).resolve().parents[1]

TOY_UNIT = textwrap.dedent(
    """\
    // A Python extension with no pybind11: compiles in well under a second.
    #include <Python.h>
    #include "toy_value.h"
    #define KILN_STR2(x) #x
    #define KILN_STR(x) KILN_STR2(x)
    #define KILN_CAT2(a, b) a##b
    #define KILN_CAT(a, b) KILN_CAT2(a, b)
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(TOY_VALUE); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the value"},
                                    {nullptr, nullptr, 0, nullptr}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, KILN_STR(KILN_MODULE_NAME), nullptr, -1, methods};
    PyMODINIT_FUNC KILN_CAT(PyInit_, KILN_MODULE_NAME)(void) { return PyModule_Create(&def); }
    """
)


# The second unit of a two-unit toy: it reads no toy header, so a header edit leaves it alone.
EXTRA_UNIT = "int kiln_toy_extra() { return 1; }\n"


def make_toy_sources(root: Path, value: int = 42) -> Path:
    """Write toy.cc, extra.cc and include/toy_value.h under `root`; returns root."""
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "toy.cc").write_text(TOY_UNIT)
    (root / "extra.cc").write_text(EXTRA_UNIT)
    (root / "include" / "toy_value.h").write_text(f"#pragma once\n#define TOY_VALUE {value}\n")
    return root


def toy_spec(root: Path, name: str = "toy_module", flags: tuple[str, ...] = (),
             units: tuple[str, ...] = ("toy.cc",), ldflags: tuple[str, ...] = ()) -> CompileSpec:
    """The toy module (answer() returns TOY_VALUE); units=("toy.cc", "extra.cc") for two units."""
    srcs = [root / u for u in units]

    def generate(out_dir: Path) -> None:  # like codegen's render: write only what changed
        for src in srcs:
            dest, data = out_dir / src.name, src.read_bytes()
            if not dest.is_file() or dest.read_bytes() != data:
                dest.write_bytes(data)

    return CompileSpec(
        name=name,
        uri=name,
        toolchain="host",
        units=tuple(Unit(u, "cxx") for u in units),
        inputs=tuple(srcs),
        include_dirs=(str(root / "include"),),
        cxx_flags=("-O0", "-fPIC", "-fvisibility=hidden", *flags),
        ldflags=ldflags,
        label="//tests:toy",
        generate=generate,
    )


def run_python(code: str, env: dict | None = None, timeout: float = 300, check: bool = True,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (the tests' environment plus `env`)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "tests"), *filter(None, [full_env.get("PYTHONPATH")])])
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def device_params():
    """['cpu', 'cuda' (marked gpu)]: every op test runs on the host backend, and on CUDA where a
    device is present."""
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


PLANTED_UNIT = textwrap.dedent(
    """\
    // Planted: a valid extension of the toy's name whose constructor leaves a marker file. A test
    // that plants it asserts the marker never appears: kiln must never load or link it.
    #include <Python.h>
    #include <stdio.h>
    __attribute__((constructor)) static void planted() {
      FILE* f = fopen(MARKER, "w");
      if (f) fclose(f);
    }
    #ifndef NO_MODULE
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, MODULE, nullptr, -1, nullptr};
    extern "C" __attribute__((visibility("default"))) PyObject* INIT(void) {
      return PyModule_Create(&def);
    }
    #endif
    """
)


def build_planted(out: Path, marker: Path, module: str = "toy_module",
                  kind: str = "library") -> Path:
    """Compile the planted code into `out`: a shared library (kind "library") or an object file
    ("object", no module init: an extra unit that would be linked in)."""
    import sysconfig

    src = out.with_suffix(".planted.cc")
    src.write_text(PLANTED_UNIT)
    defines = [f'-DMARKER="{marker}"', f'-DMODULE="{module}"', f"-DINIT=PyInit_{module}"]
    cmd = ["c++", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}", *defines]
    cmd += ["-shared", "-o", str(out), str(src)] if kind == "library" else \
           ["-DNO_MODULE", "-c", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


POKE_UNIT = textwrap.dedent(
    """\
    // A toy with a planted out-of-bounds write: poke(i) stores to element i of an 8-int heap
    // array, so poke(8) writes one past its end (what AddressSanitizer must report).
    #include <Python.h>
    #define KILN_STR2(x) #x
    #define KILN_STR(x) KILN_STR2(x)
    #define KILN_CAT2(a, b) a##b
    #define KILN_CAT(a, b) KILN_CAT2(a, b)
    static PyObject* poke(PyObject*, PyObject* arg) {
      long i = PyLong_AsLong(arg);
      int* volatile b = new int[8]();
      b[i] = 1;
      long v = b[0];
      delete[] b;
      return PyLong_FromLong(v);
    }
    static PyMethodDef methods[] = {{"poke", poke, METH_O, "write element i of 8"},
                                    {nullptr, nullptr, 0, nullptr}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, KILN_STR(KILN_MODULE_NAME), nullptr, -1, methods};
    PyMODINIT_FUNC KILN_CAT(PyInit_, KILN_MODULE_NAME)(void) { return PyModule_Create(&def); }
    """
)


def make_poke_source(root: Path) -> Path:
    """Write poke.cc (the toy with an out-of-bounds write) under `root`; toy_spec(root,
    units=("poke.cc",)) builds it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "poke.cc").write_text(POKE_UNIT)
    return root


def _compiler_file(name: str) -> str | None:
    try:
        out = subprocess.run(["c++", f"-print-file-name={name}"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except OSError:
        return None
    return out if os.path.isabs(out) and os.path.exists(out) else None


def asan_runtime() -> str | None:
    """The host compiler's shared AddressSanitizer runtime, or None without one."""
    return _compiler_file("libasan.so")


def asan_env() -> dict[str, str]:
    """The environment a Python child needs to load KILN_JIT_ASAN=1 modules: the ASan runtime
    preloaded, and libstdc++ right after it (python itself does not link it, and ASan's
    __cxa_throw interceptor must find the real one at start-up, or the first C++ exception a
    binding throws aborts the process)."""
    preload = [asan_runtime(), _compiler_file("libstdc++.so"), os.environ.get("LD_PRELOAD")]
    return {"LD_PRELOAD": " ".join(filter(None, preload)), "ASAN_OPTIONS": "detect_leaks=0"}


def run_asan_python(code: str, env: dict | None = None, timeout: float = 600,
                    check: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with the ASan runtime preloaded (what loading a
    KILN_JIT_ASAN=1 module needs, asan_env()), ASAN_OPTIONS=detect_leaks=0 (CPython's own
    allocations would all be reported at exit). An
    ASan report makes the child exit non-zero with "AddressSanitizer" in its stderr."""
    if asan_runtime() is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime (libasan.so)")
    return run_python(code, env={**asan_env(), **(env or {})}, timeout=timeout, check=check)


def device_error_code(family: str, n: int) -> int:
    """ops/common/device_error.h's error_code(family, n): FNV-1a of the family's name, 15 bits, in
    bits 16..30, then n."""
    h = 2166136261
    for byte in family.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return ((h & 0x7FFF) << 16) | n
