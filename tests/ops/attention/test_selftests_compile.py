"""Compile-only builds of the attention kernels' framework-free self-tests (tests/cuda/), wherever
nvcc is, GPU or not: they are the instruments of the device rounds (scripts/decode_round.sh,
scripts/prefill_round.sh), which build them against this tree and an earlier one, so they must
keep compiling with the kernels' current API. The decode build also holds the kernel to no local
memory at head_dim 64 and 128 (ptxas's report), where a spill inside the tile loop cost it before.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers import REPO

from kiln.runtime import toolchain

pytestmark = pytest.mark.skipif(not toolchain.available("cuda"), reason="needs nvcc")


def _compile(tmp_path, source: str, *archs: str) -> str:
    cmd = [
        toolchain.nvcc().path,
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        *archs,
        "-Xptxas",
        "-v",
        f"-I{REPO}",
        "-c",
        str(REPO / source),
        "-o",
        str(tmp_path / "selftest.o"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr}"
    return done.stderr


def test_the_decode_selftest_compiles_and_its_kernels_do_not_spill(tmp_path):
    # sm_90, the device rounds' build (the module's other archs: tests/runtime/test_cuda_build.py)
    report = _compile(tmp_path, "tests/cuda/decode_selftest.cu", "-gencode=arch=compute_90,code=sm_90")
    props = re.findall(
        r"Function properties for (\S*decode_paged_kernel\S*)\n"
        r"\s*(\d+) bytes stack frame, (\d+) bytes spill stores",
        report,
    )
    # bf16 x {bf16, e4m3} x {64, 128, 256} x soft-cap x {1, 2} head n-tiles
    assert len(props) == 24, report
    small = [p for p in props if re.search(r"Li(64|128)E", p[0])]
    assert len(small) == 16
    spilled = [name for name, stack, spill in small if int(stack) or int(spill)]
    assert not spilled, f"local memory in {spilled}"


def test_the_prefill_sm90_selftest_compiles(tmp_path):
    _compile(tmp_path, "tests/cuda/prefill_sm90_selftest.cu", "-gencode=arch=compute_90a,code=sm_90a")
