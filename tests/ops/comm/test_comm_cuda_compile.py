"""Compile-only build of the all-reduce kernels (ops/comm/comm.cuh: one-shot, two-shot, fused
all-reduce + residual + RMSNorm) and their launchers and IPC helpers (ops/comm/comm_cuda.cu) for
sm_80 and sm_90a, every dtype: they run wherever nvcc is, GPU or not.

The kernels are not a target of the build graph yet (no binding, docs/comm.md), so this compiles
the unit directly with WORKSPACE.py's CUDA flags and KILN_COMM_PROBE, which instantiates the
launchers for float32, float16 and bfloat16 instead of reading a generated spec_config.h.
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import REPO

from kiln.runtime import toolchain

pytestmark = pytest.mark.skipif(not toolchain.available("cuda"), reason="needs nvcc")

ARCHS = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a")


def test_the_comm_kernels_compile_for_sm80_and_sm90a(tmp_path):
    obj = tmp_path / "comm_probe.o"
    cmd = [
        toolchain.nvcc().path,
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "-DKILN_COMM_PROBE",
        "--expt-relaxed-constexpr",
        *ARCHS,
        f"-I{REPO}",
        "-c",
        str(REPO / "ops/comm/comm_cuda.cu"),
        "-o",
        str(obj),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr}"
    # The object holds SASS for both archs and every kernel (one-shot, two-shot: scalar and
    # vector; fused) of every dtype: look for their mangled names in the ELF's symbols.
    data = obj.read_bytes()
    for name in (b"one_shot_kernel", b"two_shot_kernel", b"fused_kernel"):
        assert data.count(name) >= 2, f"{name.decode()} missing from {obj}"
    for arch in (b"sm_80", b"sm_90a"):
        assert arch in data, f"no {arch.decode()} code in {obj}"
