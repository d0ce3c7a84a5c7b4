"""The API log's destination (KILN_LOGDEST): stdout, stderr, or a file ('%p' -> the process id).

A record reaches the destination before the call it describes runs: it is written in one piece,
flushed, and for a file fsync'ed, so the inputs of a call that kills the process (or hangs the
machine) are on disk already. Files are opened on the first record, in append mode, and
reopened after a fork so every process writes its own '%p' file.
"""

from __future__ import annotations

import errno
import os
import sys
import threading

from kiln.runtime import env

# fsync on something that is not a regular file (/dev/null, a pipe) fails harmlessly with these.
_UNSYNCABLE = {errno.EINVAL, errno.EROFS, errno.ENOTSUP, errno.EBADF}


class Sink:
    def __init__(self, dest: str):
        self.dest = dest
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid: int | None = None

    @property
    def is_stream(self) -> bool:
        return self.dest in ("stdout", "stderr")

    def path(self) -> str:
        """The file this process writes to (only for a file destination)."""
        return self.dest.replace("%p", str(os.getpid()))

    def write(self, text: str) -> None:
        data = text if text.endswith("\n") else text + "\n"
        with self._lock:  # records of concurrent calls never interleave
            if self.is_stream:
                self._write_stream(data)
            else:
                self._write_file(data.encode("utf-8", "backslashreplace"))

    def _write_stream(self, data: str) -> None:
        stream = getattr(sys, self.dest)
        if stream is None:  # no console (pythonw, some daemons): go to the file descriptor
            os.write(1 if self.dest == "stdout" else 2, data.encode("utf-8", "backslashreplace"))
            return
        stream.write(data)
        stream.flush()

    def _write_file(self, data: bytes) -> None:
        fd = self._file()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno not in _UNSYNCABLE:
                raise

    def _file(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            if self._fd is not None:  # inherited across a fork: this process gets its own file
                os.close(self._fd)
            path = self.path()
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise env.EnvError(
                    f"KILN_LOGDEST={self.dest!r}: cannot open {path} for the API log ({e.strerror}); "
                    "point it at a writable file, or use stdout or stderr") from e
            self._pid = pid
        return self._fd


_sinks: dict[str, Sink] = {}
_sinks_lock = threading.Lock()


def sink_for(dest: str) -> Sink:
    """The one Sink per destination in this process."""
    with _sinks_lock:
        sink = _sinks.get(dest)
        if sink is None:
            sink = _sinks[dest] = Sink(dest)
        return sink
