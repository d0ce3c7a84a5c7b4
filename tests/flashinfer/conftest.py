"""FlashInfer 0.7's own test cases, re-created against kiln: the judge of "switch with one import".

Each module here re-creates one FlashInfer test file (its docstring names the file): the same
parametrisations, the same calls through FlashInfer's names (``import kiln as flashinfer``) and
FlashInfer's assertions and tolerances unchanged. The code, references included, is kiln's own.

Devices. Every test takes a ``device`` argument and runs on the host backend (``cpu``) and on CUDA
(``cuda``, marked ``gpu``). FlashInfer's sizes run unchanged on CUDA. On the CPU a module shrinks
them by naming, in a module-level ``CPU_CASES`` dict (or a test's ``@pytest.mark.cpu_cases(...)``),
the values each parameter keeps there; the other CPU combinations are deselected, not skipped. A
test marked ``cuda_only`` (CUDA graphs, programmatic dependent launch) is generated for CUDA alone.

Skips. A case is skipped only for what kiln does not claim, through :func:`not_claimed`, whose
reason begins "kiln does not claim" (scripts/flashinfer_compat.py counts them by that reason).
"""

from __future__ import annotations

import pytest

NOT_CLAIMED = "kiln does not claim"


def not_claimed(what: str) -> None:
    """Skip this case: kiln does not offer `what` (a feature of FlashInfer's, named precisely)."""
    pytest.skip(f"{NOT_CLAIMED} {what}")


def pytest_generate_tests(metafunc):
    if "device" not in metafunc.fixturenames:
        return
    params = [pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
    if metafunc.definition.get_closest_marker("cuda_only") is None:
        params.insert(0, pytest.param("cpu", id="cpu"))
    metafunc.parametrize("device", params)


def _cpu_cases(item) -> dict:
    cases = dict(getattr(item.module, "CPU_CASES", {}))
    marker = item.get_closest_marker("cpu_cases")
    if marker is not None:
        cases.update(marker.kwargs)
    return cases


def _kept_on_cpu(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None or callspec.params.get("device") != "cpu":
        return True
    return all(callspec.params[name] in values
               for name, values in _cpu_cases(item).items() if name in callspec.params)


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if _kept_on_cpu(item)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not _kept_on_cpu(item)])
        items[:] = kept
