"""The compile lock (R5.6), also taken around each download of an artifact: an OS-level lock that
can never outlive its holder, and never hangs silently.

The lock is flock(2) on `<module dir>/.lock` (through filelock): the kernel releases it when the
holding process exits or is killed, so a killed compile leaves nothing that blocks the next run.
The holder writes who it is beside the lock; a waiter reports that holder and the elapsed time
every few seconds and gives up after KILN_JIT_LOCK_TIMEOUT seconds with an error naming both.
The lock only prevents duplicate work: callers re-check the cache after taking it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import filelock

from . import env

log = logging.getLogger("kiln.jit")


class LockTimeout(TimeoutError):
    pass


class ModuleLock:
    POLL_S = 0.5
    REPORT_EVERY_S = 10.0

    def __init__(self, path: Path, what: str, timeout_s: float | None = None,
                 doing: str = "compiling"):
        self.path = Path(path)
        self.owner_path = self.path.with_name(self.path.name + ".owner")
        self.what = what
        self.doing = doing  # what the holder does under the lock, for messages
        self.timeout_s = env.get("KILN_JIT_LOCK_TIMEOUT") if timeout_s is None else timeout_s
        self._lock = filelock.FileLock(str(self.path), thread_local=False)

    def holder(self) -> str:
        try:
            info = json.loads(self.owner_path.read_text())
            return f"pid {info['pid']} on {info['host']}, since {time.ctime(info['since'])}"
        except (OSError, ValueError, KeyError):
            return "an unknown process"

    def __enter__(self) -> ModuleLock:
        start = time.monotonic()
        next_report = self.REPORT_EVERY_S
        while True:
            try:
                self._lock.acquire(timeout=self.POLL_S)
                break
            except filelock.Timeout:
                elapsed = time.monotonic() - start
                if elapsed >= self.timeout_s:
                    raise LockTimeout(
                        f"gave up after {elapsed:.0f}s waiting for the lock of {self.what} "
                        f"({self.path}), held by {self.holder()}. If that process is stuck, stop "
                        "it; the lock is released when it exits. KILN_JIT_LOCK_TIMEOUT sets the "
                        "wait."
                    ) from None
                if elapsed >= next_report:
                    log.warning(
                        "kiln: waiting %.0fs for %s: %s is %s it", elapsed, self.what,
                        self.holder(), self.doing,
                    )
                    next_report += self.REPORT_EVERY_S
        try:
            self.owner_path.write_text(
                json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
            )
        except OSError:
            pass  # the owner note is diagnostics only
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()
