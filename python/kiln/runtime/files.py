"""Atomic file writes (readers see the old content or the new, never a part of either), the
checks that nobody else can replace a file kiln is about to load, and file digests computed once
per process.

A file kiln loads (or trusts the contents of) must be a regular file, reached through no link,
owned by this user or root, and writable by neither group nor others: a file someone else can
write is code someone else can run.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
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
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:  # a failed write names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def write_if_different(path: Path, data: str | bytes) -> bool:
    """Write only when the content differs, so unchanged files keep their mtime and ninja
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


def untrusted_file(st: os.stat_result) -> str | None:
    """Why the file with status `st` (from lstat or fstat) cannot be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return f"belongs to uid {st.st_uid}, not to you (uid {uid}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_digests: dict[tuple, str] = {}
_digests_lock = threading.Lock()


def verified_digest(path: Path) -> str:
    """The SHA-256 of the file at `path` (opened without following a link), computed once per
    process per file version: the memo is keyed by device, inode, size, mtime and ctime, which
    any rewrite of the file changes (ctime cannot be set back)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with _digests_lock:
            known = _digests.get(key)
        if known is not None:
            return known
        with os.fdopen(fd, "rb", closefd=False) as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    finally:
        os.close(fd)
    with _digests_lock:
        _digests[key] = digest
    return digest
