"""kiln.comm's host backend across processes (gloo, torch.multiprocessing spawn): exact results
against torch.distributed.all_reduce for every dtype and sizes from 1 element past max_size (the
fallback), odd sizes, non-contiguous inputs, the same bits on every rank and run, the fused
all-reduce + RMSNorm against all_reduce + kiln.fused_add_rmsnorm, bad inputs, sizes that differ
across ranks, a closed communicator, and a rank that dies mid-collective (the others time out).

Each world size is one spawn running every case (tests/ops/comm/comm_workers.py): spawning and joining
a gloo group costs seconds on a 2-core machine, the cases themselves milliseconds.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as tmp

sys.path.insert(0, str(Path(__file__).parent))
import comm_workers  # noqa: E402

import kiln  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def multicast_off():
    """Children inherit the parent's environment: NVLink multicast stays off in them too."""
    saved = {k: os.environ.get(k) for k in comm_workers.MULTICAST_OFF}
    os.environ.update(comm_workers.MULTICAST_OFF)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module", autouse=True)
def norm_modules_built():
    """Build the RMSNorm host modules the fused cases use once here, not under a rank's timeout."""
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w = (torch.randn(2, 8, dtype=dtype) for _ in range(3))
        kiln.fused_add_rmsnorm(x, r, w[0], 1e-6)


@pytest.mark.parametrize("world", [2, 4])
def test_host_all_reduce_every_case(world, tmp_path):
    tmp.spawn(comm_workers.suite, args=(world, str(tmp_path / "rendezvous")), nprocs=world, join=True)


def test_host_all_reduce_properties(tmp_path):
    """Hypothesis over shapes, dtypes, strides and max_size (the fallback included), at 3 ranks."""
    tmp.spawn(comm_workers.properties, args=(3, str(tmp_path / "rendezvous")), nprocs=3, join=True)


def test_a_rank_that_dies_mid_collective_makes_the_others_time_out(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()  # written at once: the ranks end with os._exit
    world = 3
    procs = [
        ctx.Process(target=comm_workers.dying_rank, args=(r, world, str(tmp_path / "rv"), results))
        for r in range(world)
    ]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert alive == [], f"ranks still running after 60 s (hung): pids {alive}"
    assert time.monotonic() - start < 60
    outcomes = {}
    while not results.empty():
        rank, what = results.get()
        outcomes.setdefault(rank, []).append(what)
    assert sorted(outcomes) == [0, 1], outcomes
    for rank, (first, then) in outcomes.items():
        assert first.startswith("TimeoutError"), first
        assert f"rank {rank} waited 2 s for rank(s) [2] to arrive at all_reduce #2" in first
        assert "this CustomAllReduce is broken" in then
    assert [p.exitcode for p in procs] == [0, 0, 3]


def test_the_api_is_exported_and_needs_an_initialised_group(monkeypatch):
    assert kiln.comm.CustomAllReduce is kiln.CustomAllReduce
    assert kiln.fused_allreduce_add_rmsnorm is kiln.comm.fused_allreduce_add_rmsnorm
    # The benchmark definitions' CPU test may have made a one-rank group in this process.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        kiln.CustomAllReduce(None, "cpu")
