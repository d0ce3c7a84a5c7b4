"""Where kiln's sources are, their portable names, and the Python ABI a module is built for."""

from helpers import REPO, run_python

from kiln.runtime import sources


def test_sysconfig_race_cannot_give_a_wrong_python_abi():
    """Regression: threads planning modules at start-up (python -m codegen build) could read
    EXT_SUFFIX as None from sysconfig's lazily filled tables and key modules for Python ABI 'so'."""
    out = run_python(
        "import threading\n"
        "from kiln.runtime import sources\n"
        "seen = []\n"
        "ts = [threading.Thread(target=lambda: seen.append((sources.python_abi(), "
        "sources.extension_suffix(), sources.python_include_dirs()))) for _ in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(len(set(seen)), seen[0][0])\n")
    assert out.stdout.split() == ["1", sources.python_abi()]
    assert sources.python_abi().startswith("cpython-")


def test_portable_names_are_relative_to_the_source_tree_and_round_trip():
    header = sources.source_root() / "ops" / "norm" / "norm.cuh"
    assert sources.portable_name(header) == "ops/norm/norm.cuh"
    assert sources.portable_path("ops/norm/norm.cuh") == header
    render = sources.package_root() / "codegen" / "render.py"
    assert sources.portable_name(render) == "codegen/render.py"  # in a checkout and in a wheel
    assert sources.portable_name("/usr/include/stdio.h") is None  # the toolchain's, not kiln's


def test_only_kiln_files_have_portable_names():
    """Regression: CI's virtual environment lies inside the checkout, so pybind11's headers were
    named '.venv/lib/.../pybind11.h' in the package's key and no installation matched it."""
    root = sources.source_root()
    assert sources.portable_name(root) == "."  # kiln's include directory
    venv_header = root / ".venv" / "lib" / "python3.11" / "site-packages" / "pybind11" / "x.h"
    assert sources.portable_name(venv_header) is None
    assert sources.portable_name(root / "build" / "lib" / "kiln" / "x.py") is None
    assert sources.portable_name(root / "bindings" / "common" / "dlpack.h") == \
        "bindings/common/dlpack.h"
    assert sources.portable_path("python/kiln/norm.py") is None  # not a kernel source


def test_portable_paths_never_leave_the_tree():
    assert (REPO / "version.txt").is_file()
    for bad in ("../version.txt", "/etc/passwd", "ops/../../x", "", "ops//norm/norm.cuh"):
        assert sources.portable_path(bad) is None, bad
