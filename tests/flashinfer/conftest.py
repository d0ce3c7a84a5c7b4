"""FlashInfer 0.7's own test cases, re-created against kiln: the judge of "switch with one import".

Each module here re-creates one FlashInfer test file (its docstring names the file): the same
parametrisations, the same calls through FlashInfer's names (``import kiln as flashinfer``) and
FlashInfer's assertions and tolerances unchanged. The code, references included, is kiln's own.

Devices. Every test takes a ``device`` argument and runs on the host backend (``cpu``) and on CUDA
(``cuda``, marked ``gpu``; deselected where no CUDA device is). FlashInfer's sizes run unchanged
on CUDA. On the CPU a module shrinks
them by naming, in a module-level ``CPU_CASES`` dict (or a test's ``@pytest.mark.cpu_cases(...)``),
the values each parameter keeps there; the other CPU combinations are deselected, not skipped. A
test marked ``cuda_only`` (CUDA graphs, programmatic dependent launch) is generated for CUDA alone.

Skips. A case is skipped only for what kiln does not claim, through :func:`not_claimed`, whose
reason begins "kiln does not claim" (scripts/flashinfer_compat.py counts them by that reason).

GPU memory. FlashInfer's largest cases take 8-32 GB each and the device round runs them in many
pytest-xdist workers on one GPU. Each CUDA case gives its cached blocks back when it ends (a
worker's caching allocator would otherwise keep its largest case's memory for the rest of the
run), and a case that runs out of device memory beside the others runs once more alone: it waits
until the cases running in other workers finish, and holds new ones back until it is done. A case
that runs out of memory alone fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import tempfile

import pytest

NOT_CLAIMED = "kiln does not claim"


FLASHINFER_SKIP = "FlashInfer's own test skips"


def not_claimed(what: str) -> None:
    """Skip this case: kiln does not offer `what` (a feature of FlashInfer's, named precisely)."""
    pytest.skip(f"{NOT_CLAIMED} {what}")


def flashinfer_skips(why: str) -> None:
    """Skip this case as FlashInfer's own test does (a combination it does not test), saying so."""
    pytest.skip(f"{FLASHINFER_SKIP} {why}")


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


def _kept(item, cuda: bool) -> bool:
    callspec = getattr(item, "callspec", None)
    device = callspec.params.get("device") if callspec is not None else None
    if device == "cuda":
        return cuda
    if device != "cpu":
        return True
    return all(callspec.params[name] in values
               for name, values in _cpu_cases(item).items() if name in callspec.params)


def pytest_collection_modifyitems(config, items):
    # Without a CUDA device FlashInfer's tens of thousands of CUDA cases are deselected rather than
    # each reported as a skip (tests/conftest.py skips the gpu-marked tests of the other folders).
    from kiln import utils

    cuda = utils.cuda_available()
    kept = [item for item in items if _kept(item, cuda)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not _kept(item, cuda)])
        items[:] = kept


# Readers-writer lock over every worker's CUDA cases (flock on two files, shared by the workers of
# one machine): a case holds `_DATA` shared while it runs; a retry takes `_GATE` and then `_DATA`
# exclusively. Readers hold `_GATE` only for a moment, so a waiting retry is not starved.
_LOCKS = os.path.join(tempfile.gettempdir(), f"kiln-flashinfer-gpu-{os.getuid()}")


@contextlib.contextmanager
def _flock(name: str, mode: int):
    with open(f"{_LOCKS}.{name}", "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _alongside_others():
    with _flock("gate", fcntl.LOCK_EX):
        lock = open(f"{_LOCKS}.data", "a")
        fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@contextlib.contextmanager
def _alone():
    with _flock("gate", fcntl.LOCK_EX), _flock("data", fcntl.LOCK_EX):
        yield


def _out_of_memory(exc: BaseException | None) -> bool:
    import torch

    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError) or "CUBLAS_STATUS_ALLOC_FAILED" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _release_cuda_memory() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    callspec = getattr(pyfuncitem, "callspec", None)
    if callspec is None or callspec.params.get("device") != "cuda":
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    retry = False
    with _alongside_others():
        try:
            pyfuncitem.obj(**kwargs)
        except Exception as exc:  # noqa: BLE001 - only running out of memory is retried
            if not _out_of_memory(exc):
                raise
            retry = True
            del exc  # its traceback holds the frames, and they the tensors
        finally:
            _release_cuda_memory()
    if retry:
        with _alone():
            try:
                pyfuncitem.obj(**kwargs)
            finally:
                _release_cuda_memory()
    return True
