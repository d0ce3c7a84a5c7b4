"""One logged call: the wrapper `logged_api` returns when diagnostics are on.

Order of events for a call, each record written (and flushed) before the next step:

    level >= 1   "[kiln <time> pid N] #seq <api>"             before anything runs
    level >= 3   every argument: tensors by metadata          (only APIs the filters select)
    level >= 5   and their statistics                         (skipped during CUDA graph capture)
    KILN_DUMP    the input tensors and call.json              (selected APIs; not during capture)
    level >= 3   "module: <name> (<label>, backend, key)"     when the call gets its module,
                                                              i.e. before its kernel runs
                 -- the call runs --
    level >= 3   the outputs (mutated arguments, result)      with statistics at level 5
    KILN_DUMP    the outputs, and the record completed
    level >= 1   on an exception: "... raised <type>: <message>" (the record says "raised")

A logged API called by another one (single_decode_with_kv_cache runs a decode wrapper's `run`)
is logged "(inside #<outer>)" but not dumped: the outer call's dump replays both.

Calls traced by torch.compile are not logged here (the wrapper would be traced into the graph); the
custom op the compiled graph calls at run time is logged instead, under its own name.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time

import torch

from . import describe, dump, force, hooks, provenance
from .settings import Settings
from .sink import Sink, sink_for

_seq = itertools.count(1)
_local = threading.local()  # .call: the logged call running on this thread, for the module observer
_force_announced = threading.Event()


def wrap(entry, settings: Settings):
    """The logging wrapper of `entry.fn` (a registry.ApiEntry) under `settings`."""
    sink = sink_for(settings.dest)
    dumper = dump.dumper_for(settings, sink) if settings.dump else None
    selected = settings.selected(entry.name)
    _install_module_observer()
    fn = entry.fn

    @functools.wraps(fn)
    def logged(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        return Call(entry, settings, sink, dumper if selected else None,
                    selected and settings.level >= 3).run(args, kwargs)

    return logged


def _install_module_observer() -> None:
    hooks.module_observer = _observe_module


def _observe_module(label, params, device, module) -> None:
    call = getattr(_local, "call", None)
    innermost = True
    while call is not None:  # every enclosing call's record names the module
        call.observe_module(device, module, log=innermost)
        call, innermost = call.parent, False


def _first_device(named) -> torch.device | None:
    for name, v in named:
        for _, t in describe.tensors_in(v, name):
            return t.device
    return None


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


class Call:
    def __init__(self, entry, settings: Settings, sink: Sink, dumper: dump.Dumper | None,
                 detailed: bool):
        self.entry = entry
        self.settings = settings
        self.level = settings.level
        self.sink = sink
        self.parent: Call | None = getattr(_local, "call", None)  # the logged call that made this one
        self.dumper = dumper if self.parent is None else None  # None when not dumping this call
        self.detailed = detailed  # arguments and outputs in the log (level >= 3, selected API)
        self.seq = next(_seq)
        self.dump: dump.ActiveDump | None = None
        self.modules: list[str] = []

    def _head(self, what: str = "") -> str:
        where = f"pid {os.getpid()}"
        thread = threading.current_thread()
        if thread is not threading.main_thread():
            where += f" thread {thread.name}"
        forced = f" [KILN_FORCE_BACKEND={self.settings.force_backend}]" if self.settings.force_backend else ""
        inside = f" (inside #{self.parent.seq})" if self.parent is not None else ""
        return f"[kiln {_stamp()} {where}] #{self.seq} {self.entry.name}{inside}{what}{forced}"

    def _values(self, named, capture: bool) -> list[str]:
        width = max((len(n) for n, _ in named), default=0)
        lines = []
        for name, v in named:
            lines.append(f"  {name:<{width}} = {describe.value(v)}")
            if self.level >= 5:
                for tname, t in describe.tensors_in(v, name):
                    stats = describe.CAPTURE_NOTE if capture else describe.stats(t)
                    which = "" if tname == name else f"{tname} "
                    lines.append(f"  {'':<{width}}   {which}stats: {stats}")
        return lines

    def run(self, args: tuple, kwargs: dict):
        entry, settings = self.entry, self.settings
        needs_names = self.detailed or self.dumper is not None or settings.force_backend
        named = describe.named_arguments(entry.signature, args, kwargs) if needs_names else []
        capture = describe.capturing() if (self.detailed and self.level >= 5) or self.dumper else False
        if settings.force_backend:
            self._announce_force()
        if self.level >= 1:
            lines = [self._head()]
            if self.detailed:
                lines += self._values(named, capture)
            self.sink.write("\n".join(lines))
        if self.dumper is not None:
            self._begin_dump(args, kwargs, named, capture)

        previous = getattr(_local, "call", None)
        _local.call = self
        start = time.perf_counter()
        try:
            if settings.force_backend:
                result = force.run(entry.fn, settings.force_backend, args, kwargs, list(entry.mutates),
                                   [n for n, _ in named[:len(args)]])
            else:
                result = entry.fn(*args, **kwargs)
        except BaseException as e:
            elapsed = time.perf_counter() - start
            if self.level >= 1:
                self.sink.write(f"{self._head(' raised')} {type(e).__name__}: {e}")
            if self.dump is not None:
                self.dump.finish_raised(e, elapsed)
            raise
        finally:
            _local.call = previous
        elapsed = time.perf_counter() - start

        if self.detailed or self.dump is not None:
            outputs = entry.outputs(result, named)
            if self.detailed:
                capture = self.level >= 5 and describe.capturing()
                self.sink.write("\n".join([self._head(f" returned after {elapsed * 1e3:.3f} ms")]
                                          + self._values(outputs, capture)))
            if self.dump is not None:
                self.dump.finish(outputs, elapsed)
        return result

    def _begin_dump(self, args, kwargs, named, capture: bool) -> None:
        if capture:
            self.sink.write(f"{self._head()}: not dumped: a CUDA graph is being captured")
            return
        positional = named[:len(args)]
        self.dump = self.dumper.begin(self.entry.name, self.entry.fn, self.seq, positional, kwargs,
                                      self.entry.mutates, _first_device(named),
                                      self.settings.force_backend)

    def observe_module(self, device: torch.device, module, log: bool) -> None:
        """Called through kiln._jit.module_observer inside this call, before the kernel runs."""
        if not ((log and self.detailed) or self.dump is not None) or module.__name__ in self.modules:
            return
        self.modules.append(module.__name__)
        info = provenance.module_info(module, "cuda" if device.type == "cuda" else "host")
        if log and self.detailed:
            self.sink.write(f"  using module {provenance.module_summary(info)}")
        if self.dump is not None:
            self.dump.add_module(info)

    def _announce_force(self) -> None:
        if not _force_announced.is_set():
            _force_announced.set()
            backend = self.settings.force_backend
            self.sink.write(
                f"kiln: KILN_FORCE_BACKEND={backend} is in effect: every kiln call runs on the "
                f"{backend} backend, its tensors copied there and back. This is a diagnostic "
                "control (docs/troubleshooting.md), never a production setting.")
