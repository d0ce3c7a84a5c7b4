"""kiln.comm on one GPU (marked gpu; the single-H200 round runs them, scripts/comm_round.sh):

- the kernels' self-test (tests/cuda/comm_selftest.cu): one-shot, two-shot and the fused
  all-reduce + RMSNorm with 2 and 4 ranks' buffers on this GPU, bit-exact against the host sum in
  rank order; a barrier whose peer never comes returns an error code; two processes exchanging
  cudaIpc handles run both algorithms through the mapped buffers.
- CustomAllReduce with two ranks on this GPU (gloo for the group and the IPC-handle exchange; NCCL
  refuses two ranks on one device): the kernels through the mapped buffers, the fallback above
  max_size, the fused kernel, CUDA-graph replays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as tmp
from helpers import REPO

sys.path.insert(0, str(Path(__file__).parent))
import comm_workers  # noqa: E402

from kiln.runtime import toolchain  # noqa: E402

pytestmark = pytest.mark.gpu


def _gencode() -> str:
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major == 9 else "")
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def test_the_kernel_selftest_passes_on_this_gpu(tmp_path):
    exe = tmp_path / "comm_selftest"
    build = [
        toolchain.nvcc().path,
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        "-DKILN_COMM_PROBE",
        _gencode(),
        f"-I{REPO}",
        str(REPO / "tests/cuda/comm_selftest.cu"),
        "-o",
        str(exe),
    ]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(build)}\n{done.stderr}"
    env = {**os.environ, **comm_workers.MULTICAST_OFF}
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ALL PASSED" in run.stdout
    assert "PASS two processes on one GPU through cudaIpc handles" in run.stdout


def test_two_ranks_on_one_gpu_through_cuda_ipc(tmp_path):
    os.environ.update(comm_workers.MULTICAST_OFF)
    tmp.spawn(
        comm_workers.cuda_two_ranks_one_gpu, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True
    )
