"""The GEMM autotuner: which tactic (kernel and tile shape, ops/gemm/gemm.h) each GEMM call runs.
kiln.autotune is this module's autotune (as flashinfer.autotune is flashinfer.autotuner's: a
submodule named like the function would shadow it on the package).

    with kiln.autotune(cache="tactics.json"):      # FlashInfer's spelling
        model(inputs)                             # untuned shapes are timed once, then reused
    with kiln.autotune(False, cache="tactics.json"):
        model(inputs)                             # tuned tactics only, nothing timed

Without tuning every call runs the deterministic default heuristic of ops/gemm/gemm_tactics.cc.

Keys. A tuned entry is keyed by (op, shape bucket, dtypes and layout, GPU, compute capability,
CUDA version, kiln version). The bucket rounds the row count (m, or the routed rows of a grouped
GEMM) and the batch up to a power of two and keeps n, k and the number of groups exact: a
model's weights fix n and k, the tokens vary. A tactic tuned at one row count of a bucket serves
every row count below it (a small-M tile of 16 rows runs m <= 16); a call it cannot serve (an
unaligned pointer) runs the default instead.

Timing. Each candidate (every tactic that can run the call, minus the blocklist) is run a few
times to warm up, then timed over `repeats` samples, each sample long enough (>= 50 us, or one
call with cold_l2) for the timer's resolution; the median wins, and the default heuristic's
tactic keeps its place unless another is more than 2 % faster (so two tunings of one shape agree
when two tactics are within noise). Timers: CUDA events on the caller's stream ("cuda_events");
the GPU's %globaltimer read by a one-thread kernel of the gemm module before and after each
sample ("globaltimer", for where events are unreliable: "auto", the default, falls back to it
when events fail or return nonsense; KILN_AUTOTUNE_TIMER picks); the CPU's clock for CPU tensors
(the host backend); or a callable timer(tactic_name, run_once) -> seconds (tests). cold_l2=True
flushes the L2 (writes a buffer of twice its size) before every sample.

Persistence, only to an explicit path: cache= or KILN_AUTOTUNE_CACHE. The file is JSON,
{"format": "kiln-autotune-cache", "version": 1, "entries": {key: entry}}, each entry with its
environment, tactic, median and every candidate's time, timer, repeats and cold_l2. Loading keeps
the entries of this process's environments (the CPU and each visible GPU) and ignores the others
with one log line; saving (when a tuning context exits) merges with what the file holds now under
a lock beside it (<file>.lock, kiln.runtime.lock) and replaces the file atomically, so concurrent
writers never corrupt it and none loses the others' entries. KILN_AUTOTUNE_CACHE also serves its
entries outside any context.

Blocklist. Tactics known to hang or crash on a stack are never timed or run: the package's own
list (kiln/data/tactic_blocklist.json) and KILN_TACTIC_BLOCKLIST=path, in the same format:
{"format": "kiln-tactic-blocklist", "version": 1, "blocked": [{"tactic": "sm90_*_c2", "op": "mm",
"gpu": "*H100*", "cc": "9.0", "cuda": "12.4*", "kiln": "*", "why": "..."}]} (fnmatch patterns;
`tactic` and `why` required, the rest default to "*"). The launchers take the blocked tactics as
a bit mask and never run one: a blocked default falls to the next tactic that can serve the call.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kiln.runtime import env
from kiln.runtime.files import write_atomic
from kiln.runtime.lock import ModuleLock

from .api_logging import logged_api

__all__ = ["autotune"]

log = logging.getLogger("kiln.autotune")

CACHE_FORMAT = "kiln-autotune-cache"
BLOCKLIST_FORMAT = "kiln-tactic-blocklist"
FORMAT_VERSION = 1
SHIPPED_BLOCKLIST = Path(__file__).resolve().parent / "data" / "tactic_blocklist.json"
TIMERS = ("auto", "cuda_events", "globaltimer")
DEFAULT_REPEATS = 25
WARMUP_CALLS = 3
SAMPLE_S = 50e-6  # a sample runs at least this long (unless cold_l2: one call per sample)
KEEP_DEFAULT_MARGIN = 0.02  # another tactic must beat the default by more than this
_ENV_FIELDS = ("gpu", "cc", "cuda", "kiln")

Timer = Callable[[str, Callable[[], object]], float]


class AutotuneError(ValueError):
    """An autotune cache or blocklist file kiln cannot use; the message names the file."""


# --- environments ---------------------------------------------------------------------------------

_environments: dict[torch.device, dict[str, str]] = {}


def _kiln_version() -> str:
    from kiln.runtime.sources import kiln_version

    return kiln_version()


def environment(device: torch.device) -> dict[str, str]:
    """What a tuned entry is valid for: the GPU's name and compute capability, the CUDA version,
    kiln's version; the CPU (host backend) is {"gpu": "cpu", "cc": "host", "cuda": "none"}."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    found = _environments.get(device)
    if found is None:
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            found = {
                "gpu": torch.cuda.get_device_name(device),
                "cc": f"{major}.{minor}",
                "cuda": str(torch.version.cuda),
                "kiln": _kiln_version(),
            }
        else:
            found = {"gpu": "cpu", "cc": "host", "cuda": "none", "kiln": _kiln_version()}
        _environments[device] = found
    return found


def _local_environments() -> list[dict[str, str]]:
    envs = [environment(torch.device("cpu"))]
    if torch.cuda.is_available():
        envs += [environment(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    return envs


def entry_key(op: str, shape: str, environ: dict[str, str]) -> str:
    return "|".join([op, shape, *(environ[f] for f in _ENV_FIELDS)])


def bucket(n: int) -> int:
    """The power of two >= n (0 for 0): the row-count bucket of a key."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


# --- entries and the cache file -----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    op: str
    shape: str
    env: dict[str, str]
    tactic: str
    default: str
    median_us: float
    timings_us: dict[str, float]
    timer: str
    repeats: int
    cold_l2: bool
    tuned_at: str

    @property
    def key(self) -> str:
        return entry_key(self.op, self.shape, self.env)

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        """Strict: every field with its type, nothing else (a malformed entry is skipped)."""
        if not isinstance(data, dict) or set(data) != {f for f in cls.__dataclass_fields__}:
            raise ValueError("not an entry")
        environ = data["env"]
        if (
            not isinstance(environ, dict)
            or set(environ) != set(_ENV_FIELDS)
            or not all(isinstance(v, str) for v in environ.values())
        ):
            raise ValueError("bad env")
        for name in ("op", "shape", "tactic", "default", "timer", "tuned_at"):
            if not isinstance(data[name], str):
                raise ValueError(name)
        if (
            not isinstance(data["timings_us"], dict)
            or not isinstance(data["repeats"], int)
            or not isinstance(data["cold_l2"], bool)
            or not isinstance(data["median_us"], int | float)
        ):
            raise ValueError("bad timing fields")
        return cls(**{**data, "env": dict(environ), "timings_us": dict(data["timings_us"])})


def _read_json(path: Path, fmt: str, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise AutotuneError(f"{path} is not a kiln {what} (invalid JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt or data.get("version") != FORMAT_VERSION:
        raise AutotuneError(
            f'{path} is not a kiln {what}: it needs "format": "{fmt}" and "version": {FORMAT_VERSION}'
        )
    return data


def read_cache(path: Path) -> dict[str, Entry]:
    """Every well-formed entry of a cache file (malformed ones are skipped with one log line)."""
    data = _read_json(path, CACHE_FORMAT, "autotune cache")
    raw = data.get("entries")
    if not isinstance(raw, dict):
        raise AutotuneError(f'{path}: "entries" must be an object')
    out, bad = {}, 0
    for key, value in raw.items():
        try:
            e = Entry.from_json(value)
        except (ValueError, TypeError):
            bad += 1
            continue
        if e.key != key:
            bad += 1
            continue
        out[key] = e
    if bad:
        log.warning("kiln.autotune: %s: skipped %d malformed entr%s", path, bad, "y" if bad == 1 else "ies")
    return out


def save(path: str | os.PathLike, entries) -> None:
    """Merge `entries` into the cache file at `path` (created if missing): under the file's lock,
    read what it holds now, add these (replacing their keys), replace the file atomically."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with ModuleLock(path.with_name(path.name + ".lock"), f"the autotune cache {path}", doing="writing"):
        merged = read_cache(path) if path.exists() else {}
        merged.update({e.key: e for e in entries})
        doc = {
            "format": CACHE_FORMAT,
            "version": FORMAT_VERSION,
            "entries": {k: asdict(e) for k, e in sorted(merged.items())},
        }
        write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o644)


# --- the in-process table ---------------------------------------------------------------------------

_lock = threading.RLock()
_table: dict[str, Entry] = {}
_env_cache_loaded: set[str] = set()
_local = threading.local()  # .stack: the tuning contexts of this thread, innermost last


def load(path: str | os.PathLike) -> int:
    """Add the entries of the cache at `path` that fit this process's environments to the table;
    the others are ignored with one log line. Returns the number added."""
    path = Path(path).expanduser()
    if not path.exists():
        return 0
    entries = read_cache(path)
    local = _local_environments()
    usable = {k: e for k, e in entries.items() if e.env in local}
    other = [e for e in entries.values() if e.env not in local]
    if other:
        seen = sorted({"/".join(e.env[f] for f in _ENV_FIELDS) for e in other})
        log.warning(
            "kiln.autotune: %s: ignored %d of %d entries tuned for another GPU, CUDA or kiln "
            "version (%s); this process: %s",
            path,
            len(other),
            len(entries),
            "; ".join(seen[:3]),
            "; ".join("/".join(e[f] for f in _ENV_FIELDS) for e in local),
        )
    with _lock:
        _table.update(usable)
    return len(usable)


def clear() -> None:
    """Forget every tuned entry and loaded cache of this process (tests)."""
    with _lock:
        _table.clear()
        _env_cache_loaded.clear()
        _masks.clear()
        _blocklists.clear()
        _indices.clear()


def entries() -> dict[str, Entry]:
    with _lock:
        return dict(_table)


@dataclass
class Context:
    """One `with kiln.autotune(...)`: its settings and what it tuned (`tuned`, by key)."""

    tune_mode: bool
    cache: Path | None
    cold_l2: bool
    repeats: int
    timer: str | Timer
    tuned: dict[str, Entry] = field(default_factory=dict)


def _stack() -> list[Context]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@logged_api
@contextlib.contextmanager
def autotune(
    tune_mode: bool = True,
    cache: str | os.PathLike | None = None,
    *,
    cold_l2: bool = False,
    repeats: int = DEFAULT_REPEATS,
    timer: str | Timer | None = None,
):
    """Tune GEMM tactics inside the block (tune_mode=True) or use tuned ones only (False).

    cache: a JSON file (default KILN_AUTOTUNE_CACHE; none: tuned results stay in this process).
    Its entries are loaded on entry; with tune_mode, what the block tuned is merged into it on
    exit. cold_l2: flush the L2 before every timed sample. repeats: timed samples per tactic (the
    median wins). timer: "auto", "cuda_events", "globaltimer" (default KILN_AUTOTUNE_TIMER), or a
    callable timer(tactic_name, run_once) -> seconds. Contexts nest per thread; the innermost
    decides. Yields the Context (its `tuned` entries)."""
    if not isinstance(tune_mode, bool):
        raise TypeError(f"kiln.autotune: tune_mode must be a bool, got {tune_mode!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"kiln.autotune: repeats must be an int >= 1, got {repeats!r}")
    timer = env.get("KILN_AUTOTUNE_TIMER") if timer is None else timer
    if not callable(timer) and timer not in TIMERS:
        raise ValueError(
            f"kiln.autotune: timer must be one of {', '.join(TIMERS)} or a callable, got {timer!r}"
        )
    path = cache if cache is not None else (env.get("KILN_AUTOTUNE_CACHE") or None)
    path = Path(path).expanduser() if path else None
    if path is not None:
        load(path)
    ctx = Context(tune_mode, path, bool(cold_l2), repeats, timer)
    stack = _stack()
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.remove(ctx)
        if tune_mode and path is not None and ctx.tuned:
            save(path, ctx.tuned.values())


# --- the blocklist ----------------------------------------------------------------------------------

_blocklists: dict[tuple[str, int], list[dict[str, str]]] = {}
_masks: dict[tuple, int] = {}
_MATCH_FIELDS = ("tactic", "op", "gpu", "cc", "cuda", "kiln")


def read_blocklist(path: Path) -> list[dict[str, str]]:
    """The entries of a blocklist file, checked: each an object with string `tactic` and `why`
    and optional string patterns op, gpu, cc, cuda, kiln; anything else is an AutotuneError."""
    stamp = path.stat().st_mtime_ns
    found = _blocklists.get((str(path), stamp))
    if found is not None:
        return found
    data = _read_json(path, BLOCKLIST_FORMAT, "tactic blocklist")
    blocked = data.get("blocked")
    if not isinstance(blocked, list):
        raise AutotuneError(f'{path}: "blocked" must be a list')
    out = []
    for i, e in enumerate(blocked):
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("tactic"), str)
            or not isinstance(e.get("why"), str)
            or set(e) - {*_MATCH_FIELDS, "why"}
            or not all(isinstance(v, str) for v in e.values())
        ):
            raise AutotuneError(
                f'{path}: blocked[{i}] must be an object with string fields "tactic" and '
                f'"why" and optional {", ".join(_MATCH_FIELDS[1:])} (fnmatch patterns), '
                f"got {e!r}"
            )
        out.append({f: e.get(f, "*") for f in _MATCH_FIELDS} | {"why": e["why"]})
    _blocklists[(str(path), stamp)] = out
    return out


def blocklist_paths() -> list[Path]:
    paths = [SHIPPED_BLOCKLIST]
    extra = env.get("KILN_TACTIC_BLOCKLIST")
    if extra:
        p = Path(extra).expanduser()
        if not p.is_file():
            raise AutotuneError(f"KILN_TACTIC_BLOCKLIST={extra}: no such file")
        paths.append(p)
    return paths


def blocked_tactics(op: str, names, device: torch.device) -> dict[str, str]:
    """{tactic name: why} of `names` blocked for `op` on `device`'s environment."""
    environ = {**environment(device), "op": op}
    out = {}
    for path in blocklist_paths():
        for e in read_blocklist(path):
            if all(fnmatch.fnmatchcase(environ[f], e[f]) for f in _MATCH_FIELDS[1:]):
                for name in names:
                    if name not in out and fnmatch.fnmatchcase(name, e["tactic"]):
                        out[name] = f"{path}: {e['why']}"
    return out


def blocked_mask(module, op: str, device: torch.device) -> int:
    """The launchers' `blocked` argument: bit i set when tactic i of the module is blocked."""
    key = (id(module), device, env.get("KILN_TACTIC_BLOCKLIST"))
    mask = _masks.get(key)
    if mask is None:
        names = list(module.tactic_names)
        blocked = blocked_tactics(op, names, device)
        mask = sum(1 << i for i, n in enumerate(names) if n in blocked)
        with _lock:
            _masks[key] = mask
    return mask


# --- timers -------------------------------------------------------------------------------------------

_flush_buffers: dict[torch.device, torch.Tensor] = {}
_fell_back: set[torch.device] = set()


def _flusher(device: torch.device) -> Callable[[], None]:
    if device.type != "cuda":
        return lambda: None
    buf = _flush_buffers.get(device)
    if buf is None:
        size = 2 * max(torch.cuda.get_device_properties(device).L2_cache_size, 1 << 20)
        buf = _flush_buffers[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return buf.zero_


def _calls_per_sample(
    run: Callable[[], object], clock: Callable[[Callable[[], object]], float], cold_l2: bool
) -> int:
    if cold_l2:
        return 1
    one = clock(run)
    return max(1, min(1000, math.ceil(SAMPLE_S / max(one, 1e-9))))


def _host_timer(repeats: int) -> Timer:
    def measure(name, run):
        for _ in range(WARMUP_CALLS):
            run()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    return measure


def _event_timer(device: torch.device, repeats: int, cold_l2: bool) -> Timer:
    flush = _flusher(device)

    def clock(run, calls=1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / calls

    def measure(name, run):
        for _ in range(WARMUP_CALLS):
            run()
        torch.cuda.synchronize(device)
        calls = _calls_per_sample(run, clock, cold_l2)
        pairs = []
        for _ in range(repeats):
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                run()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        return statistics.median(s.elapsed_time(e) * 1e-3 / calls for s, e in pairs)

    return measure


def _globaltimer(module, device: torch.device, repeats: int, cold_l2: bool) -> Timer:
    from . import _jit

    flush = _flusher(device)
    stream = _jit.stream_of(device)

    def stamp(ts, i):
        module.timestamp(out=_jit.dl(ts), index=i, stream=stream)

    def clock(run, calls=1):
        ts = torch.zeros(2, dtype=torch.int64, device=device)
        stamp(ts, 0)
        for _ in range(calls):
            run()
        stamp(ts, 1)
        t = ts.tolist()
        return (t[1] - t[0]) * 1e-9 / calls

    def measure(name, run):
        for _ in range(WARMUP_CALLS):
            run()
        calls = _calls_per_sample(run, clock, cold_l2)
        ts = torch.zeros(2 * repeats, dtype=torch.int64, device=device)
        for r in range(repeats):
            flush()
            stamp(ts, 2 * r)
            for _ in range(calls):
                run()
            stamp(ts, 2 * r + 1)
        t = ts.tolist()
        return statistics.median((t[2 * r + 1] - t[2 * r]) * 1e-9 / calls for r in range(repeats))

    return measure


def _timer(ctx: Context, module, device: torch.device) -> tuple[Timer, str]:
    """The timer of a tuning and its name (recorded in the entry)."""
    if callable(ctx.timer):
        return ctx.timer, getattr(ctx.timer, "__name__", type(ctx.timer).__name__)
    if device.type != "cuda":
        return _host_timer(ctx.repeats), "host_clock"
    if ctx.timer == "globaltimer" or (ctx.timer == "auto" and device in _fell_back):
        return _globaltimer(module, device, ctx.repeats, ctx.cold_l2), "globaltimer"
    events = _event_timer(device, ctx.repeats, ctx.cold_l2)
    if ctx.timer == "cuda_events":
        return events, "cuda_events"
    fallback = _globaltimer(module, device, ctx.repeats, ctx.cold_l2)

    def auto(name, run):
        if device not in _fell_back:
            try:
                t = events(name, run)
                if math.isfinite(t) and t > 0:
                    return t
                why = f"they measured {t!r} s"
            except RuntimeError as e:
                why = f"{type(e).__name__}: {e}"
            _fell_back.add(device)
            log.warning(
                "kiln.autotune: CUDA events are unreliable on %s (%s); timing with %%globaltimer", device, why
            )
        return fallback(name, run)

    return auto, "auto"


# --- the call path ---------------------------------------------------------------------------------

_indices: dict[int, dict[str, int]] = {}


def _index_of(module, name: str) -> int:
    names = _indices.get(id(module))
    if names is None:
        names = _indices[id(module)] = {n: i for i, n in enumerate(module.tactic_names)}
    return names.get(name, -1)


def _env_cache() -> str:
    """KILN_AUTOTUNE_CACHE, loaded once per process."""
    path = env.get("KILN_AUTOTUNE_CACHE")
    if path and path not in _env_cache_loaded:
        with _lock:
            if path not in _env_cache_loaded:
                _env_cache_loaded.add(path)
                load(path)
    return path


def untuned(module, op: str, device: torch.device) -> int | None:
    """`launch`'s common path without its callables: the blocked mask when `launch` would run
    the default tactic (no tuning context on this thread, nothing tuned, no KILN_AUTOTUNE_CACHE),
    else None. A launcher whose callables cost more than the check calls this first and, given a
    mask, runs what `launch` would: its default tactic, run(-1, False, mask)."""
    blocked = blocked_mask(module, op, device)
    if getattr(_local, "stack", None) or _table or _env_cache():
        return None
    return blocked


def launch(
    module,
    op: str,
    shape: Callable[[], str],
    device: torch.device,
    run: Callable[[int, bool, int], int],
    candidates: Callable[[], tuple[int, list[int]]],
) -> int:
    """Run one GEMM call: `run(tactic, strict, blocked)` launches (the binding) and returns the
    tactic index it ran; `candidates()` gives (default, every tactic that can run it); `shape()`
    the call's key (bucketed shape, dtypes, layout). The tactic is the tuned one for (op, shape,
    environment) when there is one, else tuned now inside a tune_mode context, else the default;
    never a blocked one."""
    blocked = blocked_mask(module, op, device)
    stack = getattr(_local, "stack", None)
    ctx = stack[-1] if stack else None
    if ctx is None and not _table and not _env_cache():
        return run(-1, False, blocked)  # the common path: nothing tuned, the default heuristic
    shape = shape()
    key = entry_key(op, shape, environment(device))
    entry = _table.get(key)
    if entry is not None:
        index = _index_of(module, entry.tactic)
        if index >= 0:
            return run(index, False, blocked)
    if (
        ctx is not None
        and ctx.tune_mode
        and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    ):
        entry = tune(module, op, shape, device, run, candidates, blocked, ctx)
        if entry is not None:
            return run(_index_of(module, entry.tactic), False, blocked)
    return run(-1, False, blocked)


def tune(
    module, op: str, shape: str, device: torch.device, run, candidates, blocked: int, ctx: Context
) -> Entry | None:
    """Time every candidate that is not blocked; record and return the winner's entry."""
    default, indices = candidates()
    names = list(module.tactic_names)
    todo = [i for i in indices if not (blocked >> i) & 1]
    measure, timer_name = _timer(ctx, module, device)
    times: dict[str, float] = {}
    for i in todo:
        try:
            t = measure(names[i], lambda i=i: run(i, True, blocked))
        except (RuntimeError, ValueError) as e:  # a tactic that fails is not a winner
            log.warning("kiln.autotune: %s %s: tactic %s failed: %s", op, shape, names[i], e)
            continue
        if math.isfinite(t) and t > 0:
            times[names[i]] = t
    if not times:
        return None
    best = min(times, key=lambda n: (times[n], names.index(n)))
    default_name = names[default] if default >= 0 else ""
    if default_name in times and times[default_name] <= times[best] * (1 + KEEP_DEFAULT_MARGIN):
        best = default_name
    entry = Entry(
        op=op,
        shape=shape,
        env=environment(device),
        tactic=best,
        default=default_name,
        median_us=times[best] * 1e6,
        timings_us={n: t * 1e6 for n, t in times.items()},
        timer=timer_name,
        repeats=ctx.repeats,
        cold_l2=ctx.cold_l2,
        tuned_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    with _lock:
        _table[entry.key] = entry
    ctx.tuned[entry.key] = entry
    log.info("kiln.autotune: %s %s: %s (%.1f us; default %s)", op, shape, best, entry.median_us, default_name)
    return entry
