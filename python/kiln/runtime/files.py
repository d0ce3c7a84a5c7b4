"""Atomic file writes (readers see the old content or the new, never a part of either), and the
check that nobody else can replace a file kiln is about to load."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class UntrustedPath(PermissionError):
    """Another user could replace a file kiln would load (and so run)."""


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


def check_not_replaceable(path: Path, up_to: Path, fix: str) -> None:
    """Refuse `path` when a user other than this one or root could replace it: the file and each
    directory from its own up to `up_to` (inclusive) must belong to this user or to root and be
    writable by neither group nor others. A site-packages owned by root passes; a group-writable
    shared environment does not. `fix` says what to do instead."""
    path, up_to = Path(path), Path(up_to)
    uid = os.getuid()
    chain = [path, *(d for d in path.parents if d.is_relative_to(up_to))]
    for p in chain:
        st = os.stat(p)
        if st.st_uid not in (uid, 0):
            raise UntrustedPath(f"refusing to load {path}: {p} belongs to uid {st.st_uid}, not to "
                                f"you (uid {uid}) or root. {fix}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UntrustedPath(f"refusing to load {path}: {p} is writable by other users (mode "
                                f"{stat.S_IMODE(st.st_mode):o}), so it could be replaced. Run "
                                f"'chmod go-w {p}', or: {fix}")
