"""The compile lock, also taken around each download of an artifact: an OS-level lock that
can never outlive its holder, and never hangs silently.

The lock is flock(2) on `<module dir>/.lock`: the kernel releases it when the holding process
exits or is killed, so a killed compile leaves nothing that blocks the next run. The holder writes
who it is beside the lock (`.lock.owner`); a waiter reports that holder and the elapsed time
every few seconds and gives up after KILN_JIT_LOCK_TIMEOUT seconds with an error naming both.
The lock only prevents duplicate work: callers re-check the cache after taking it.

A lock file may be removed (`python -m kiln.codegen clean` removes those no process holds): a
process that gets the lock checks that its file is still the one at the path, and otherwise takes
the lock again on the new file, so two processes never both hold "the" lock of one module.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from . import env

log = logging.getLogger("kiln.jit")


class LockTimeout(TimeoutError):
    pass


class ModuleLock:
    POLL_S = 0.05
    REPORT_EVERY_S = 10.0

    def __init__(self, path: Path, what: str, timeout_s: float | None = None,
                 doing: str = "compiling"):
        self.path = Path(path)
        self.owner_path = self.path.with_name(self.path.name + ".owner")
        self.what = what
        self.doing = doing  # what the holder does under the lock, for messages
        self.timeout_s = env.get("KILN_JIT_LOCK_TIMEOUT") if timeout_s is None else timeout_s
        self._fd: int | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.owner_path.read_text())
            return f"pid {info['pid']} on {info['host']}, since {time.ctime(info['since'])}"
        except (OSError, ValueError, KeyError, TypeError):
            return "an unknown process"

    def try_acquire(self) -> bool:
        """Take the lock if no process holds it; True when this process now holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is None or not os.path.samestat(current, os.fstat(fd)):
            os.close(fd)  # removed or replaced while we waited: lock the file that is there now
            return self.try_acquire()
        self._fd = fd
        return True

    def __enter__(self) -> ModuleLock:
        start = time.monotonic()
        next_report = self.REPORT_EVERY_S
        while not self.try_acquire():
            elapsed = time.monotonic() - start
            if elapsed >= self.timeout_s:
                raise LockTimeout(
                    f"gave up after {elapsed:.0f}s waiting for the lock of {self.what} "
                    f"({self.path}), held by {self.holder()}. If that process is stuck, stop "
                    "it; the lock is released when it exits. KILN_JIT_LOCK_TIMEOUT sets the "
                    "wait."
                ) from None
            if elapsed >= next_report:
                log.warning("kiln: waiting %.0fs for %s: %s is %s it", elapsed, self.what,
                            self.holder(), self.doing)
                next_report += self.REPORT_EVERY_S
            time.sleep(min(self.POLL_S * (1 + elapsed), 0.5))
        try:
            self.owner_path.write_text(
                json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
            )
        except OSError:
            pass  # the owner note is diagnostics only
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def remove(self) -> None:
        """Remove the lock file and its owner note while holding the lock (then release it). A
        process waiting on the removed file notices and locks the path afresh."""
        assert self._fd is not None, "remove() needs the lock held"
        for p in (self.owner_path, self.path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        self.release()

    def __exit__(self, *exc) -> None:
        self.release()
