"""`python -m release build` end to end: the host package of //ops:norm as a
wheel that pip installs and that serves kiln.rmsnorm with no compiler and KILN_DISABLE_JIT=1; and
the CUDA package cross-compiled for "8.0 9.0a" without a GPU, its SASS checked with cuobjdump and
its modules found for the devices that arch list covers, and only for those."""

import json
import os
import subprocess
import sys
import zipfile

import pytest
from helpers import REPO

from kiln.runtime import sources
from kiln.runtime.toolchain import available
from release import verify

ABI = sources.python_abi()


def release_build(*args: str, out) -> str:
    proc = subprocess.run([sys.executable, "-m", "release", "build", *args, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def pip_install(wheel, site) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, text=True, timeout=300)


def no_compiler_env(site, ws) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO / "tests")]),
                KILN_WORKSPACE_BASE=str(ws), KILN_DISABLE_JIT="1", CXX="/nonexistent/c++",
                KILN_NVCC="/nonexistent/nvcc")


@pytest.mark.slow
def test_host_package_serves_norm_with_no_compiler(tmp_path):
    out = release_build("--toolchain", "host", "//ops:norm", out=tmp_path / "dist")
    whl = tmp_path / "dist" / f"kiln_kernels_precompiled_host-{sources.kiln_version()}-" \
        f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}" \
        f"{sys.version_info.minor}-linux_x86_64.whl"
    assert f"wheel {whl}" in out
    with zipfile.ZipFile(whl) as z:
        meta = z.read(f"kiln_kernels_precompiled_host-{sources.kiln_version()}.dist-info/METADATA")
    assert f"Version: {sources.kiln_version()}" in meta.decode()
    assert f"Requires-Dist: kiln-kernels=={sources.kiln_version()}" in meta.decode()
    m, problems = verify.verify_wheel(whl)
    assert problems == [] and sorted(e.module for e in m.modules) == [
        "norm_dtype_bf16_host", "norm_dtype_f16_host", "norm_dtype_f32_host"]
    assert all(set(e.sources) >= {"ops/norm/norm_host.h", "ops/common/dtypes.h"} for e in m.modules)

    site, ws = tmp_path / "site", tmp_path / "fresh-ws"
    pip_install(whl, site)
    code = (
        "import torch, kiln\n"
        "from kiln.runtime import jit\n"
        "for dt in (torch.float32, torch.float16, torch.bfloat16):\n"
        "    x, w = torch.randn(5, 300).to(dt), torch.randn(300).to(dt)\n"
        "    xd = x.double()\n"
        "    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()\n"
        "    torch.testing.assert_close(kiln.rmsnorm(x, w).double(), ref, rtol=2e-2, atol=1e-2)\n"
        "print(jit.stats.precompiled_hits, jit.stats.compiled)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=no_compiler_env(site, ws), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "0"]
    assert not ws.exists()  # every module came from the package; nothing was written


@pytest.mark.slow
@pytest.mark.skipif(not available("cuda"), reason="needs nvcc (compile only; no GPU needed)")
def test_cuda_package_cross_compiles_for_the_arch_list(tmp_path):
    release_build("--toolchain", "cuda", "--arch-list", "8.0 9.0a", "//ops:norm",
                  out=tmp_path / "dist")
    artifact_dir = tmp_path / "dist" / "artifacts" / sources.kiln_version() / "sm80-sm90a" / ABI
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    assert manifest["arch_list"] == "8.0 9.0a"
    assert [e["archs"] for e in manifest["modules"]] == [["8.0", "9.0a"]] * 3
    assert all(e["toolchain"]["nvcc"]["version"] for e in manifest["modules"])
    _, problems = verify.verify_directory(artifact_dir, sass=verify.cuobjdump() is not None)
    assert problems == []
    (whl,) = (tmp_path / "dist").glob("kiln_kernels_precompiled_cuda-*.whl")
    site = tmp_path / "site"
    pip_install(whl, site)
    # Which devices does the package serve? Found without loading (no GPU here) and without nvcc.
    code = (
        "from kiln.codegen.specs import module_spec\n"
        "from kiln.runtime import build, precompiled\n"
        "from kiln.runtime.arch import ArchContext, parse_arch_list\n"
        "spec = module_spec('//ops:norm', {'dtype': 'bf16'}, 'cuda')\n"
        "for device in ('8.0', '8.6', '8.9', '9.0', '10.0', '12.0'):\n"
        "    p = build.plan(spec, ArchContext(parse_arch_list(device), 'test'))\n"
        "    found, why = precompiled.find(p)\n"
        "    print(device, 'found' if found else why)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=no_compiler_env(site, tmp_path / "ws"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert {d: rows[d] for d in ("8.0", "8.6", "8.9", "9.0")} == dict.fromkeys(
        ("8.0", "8.6", "8.9", "9.0"), "found")
    for device in ("10.0", "12.0"):
        assert f"has code for [8.0 9.0a], none of which runs on {device}" in rows[device], rows
