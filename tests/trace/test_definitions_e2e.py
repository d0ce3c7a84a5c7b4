"""Every committed benchmark definition, end to end: its inputs built from the definition, kiln's
output compared with the template's reference within the template's tolerance. On the CPU
backend at the definitions' small workloads (CI), and at their real workloads on a GPU (-m gpu)."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks import definitions, harness
from benchmarks.routine import SetupContext
from benchmarks.routines import ROUTINES
from benchmarks.selection import select

DEFS = [d for op in ROUTINES for d in definitions.load(op)]


def test_every_routine_has_definitions_and_every_definition_a_routine():
    ops = {p.parent.name for p in definitions.DEFINITIONS_DIR.rglob("*.json")}
    assert ops == set(ROUTINES)


def _check_definition(d, preset: str, device: str):
    r = ROUTINES[d.op]
    cases = select(r, [d], [preset])
    assert cases
    for case in cases:
        for dtype in d.dtypes:
            inputs = r.template.build_inputs(case.axes, dtype, device, seed=7, scalars=case.scalars)
            expected = r.template.run_reference(inputs)
            ctx = SetupContext(torch.device(device), dtype, case.axes)
            check = harness.check_backend(r.template, r.backend("kiln"), inputs, expected, ctx, True)
            assert check["status"] == "passed", f"{d.name} {case.label} {dtype}: {check.get('message')}"


@pytest.mark.parametrize("d", DEFS, ids=lambda d: d.name)
def test_definition_small_workloads_on_cpu(d):
    _check_definition(d, "small", "cpu")


@contextlib.contextmanager
def _one_at_a_time():
    """The real workloads take up to ~60 GB each (inputs, the reference's float32 logits): with
    several pytest-xdist workers on one GPU they run one at a time, and give their memory back."""
    with open(Path(tempfile.gettempdir()) / "kiln-gpu-definitions.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.mark.gpu
@pytest.mark.parametrize("d", DEFS, ids=lambda d: d.name)
def test_definition_workloads_on_gpu(d):
    with _one_at_a_time():
        _check_definition(d, "examples", "cuda")
