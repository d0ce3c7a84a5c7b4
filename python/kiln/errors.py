"""Index errors found by CUDA kernels, reported without a host synchronisation on the hot path.

Every kernel that reads through an index (page ids, kv_indptr entries, batch indices, positions,
grouped-GEMM segment bounds and weight indices) checks it against the tensor it indexes. An index
out of range never becomes a wild read or write: the kernel skips that work (attention writes NaN
to the outputs it could not compute; append writes nothing for that token; a grouped GEMM writes
no row of that segment) and records the first such error in a per-device record. The record is
raised as `kiln.DeviceIndexError` (an IndexError naming the argument, the bad value and the valid
range):

- by `kiln.check_errors()`, which synchronises with the device (call it where a step ends anyway);
- at a later `plan()` of a decode or prefill wrapper, with no synchronisation: each plan copies
  the record to the host asynchronously and raises what the previous plan's copy found, so an
  error surfaces at most two plans after the call that made it;
- right after the call that made it, with KILN_VALIDATE_INDICES=1 (a synchronisation per call: for
  diagnosis).

The host (CPU) backend checks the same indices before it touches anything and raises IndexError at
once.
"""

from __future__ import annotations

import threading

import torch

from kiln.runtime import env

from . import _persistent
from .api_logging import logged_api

__all__ = ["DeviceIndexError", "check_errors"]

RECORD_WORDS = 4  # code, position, value, bound (ops/common/device_error.h)


class DeviceIndexError(IndexError):
    """A CUDA kernel found an index out of range (and skipped the work it would have done)."""


_records: dict[torch.device, torch.Tensor] = {}
_addresses: dict[torch.device, int] = {}  # record_address's answers, by the device it was asked for
_lock = threading.Lock()
_texts: dict[int, str] = {}


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def record_address(device: torch.device) -> int:
    """The device address of `device`'s error record, for the bindings (0 on the CPU: the host
    backend raises instead). Allocated zeroed on first use, outside the pool of a CUDA graph being
    warmed up (kiln's first call may be in one: kiln/_persistent.py); fixed afterwards (CUDA
    graphs)."""
    address = _addresses.get(device)  # every launch asks: one lookup once the record exists
    if address is not None:
        return address
    if device.type != "cuda":
        return 0
    key = device
    record = _records.get(device)
    if record is None:
        device = _device(device)
        record = _records.get(device)
        if record is None:  # not under _lock: the worker may be running a build that takes it
            made = _persistent.outside_graph_pools(device, torch.zeros, RECORD_WORDS, dtype=torch.int64,
                                                   device=device)
            with _lock:
                record = _records.setdefault(device, made)
    address = _addresses[key] = record.data_ptr()  # the record never moves (kept in _records)
    return address


def learn_texts(module) -> None:
    """Keep the messages a module exports: its family's codes (ops/common/device_error.h), which
    no other family's share, so the tables of every loaded module merge into one."""
    texts = getattr(module, "error_texts", None)
    if texts:
        _texts.update({int(k): str(v) for k, v in texts.items()})


def message(code: int, position: int, value: int, bound: int) -> str:
    text = _texts.get(code, f"index error {code} at position {{position}}: {{value}} outside [0, {{bound}})")
    return text.format(position=position, value=value, bound=bound)


def _raise_if_set(values: list[int], record: torch.Tensor, device: torch.device) -> None:
    code, position, value, bound = values
    if code:
        record.zero_()  # reported once
        raise DeviceIndexError(f"kiln ({device}): {message(code, position, value, bound)}. A kernel "
                               "skipped the work of that index (its outputs are NaN or unwritten).")


@logged_api
def check_errors(device=None) -> None:
    """Raise DeviceIndexError for the first index error a kernel recorded on `device` (every CUDA
    device kiln has run on, when None) since the last check. Synchronises with the device."""
    devices = [_device(device)] if device is not None else list(_records)
    for dev in devices:
        record = _records.get(dev)
        if record is not None:
            _raise_if_set(record.tolist(), record, dev)


class _Poll:
    """The asynchronous copy of one device's record that plan() checks."""

    def __init__(self, device: torch.device):
        self.host = torch.zeros(RECORD_WORDS, dtype=torch.int64).pin_memory()
        self.done: torch.cuda.Event | None = None


_polls: dict[torch.device, _Poll] = {}


def poll(device: torch.device) -> None:
    """At plan(): raise what the previous poll's copy found, if it has landed, then copy the record
    again. Never waits for the device."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return
    device = _device(device)
    record = _records.get(device)
    if record is None:
        return
    state = _polls.get(device) or _polls.setdefault(device, _Poll(device))
    if state.done is not None and state.done.query():
        found = state.host.tolist()
        state.done = None
        if found[0]:
            state.host.zero_()
            _raise_if_set(found, record, device)
    if state.done is None:
        state.host.copy_(record, non_blocking=True)
        state.done = torch.cuda.Event()
        state.done.record()


def after_launch(device: torch.device) -> None:
    """KILN_VALIDATE_INDICES=1: check the call that just ran (a synchronisation)."""
    if device.type == "cuda" and env.get("KILN_VALIDATE_INDICES"):
        check_errors(device)
