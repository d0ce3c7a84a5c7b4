"""The layers hold at import time, not only file by file: the JIT runtime (kiln.runtime) imports
only the standard library and ninja; the build graph (kiln.codegen) adds jinja2 and
pybind11's include path; neither loads torch nor the public API, and `import kiln` loads nothing
until a public name is used. The device-code layer (ops/) includes no framework header."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, run_python

PACKAGE = REPO / "python" / "kiln"

_PROBE = r"""
import json, pkgutil, importlib, runpy, sys
import kiln.runtime, kiln.codegen
for pkg in (kiln.runtime, kiln.codegen):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
sys.argv = ["kiln-build", "query", "//ops/..."]
try:
    runpy.run_module("kiln.codegen", run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str) -> list[str]:
    return json.loads(run_python(code).stdout.strip().splitlines()[-1])


def test_runtime_and_codegen_import_no_framework_and_no_public_api():
    modules = _loaded(_PROBE)
    assert "torch" not in modules
    kiln_modules = [m for m in modules if m == "kiln" or m.startswith("kiln.")]
    outside = [m for m in kiln_modules
               if m != "kiln" and not m.startswith(("kiln.runtime", "kiln.codegen"))]
    assert outside == [], f"the runtime or codegen imported {outside}"
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {
        "kiln", "__main__", "_distutils_hack"}
    # jinja2/markupsafe: codegen renders; pybind11: its include path for the bindings.
    assert third_party <= {"ninja", "jinja2", "markupsafe", "pybind11"}, third_party


def test_importing_kiln_loads_only_the_package_file():
    modules = _loaded("import json, sys, kiln; print(json.dumps(sorted(sys.modules)))")
    assert "torch" not in modules
    assert [m for m in modules if m.startswith("kiln")] == ["kiln"]


def test_public_names_load_on_first_use():
    out = run_python(
        "import sys, kiln\n"
        "assert 'kiln.norm' not in sys.modules\n"
        "f = kiln.rmsnorm\n"
        "assert 'kiln.norm' in sys.modules and kiln.rmsnorm is f\n"
        "assert 'rmsnorm' in dir(kiln) and set(kiln.__all__) <= set(dir(kiln))\n"
        "assert not {'annotations', 'importlib'} & set(dir(kiln)), dir(kiln)\n"
        "try:\n    kiln.no_such_op\nexcept AttributeError as e:\n    print(e)\n").stdout
    assert "module 'kiln' has no attribute 'no_such_op'" in out


@pytest.mark.skipif(shutil.which("lint-imports") is None and not (
    REPO / ".venv" / "bin" / "lint-imports").exists(), reason="import-linter is not installed")
def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(REPO / ".venv" / "bin" / "lint-imports")
    proc = subprocess.run([exe, "--config", str(REPO / "pyproject.toml")], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


_FRAMEWORK_INCLUDE = re.compile(r'#\s*include\s*[<"](torch/|ATen/|c10/|pybind11/|Python\.h|'
                                r'bindings/|.*dlpack)')


def test_device_code_includes_no_framework_header():
    offending = []
    for path in (REPO / "ops").rglob("*"):
        if path.suffix in (".h", ".cuh", ".cu", ".cc", ".cpp"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _FRAMEWORK_INCLUDE.search(line):
                    offending.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offending == []
