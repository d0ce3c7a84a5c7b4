"""Timing a batch of calls, and the statistics every result reports.

Mechanisms (the one used is recorded with every result):
  cupti            CUDA only, when `cupti-python` is importable (the default then): CUPTI
                   activity records of every kernel, memcpy and memset the calls ran; a
                   measurement is the GPU's busy time (union of those intervals) / calls. No
                   launch gaps, no event overhead.
  cuda_events      CUDA events around a batch of calls on the current stream / calls: includes
                   launch gaps when the CPU cannot keep ahead of the GPU (small shapes, eager).
  host_wall_clock  the CPU backend: perf_counter around a batch of (synchronous) calls / calls.
With cuda_graph the batch is captured once as a CUDA graph and each measurement replays it:
many launches per measurement with no Python or launch overhead between them.

Calls cycle through rotating input sets (see harness.py) so consecutive calls touch different
memory; a batch of n calls continues the rotation where the previous one stopped.
"""

from __future__ import annotations

import bisect
import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

TIMERS = ("auto", "cupti", "cuda_events", "host_wall_clock")


@dataclass(frozen=True)
class Settings:
    measurements: int = 50
    target_s: float = 2e-3  # length of one measurement; sets the calls per measurement
    warmup_s: float = 0.025
    timer: str = "auto"
    cuda_graph: bool = False
    max_calls: int = 10_000  # per measurement (and per captured graph)


@dataclass(frozen=True)
class Measurement:
    per_call_s: list[float]  # one value per measurement
    mechanism: str
    cuda_graph: bool
    calls_per_measurement: int
    warmup_calls: int
    fallback: str | None = None  # why the preferred mechanism was not used


def summarize(per_call_s: Sequence[float]) -> dict[str, float]:
    """Median, mean, population std, min and max, in microseconds."""
    if not per_call_s:
        raise ValueError("no measurements to summarise")
    us = [t * 1e6 for t in per_call_s]
    return {"median_us": statistics.median(us), "mean_us": statistics.fmean(us),
            "std_us": statistics.pstdev(us), "min_us": min(us), "max_us": max(us)}


class Rotation:
    """Calls the timed callables of the input sets in turn, continuing across batches."""

    def __init__(self, runs: Sequence[Callable[[], object]]):
        if not runs:
            raise ValueError("nothing to time: no input sets")
        self.runs = list(runs)
        self.next = 0

    def batch(self, n: int) -> None:
        runs, k, i = self.runs, len(self.runs), self.next
        for j in range(n):
            runs[(i + j) % k]()
        self.next = (i + n) % k


def calls_for(target_s: float, per_call_s: float, max_calls: int) -> int:
    return max(1, min(max_calls, math.ceil(target_s / max(per_call_s, 1e-9))))


_cupti_disabled: str | None = None  # set by the first CUPTI failure: the rest of the run uses
# events, so results of one run stay comparable


def _disable_cupti(reason: str) -> str:
    global _cupti_disabled
    _cupti_disabled = reason
    return reason


def cupti_status() -> str | None:
    """None when cupti-python can be used here, else why not. The first call probes CUPTI on a
    tiny kernel, so a broken installation is found before anything is measured with it."""
    global _cupti_disabled
    if _cupti_disabled is None:
        try:
            importlib.import_module("cupti.cupti")
            x = torch.zeros(1, device="cuda")
            _cupti_samples(lambda: x.add_(1), 1, 2, torch.cuda.synchronize)
            _cupti_disabled = ""
        except Exception as e:  # noqa: BLE001 - any failure means "not usable here"
            _cupti_disabled = f"cupti-python not usable ({type(e).__name__}: {e})"
    return _cupti_disabled or None


def measure(runs: Sequence[Callable[[], object]], device: torch.device, s: Settings) -> Measurement:
    if s.timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {s.timer!r}")
    if device.type == "cuda":
        if s.timer == "host_wall_clock":
            raise ValueError("timer host_wall_clock times the CPU backend; on CUDA use auto, cupti "
                             "or cuda_events")
        return _measure_cuda(Rotation(runs), s)
    if s.cuda_graph:
        raise ValueError(f"--cuda-graph needs a CUDA device; this run is on {device.type}")
    if s.timer not in ("auto", "host_wall_clock"):
        raise ValueError(f"timer {s.timer} needs a CUDA device; on {device.type} use host_wall_clock")
    return _measure_host(Rotation(runs), s)


def _warm_up(rot: Rotation, s: Settings, sync: Callable[[], None]) -> int:
    """One call per input set (first-use work: loading modules, allocator growth), then more
    until warmup_s has passed. Returns the number of calls."""
    calls = len(rot.runs)
    rot.batch(calls)
    sync()
    end = time.perf_counter() + s.warmup_s
    while time.perf_counter() < end:
        rot.batch(1)
        sync()
        calls += 1
    return calls


def _measure_host(rot: Rotation, s: Settings) -> Measurement:
    warm = _warm_up(rot, s, lambda: None)
    t0 = time.perf_counter()
    rot.batch(3)
    n = calls_for(s.target_s, (time.perf_counter() - t0) / 3, s.max_calls)
    samples = []
    for _ in range(s.measurements):
        t0 = time.perf_counter_ns()
        rot.batch(n)
        samples.append((time.perf_counter_ns() - t0) * 1e-9 / n)
    return Measurement(samples, "host_wall_clock", False, n, warm)


def _event_seconds(step: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def _measure_cuda(rot: Rotation, s: Settings) -> Measurement:
    warm = _warm_up(rot, s, torch.cuda.synchronize)
    n = calls_for(s.target_s, _event_seconds(lambda: rot.batch(5)) / 5, s.max_calls)
    if s.cuda_graph:
        # Cover every input set at least once per replay, so replays rotate through memory too.
        n = max(n, min(len(rot.runs), s.max_calls))
        step = _capture(rot, n)
    else:
        def step():
            rot.batch(n)

    fallback = None
    if s.timer in ("auto", "cupti"):
        reason = cupti_status()
        if reason is None:
            try:
                return Measurement(_cupti_samples(step, n, s.measurements, torch.cuda.synchronize),
                                   "cupti", s.cuda_graph, n, warm)
            except CuptiUnusable as e:
                reason = _disable_cupti(f"CUPTI failed, CUDA events from here on: {e}")
        if s.timer == "cupti":
            raise RuntimeError(f"--timer cupti: {reason}; install cupti-python (CUDA 13+) or use "
                               "--timer cuda_events")
        fallback = reason
    samples = [_event_seconds(step) / n for _ in range(s.measurements)]
    return Measurement(samples, "cuda_events", s.cuda_graph, n, warm, fallback)


def _capture(rot: Rotation, n: int) -> Callable[[], None]:
    """Capture n rotating calls as one CUDA graph; returns its replay."""
    side = torch.cuda.Stream()  # warm-up on a side stream first, as torch.cuda.graphs advises
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        rot.batch(min(n, 3))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    rot.next = 0
    with torch.cuda.graph(graph):
        rot.batch(n)
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    return graph.replay


class CuptiUnusable(RuntimeError):
    pass


def _busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals: overlapping kernels count once."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _cupti_samples(step: Callable[[], object], n: int, measurements: int,
                   sync: Callable[[], None]) -> list[float]:
    """Per-call GPU busy time for each measurement, from CUPTI activity records. Each measurement
    runs between two CUPTI timestamps and a synchronize, so a record belongs to the measurement
    whose window holds its start (activity timestamps share cupti.get_timestamp()'s clock)."""
    from cupti import cupti

    kinds = (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET)
    wanted = {int(k) for k in kinds}
    records: list[tuple[int, int]] = []

    def requested():
        return 8 * 1024 * 1024, 0  # buffer bytes, records per buffer (0: as many as fit)

    def completed(activities):
        records.extend((a.start, a.end) for a in activities if int(a.kind) in wanted)

    windows = []
    try:
        cupti.activity_register_callbacks(requested, completed)
        for k in kinds:
            cupti.activity_enable(k)
        try:
            for _ in range(measurements):
                t0 = cupti.get_timestamp()
                step()
                sync()
                windows.append((t0, cupti.get_timestamp()))
            cupti.activity_flush_all(1)
        finally:
            for k in kinds:
                cupti.activity_disable(k)
            cupti.finalize()
    except CuptiUnusable:
        raise
    except Exception as e:  # noqa: BLE001 - CUPTI's own errors: fall back to events
        raise CuptiUnusable(f"{type(e).__name__}: {e}") from e
    records.sort()
    starts = [r[0] for r in records]
    samples = []
    for t0, t1 in windows:
        inside = records[bisect.bisect_left(starts, t0):bisect.bisect_right(starts, t1)]
        if len(inside) < n:  # every call launches at least one kernel
            raise CuptiUnusable(f"{len(inside)} activity records in a measurement of {n} calls")
        samples.append(_busy_ns(inside) * 1e-9 / n)
    return samples
