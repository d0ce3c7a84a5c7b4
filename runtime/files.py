"""Atomic file writes: readers see the old content or the new, never a part of either."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_if_different(path: Path, data: str | bytes) -> bool:
    """Write only when the content differs (R3.8), so unchanged files keep their mtime and ninja
    rebuilds nothing for them. Returns True when it wrote."""
    path = Path(path)
    new = data.encode() if isinstance(data, str) else data
    try:
        if path.read_bytes() == new:
            return False
    except FileNotFoundError:
        pass
    write_atomic(path, new)
    return True
