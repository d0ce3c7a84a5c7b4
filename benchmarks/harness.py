"""One benchmark run: for every case (a workload of a routine) and every backend, check the
backend's outputs against the trace template's reference, then time it; one record each.

Per case:
  1. inputs from the template (seeded by routine and shape), the reference outputs from them;
  2. rotating input sets: copies of the inputs, enough that together they exceed the device's
     last-level cache three times over (capped), so each call reads from memory, not cache;
  3. per backend: unavailable here -> an `unavailable` record; else setup + one call on a fresh
     copy of the inputs, compared with the reference within the template's tolerance for the
     dtype. A backend that raises or misses is recorded `failed`, with the reason, and is not
     timed. Otherwise it is set up once per input set and timed (timing.py).
"""

from __future__ import annotations

import math
import shlex
import sys
import traceback
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kiln.trace import TraceTemplate, dtype_name
from kiln.trace.template import SHORT_DTYPE

from . import ceilings as ceilings_mod
from . import environment, timing
from .results import SCHEMA
from .routine import Backend, SetupContext
from .selection import Case

COLD_CACHE_FACTOR = 3  # rotating sets together exceed the last-level cache this many times
MAX_SETS = {"cuda": 4096, "cpu": 16}


@dataclass(frozen=True)
class Options:
    device: torch.device
    dtype: str  # torch dtype name
    backends: tuple[str, ...] | None = None  # None: every backend of the routine
    settings: timing.Settings = timing.Settings()
    measure_ceilings: bool = True
    verbose: bool = False


def clone_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def as_outputs(t: TraceTemplate, value: Any) -> dict[str, torch.Tensor]:
    """A backend's return value as {output name: tensor}."""
    names = list(t.outputs)
    if isinstance(value, torch.Tensor):
        value = (value,)
    if isinstance(value, Mapping):
        out = dict(value)
    elif isinstance(value, tuple | list) and len(value) == len(names):
        out = dict(zip(names, value, strict=True))
    else:
        raise TypeError(f"the backend returned {type(value).__name__}; return the outputs {names} "
                        "(a tensor, a tuple in that order, or a dict by name)")
    if set(out) != set(names):
        raise TypeError(f"the backend returned outputs {sorted(out)}, the template has {names}")
    return out


def compare(t: TraceTemplate, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
            dtype: str) -> dict[str, Any]:
    """{'status': 'passed'|'failed', rtol, atol, max_abs_err, message}: |got - ref| <= atol +
    rtol * |ref| elementwise in float64, and no non-finite value where the reference is finite."""
    rtol, atol = t.tolerance[dtype]
    result: dict[str, Any] = {"status": "passed", "rtol": rtol, "atol": atol, "max_abs_err": 0.0}
    for name in t.outputs:
        g, e = got[name], expected[name]
        if tuple(g.shape) != tuple(e.shape):
            return {**result, "status": "failed",
                    "message": f"output {name!r} has shape {tuple(g.shape)}, the reference {tuple(e.shape)}"}
        gd, ed = g.detach().double(), e.detach().to(device=g.device, dtype=torch.float64)
        unwritten = ~gd.isfinite() & ed.isfinite()
        if unwritten.any():
            return {**result, "status": "failed",
                    "message": f"output {name!r}: {int(unwritten.sum())} of {gd.numel()} elements are "
                               "NaN/Inf where the reference is finite (unwritten or overflowed)"}
        err = (gd - ed).abs().nan_to_num(0.0)
        result["max_abs_err"] = max(result["max_abs_err"], float(err.max()) if err.numel() else 0.0)
        bad = err > atol + rtol * ed.abs()
        if bad.any():
            i = int(bad.flatten().nonzero()[0])
            idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), tuple(gd.shape)))
            return {**result, "status": "failed",
                    "message": f"output {name!r}: {int(bad.sum())} of {gd.numel()} elements outside "
                               f"rtol={rtol}, atol={atol}; first at {idx}: got "
                               f"{gd.flatten()[i].item():.6g}, reference {ed.flatten()[i].item():.6g}"}
    return result


def check_backend(t: TraceTemplate, b: Backend, inputs: Mapping[str, Any],
                  expected: Mapping[str, torch.Tensor], ctx: SetupContext,
                  verbose: bool = False) -> dict[str, Any]:
    """Set up `b` on a copy of `inputs`, call it once and compare with `expected` (compare());
    an exception is a failed check whose message names it."""
    try:
        run = b.setup(clone_inputs(inputs), ctx)
        got = as_outputs(t, run())
        _sync(ctx.device)
        return compare(t, got, expected, ctx.dtype)
    except Exception as e:  # noqa: BLE001 - a backend's failure is a result, not a crash
        if verbose:
            traceback.print_exc(file=sys.stderr)
        return {"status": "failed", "message": f"raised {_error_text(e)}"}


def rotating_sets(bytes_per_call: int, cache_bytes: int, cap: int) -> int:
    return max(1, min(cap, math.ceil(COLD_CACHE_FACTOR * cache_bytes / max(bytes_per_call, 1))))


def short_dtype(dtype: str) -> str:
    return {v: k for k, v in SHORT_DTYPE.items()}.get(dtype, dtype)


def repro(case: Case, backend: str, o: Options) -> str:
    parts = ["python -m benchmarks run", case.routine.name, "--backends", backend, "--dtype",
             short_dtype(o.dtype), "--device", o.device.type, "--shapes", shlex.quote(case.selector)]
    if o.settings.cuda_graph:
        parts.append("--cuda-graph")
    if o.settings.timer != "auto":
        parts += ["--timer", o.settings.timer]
    return " ".join(parts)


def _seed(case: Case) -> int:
    return zlib.crc32(f"{case.routine.name}:{case.label}".encode())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()


class Runner:
    """Runs cases and hands each record to `emit`."""

    def __init__(self, options: Options, emit: Callable[[dict[str, Any]], None]):
        self.o = options
        self.emit = emit
        self.device_info = environment.device_info(options.device)
        self.ceilings = ceilings_mod.measure(options.device) if options.measure_ceilings else None

    def _base(self, case: Case, backend: str) -> dict[str, Any]:
        r = case.routine
        return {
            "schema": SCHEMA, "routine": r.name,
            "definition": case.definition.name if case.definition else None,
            "api": f"kiln.{r.api.__qualname__}", "backend": backend,
            "backend_version": r.backend(backend).version() or None,
            "status": None, "error": None, "axes": dict(case.axes), "scalars": dict(case.scalars),
            "dtype": self.o.dtype, "device": self.device_info, "software": environment.software(),
            "repro": repro(case, backend, self.o), "timestamp": environment.now(),
        }

    def run_case(self, case: Case) -> list[dict[str, Any]]:
        o, r = self.o, case.routine
        t = r.template
        dtype = dtype_name(o.dtype)
        names = o.backends or tuple(b.name for b in r.backends)
        nbytes = r.counted_bytes(case.axes, dtype)
        flops = r.counted_flops(case.axes, dtype)
        cache = int(self.device_info.get("cache_bytes") or 0)
        cap = min(r.max_sets or MAX_SETS[o.device.type], MAX_SETS[o.device.type])
        k = rotating_sets(nbytes, cache, cap)
        try:
            base = t.build_inputs(case.axes, dtype, o.device, _seed(case), case.scalars)
            expected = t.run_reference(base)
            # `base` stays pristine for every backend's check; in-place APIs mutate the timed sets.
            sets = [clone_inputs(base) for _ in range(k)]
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: this case fails, the run goes on
            if o.verbose:
                traceback.print_exc(file=sys.stderr)
            records = []
            for name in names:
                rec = {**self._base(case, name), "status": "failed",
                       "error": f"making the inputs or the reference raised {_error_text(e)}"}
                records.append(rec)
                self.emit(rec)
            return records
        layout = {"rotating_sets": k, "set_bytes": nbytes, "cache_bytes": cache,
                  "cold_cache": k * nbytes > cache}
        records = []
        for name in names:
            rec = self._base(case, name)
            rec["timing"] = {"mechanism": None, "cuda_graph": o.settings.cuda_graph, **layout}
            rec.update(self._check_and_time(case, name, base, sets, expected, nbytes, flops, rec["timing"]))
            records.append(rec)
            self.emit(rec)
        del sets, base, expected
        if o.device.type == "cuda":
            torch.cuda.empty_cache()
        return records

    def _check_and_time(self, case, name, base, sets, expected, nbytes, flops, timing_rec) -> dict[str, Any]:
        o, r = self.o, case.routine
        t, b = r.template, r.backend(name)
        why = b.available(o.device, o.dtype)
        if why:
            return {"status": "unavailable", "error": why}
        ctx = SetupContext(o.device, o.dtype, case.axes)
        check = check_backend(t, b, base, expected, ctx, o.verbose)
        if check["status"] != "passed":
            return {"status": "failed", "error": f"reference check: {check['message']}", "check": check}
        try:
            runs = [b.setup(s, ctx) for s in sets]
            m = timing.measure(runs, o.device, o.settings)
        except Exception as e:  # noqa: BLE001
            if o.verbose:
                traceback.print_exc(file=sys.stderr)
            return {"status": "failed", "error": f"timing raised {_error_text(e)}", "check": check}
        timing_rec.update({"mechanism": m.mechanism, "measurements": len(m.per_call_s),
                           "calls_per_measurement": m.calls_per_measurement,
                           "warmup_calls": m.warmup_calls, "fallback": m.fallback})
        out: dict[str, Any] = {"status": "ok", "check": check, **timing.summarize(m.per_call_s)}
        seconds = out["median_us"] * 1e-6
        out.update({"bytes_per_call": nbytes, "flops_per_call": flops,
                    "gbps": nbytes / seconds / 1e9,
                    "tflops": flops / seconds / 1e12 if flops is not None else None,
                    "ceilings": self.ceilings})
        if self.ceilings:
            out["fraction_of_copy_bandwidth"] = out["gbps"] / self.ceilings["copy_gbps"]
            out["fraction_of_gemm_rate"] = (out["tflops"] / self.ceilings["gemm_tflops"]
                                            if out["tflops"] is not None else None)
        return out
