"""Dumps of logged calls into KILN_DUMP_DIR, for `python -m kiln replay`.

    $KILN_DUMP_DIR/                          created owner-only (0700) if missing
      <YYYYmmdd-HHMMSS>-pid<pid>/            one session per process
        00003-kiln.rmsnorm/                  one call: <sequence number>-<API name>
          inputs.safetensors                 every input tensor, copied before the call
          call.json                          the record (see record.py for value specs)
          outputs.safetensors                the outputs after the call (results and mutated inputs)

The inputs and the record are on disk (fsync'ed) before the call runs, so a call that kills the
process leaves a dump whose record says "status": "started". The record is rewritten atomically
when the call's module is known (before its kernel runs) and when the call returns or raises.

Per process, at most KILN_DUMP_MAX_COUNT calls and KILN_DUMP_MAX_BYTES bytes of tensor data are
dumped; the first call over a bound is announced in the log and nothing more is dumped for it.
Tensors are copied to the host, which synchronises with the device, so nothing is dumped while a
CUDA graph is being captured.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from kiln.runtime import env
from kiln.runtime.workspace import Workspace

from . import provenance
from .record import Encoder
from .settings import Settings
from .sink import Sink

FORMAT = 1
CALL_JSON = "call.json"
INPUTS = "inputs.safetensors"
OUTPUTS = "outputs.safetensors"


class DumpDirError(env.EnvError):
    """KILN_DUMP_DIR cannot be used."""


def write_durable(path: Path, data: bytes) -> None:
    """Write `path` atomically (temp file + rename) and make it durable (fsync file and directory)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _safetensors_bytes(tensors: dict, api: str) -> bytes:
    from safetensors.torch import save  # only when something is dumped

    return save(tensors, metadata={"api": api, "format": str(FORMAT)})


def _check_dedicated(d: Path) -> None:
    """The dump directory must not be kiln's package or one of its JIT workspaces."""
    ws = Workspace.current()
    forbidden = ((Path(__file__).resolve().parents[1], "kiln's package directory"),
                 (ws.generated.resolve(), "the generated-source workspace"),
                 (ws.artifacts.resolve(), "the JIT artifact workspace"))
    for root, what in forbidden:
        if d == root or d.is_relative_to(root):
            raise DumpDirError(f"KILN_DUMP_DIR={str(d)!r} is inside {what} ({root}); dumps need a "
                               "dedicated directory of their own")


class Dumper:
    """This process's dumps: the session directory, and the count and bytes used against the bounds."""

    def __init__(self, settings: Settings, sink: Sink):
        self.settings = settings
        self.sink = sink
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._session: Path | None = None
        self.count = 0
        self.nbytes = 0
        self._announced: set[str] = set()
        self.stopped: str | None = None  # why dumping stopped for good (an I/O error)

    def announce(self, key: str, text: str) -> None:
        """Write `text` to the log the first time `key` comes up."""
        with self._lock:
            if key in self._announced:
                return
            self._announced.add(key)
        self.sink.write(f"kiln: {text}")

    def _session_dir(self) -> Path:
        if self._session is None:
            base = Path(self.settings.dump_dir).absolute()
            _check_dedicated(base.resolve() if base.exists() else base)
            try:
                base.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as e:
                raise DumpDirError(f"KILN_DUMP_DIR={str(base)!r} cannot be created ({e.strerror}); "
                                   "point it at a writable directory") from e
            if not os.access(base, os.W_OK | os.X_OK):
                raise DumpDirError(f"KILN_DUMP_DIR={str(base)!r} is not writable; point it at a "
                                   "writable directory")
            session = base / f"{time.strftime('%Y%m%d-%H%M%S')}-pid{os.getpid()}"
            session.mkdir(mode=0o700, exist_ok=True)
            self._session = session
        return self._session

    def _reserve(self, nbytes: int, what: str) -> bool:
        """Count `nbytes` against KILN_DUMP_MAX_BYTES; False (and a note) when it would not fit."""
        with self._lock:
            if self.nbytes + nbytes <= self.settings.dump_max_bytes:
                self.nbytes += nbytes
                return True
        self.announce("bytes", f"dump size limit reached (KILN_DUMP_MAX_BYTES="
                               f"{self.settings.dump_max_bytes}, {self.nbytes} bytes used): {what} "
                               f"({nbytes} bytes) and later ones that do not fit are not dumped")
        return False

    def begin(self, api: str, function, seq: int, args: list, kwargs: dict, mutates: tuple,
              device, forced: str) -> ActiveDump | None:
        """Dump the inputs of call `seq` now; None when a bound or an earlier I/O error stops it.

        args: [(name, value)] as passed positionally; kwargs: {name: value}."""
        if self.stopped:
            return None
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its own session and bounds
                self._pid, self._session, self.count, self.nbytes = os.getpid(), None, 0, 0
            full = self.count >= self.settings.dump_max_count
            if not full:
                self.count += 1
        if full:
            self.announce("count", f"dump count limit reached (KILN_DUMP_MAX_COUNT="
                                   f"{self.settings.dump_max_count}): call #{seq} {api} and later "
                                   "calls are not dumped")
            return None
        enc = Encoder()
        record = {
            "format": FORMAT, "api": api,
            "function": {"module": function.__module__, "qualname": function.__qualname__},
            "seq": seq, "pid": os.getpid(), "status": "started", "started_at": time.time(),
            "args": [{"name": n, **enc.encode(v, n)} for n, v in args],
            "kwargs": {n: enc.encode(v, n) for n, v in kwargs.items()},
            "mutates": list(mutates),
            "device": provenance.device_info(device) if device is not None else None,
            "backend": forced or (None if device is None else
                                  "cuda" if device.type == "cuda" else "host"),
            "forced_backend": forced or None,
            "modules": [], "environment": provenance.environment(),
            "inputs_file": INPUTS, "input_bytes": enc.nbytes, "notes": [],
        }
        if not self._reserve(enc.nbytes, f"call #{seq} {api}"):
            with self._lock:
                self.count -= 1
            return None
        try:
            session = self._session_dir()
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", api)
            path = session / f"{seq:05d}-{name}"
            path.mkdir(mode=0o700)
            write_durable(path / INPUTS, _safetensors_bytes(enc.tensors, api))
            dump = ActiveDump(self, path, record)
            dump.save()
        except OSError as e:  # a full disk must not take the program down; say so and stop
            self.stop(e)
            return None
        return dump

    def stop(self, error: OSError) -> None:
        self.stopped = str(error)
        self.announce("stopped", f"dumping stopped after an I/O error: {error}")


class ActiveDump:
    """The dump of one call in progress."""

    def __init__(self, dumper: Dumper, path: Path, record: dict):
        self.dumper = dumper
        self.path = path
        self.record = record

    def save(self) -> None:
        write_durable(self.path / CALL_JSON, json.dumps(self.record, indent=1).encode())

    def _update(self) -> None:
        try:
            self.save()
        except OSError as e:
            self.dumper.stop(e)

    def add_module(self, info: dict) -> None:
        self.record["modules"].append(info)
        self.record["backend"] = info["backend"]
        self._update()

    def note(self, text: str) -> None:
        self.record["notes"].append(text)

    def finish(self, outputs: list[tuple[str, object]], elapsed: float) -> None:
        enc = Encoder()
        specs = {n: enc.encode(v, n) for n, v in outputs}
        self.record.update(status="completed", elapsed_s=elapsed, outputs=specs,
                           output_bytes=enc.nbytes)
        if self.dumper._reserve(enc.nbytes, f"the outputs of call #{self.record['seq']}"):
            try:
                write_durable(self.path / OUTPUTS, _safetensors_bytes(enc.tensors, self.record["api"]))
                self.record["outputs_file"] = OUTPUTS
            except OSError as e:
                self.dumper.stop(e)
                self.note(f"outputs not saved: {e}")
        else:
            self.note("outputs not saved: KILN_DUMP_MAX_BYTES reached")
        self._update()

    def finish_raised(self, error: BaseException, elapsed: float) -> None:
        self.record.update(status="raised", elapsed_s=elapsed,
                           error={"type": type(error).__qualname__, "message": str(error)})
        self._update()


_dumpers: dict[tuple, Dumper] = {}
_dumpers_lock = threading.Lock()


def dumper_for(settings: Settings, sink: Sink) -> Dumper:
    """One Dumper per (directory, bounds, log destination) in this process."""
    key = (settings.dump_dir, settings.dump_max_count, settings.dump_max_bytes, sink.dest)
    with _dumpers_lock:
        dumper = _dumpers.get(key)
        if dumper is None:
            dumper = _dumpers[key] = Dumper(settings, sink)
        return dumper
