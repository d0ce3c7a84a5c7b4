"""`python -m release build --toolchain triton`: the triton modules of //ops/gemm:grouped
cross-compiled for "8.0 9.0a" with no GPU, packed one bundle per module (launch metadata and every
cubin), verified, installed, and served by the precompiled step with KILN_DISABLE_JIT=1 (loading
goes as far as the verified cubins and their launch metadata: running them needs a GPU)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO
from test_release_build import pip_install, release_build

from kiln.runtime import sources
from release import verify

pytest.importorskip("triton", reason="building triton modules needs triton==3.6.0 (pip install -e '.[test]')")


ENTRIES = ",".join(
    sorted(
        [
            "grouped_mm_kernel",
            "grouped_mm_f32_kernel",
            "grouped_mm_kmajor",
            "grouped_mm_kmajor_m128n128k64_w8s3",
            "grouped_mm_kmajor_m16n128k128_w4s4",
            "grouped_mm_nmajor",
        ]
    )
)


def test_triton_package_is_served_with_the_jit_disabled(tmp_path):
    out = release_build(
        "--toolchain", "triton", "--arch-list", "8.0 9.0a", "//ops/gemm:grouped", out=tmp_path / "dist"
    )
    assert "staged 2 module(s)" in out
    artifact_dir = (
        tmp_path / "dist" / "artifacts" / sources.kiln_version() / "triton-sm80-sm90a" / sources.python_abi()
    )
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    assert manifest["toolchain"] == "triton" and manifest["arch_list"] == "8.0 9.0a"
    assert sorted(e["module"] for e in manifest["modules"]) == [
        "gemm_grouped_dtype_bf16_triton",
        "gemm_grouped_dtype_f16_triton",
    ]
    for e in manifest["modules"]:
        assert e["archs"] == ["8.0", "9.0a"] and e["file"].endswith(".triton.bundle.json")
        assert e["toolchain"]["triton"]["version"] == "3.6.0"
        assert "ops/gemm/grouped_triton.py" in e["portable_parts"]["inputs"]
    m, problems = verify.verify_directory(artifact_dir)
    assert problems == []
    # A bundle whose manifest digest matches but whose cubin does not match its launch metadata
    # (built inconsistent, or edited and re-listed) is reported too.
    e = m.modules[0]
    bundle = json.loads((artifact_dir / e.file).read_bytes())
    name = sorted(bundle["cubins"])[0]
    h = bundle["cubins"][name]
    bundle["cubins"][name] = ("1" if h[0] == "0" else "0") + h[1:]
    (problems,) = verify._bundle_problems(e, json.dumps(bundle).encode())
    assert f"{name} (" in problems and "does not match its recorded size and SHA-256" in problems
    (whl,) = (tmp_path / "dist").glob("kiln_kernels_precompiled_triton-*.whl")
    site, ws = tmp_path / "site", tmp_path / "fresh-ws"
    pip_install(whl, site)
    code = (
        "from kiln.codegen.specs import module_spec\n"
        "from kiln.runtime import jit\n"
        "from kiln.runtime.arch import ArchContext\n"
        "for device in ('9.0', '8.6'):\n"
        "    m = jit.load(module_spec('//ops/gemm:grouped', {'dtype': 'bf16'}, 'triton'),\n"
        "                 ArchContext.current(device))\n"
        "    print(device, type(m).__name__, ','.join(m.entries), len(m.resources()))\n"
        "try:\n"
        "    jit.load(module_spec('//ops/gemm:grouped', {'dtype': 'bf16'}, 'triton'),\n"
        "             ArchContext.current('10.0'))\n"
        "except jit.JITDisabledError as e:\n"
        "    print('10.0 refused', 'none of which runs on 10.0a' in str(e))\n"
        "print(jit.stats.precompiled_hits, jit.stats.compiled)\n"
    )
    env = dict(
        __import__("os").environ,
        PYTHONPATH=f"{site}:{REPO / 'tests'}",
        KILN_WORKSPACE_BASE=str(ws),
        KILN_DISABLE_JIT="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"9.0 TritonModule {ENTRIES} 12",
        f"8.6 TritonModule {ENTRIES} 12",
        "10.0 refused True",
        "2 0",
    ], proc.stdout + proc.stderr
    assert not ws.exists()  # every module came from the package; nothing was written
