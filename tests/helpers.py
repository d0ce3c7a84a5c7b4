"""Test helpers shared across test modules: a toy compile spec with a fast-compiling unit, and
subprocess runners."""

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


def make_toy_sources(root: Path, value: int = 42) -> Path:
    """Write toy.cc and include/toy_value.h under `root`; returns root."""
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "toy.cc").write_text(TOY_UNIT)
    (root / "include" / "toy_value.h").write_text(f"#pragma once\n#define TOY_VALUE {value}\n")
    return root


def toy_spec(root: Path, name: str = "toy_module", flags: tuple[str, ...] = ()) -> CompileSpec:
    src = root / "toy.cc"

    def generate(out_dir: Path) -> None:
        (out_dir / "toy.cc").write_bytes(src.read_bytes())

    return CompileSpec(
        name=name,
        uri=name,
        toolchain="host",
        units=(Unit("toy.cc", "cxx"),),
        inputs=(src,),
        include_dirs=(str(root / "include"),),
        cxx_flags=("-O0", "-fPIC", "-fvisibility=hidden", *flags),
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
