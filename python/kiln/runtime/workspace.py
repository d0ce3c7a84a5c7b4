"""The writable workspaces: generated sources and JIT artifacts, in separate trees.

    $KILN_WORKSPACE_BASE/            default ~/.cache/kiln, created owner-only (0700)
      generated/<uri>/<gen key>/     rendered configs and copied compile units of one specialisation
                                     (keyed by the digests of what they are made from, so two kiln
                                     checkouts sharing a workspace never write into each other's)
      artifacts/<module>/<key>/      build files, the shared library, metadata.json (commit marker)
      artifacts/<module>/.lock       the module's compile lock
      downloads/<version>/<tag>/<abi>/  precompiled modules from the artifact repository (verified)

Nothing is created until a cache miss needs it. Modules are loaded only from directories that no
other user can write to.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from . import env
from .record import Record


class WorkspaceError(PermissionError):
    pass


class Workspace(Record):
    __slots__ = ("base",)

    def __init__(self, base: Path):
        self._init(base)

    @classmethod
    def current(cls) -> Workspace:
        return cls(Path(env.get("KILN_WORKSPACE_BASE")).absolute())

    @property
    def generated(self) -> Path:
        return self.base / "generated"

    @property
    def artifacts(self) -> Path:
        return self.base / "artifacts"

    @property
    def downloads(self) -> Path:
        return self.base / "downloads"

    def gen_dir(self, uri: str, gen_key: str) -> Path:
        return self.generated / uri / gen_key[:12]

    def module_dir(self, module: str) -> Path:
        return self.artifacts / module

    def key_dir(self, module: str, spec_key: str) -> Path:
        return self.module_dir(module) / spec_key[:24]

    def ensure(self, path: Path) -> Path:
        """Create `path` and any missing parents (from the base down) as owner-only directories."""
        path = Path(path)
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            if p == p.parent:
                break
            p = p.parent
        for d in reversed(missing):
            try:
                d.mkdir(mode=0o700)
            except FileExistsError:
                pass
            except OSError as e:
                raise WorkspaceError(
                    f"cannot create kiln workspace directory {d}: {e.strerror}; set "
                    "KILN_WORKSPACE_BASE to a writable directory"
                ) from e
        return path

    def _refuse(self, path: Path, d: Path, why: str, fix: str) -> WorkspaceError:
        return WorkspaceError(f"refusing to load a kiln module from {path}: {d} {why}. {fix}")

    def check_private(self, path: Path) -> None:
        """Refuse a directory (and its parents up to the base) that another user could write to,
        or a link below the base (the base itself may be a link: it is configured)."""
        self.check_slot(Path(path), slot_inside=False)

    def check_slot(self, key_dir: Path, slot_inside: bool = True) -> tuple[bool, str | None]:
        """Check the directories from the base down to the cache slot `key_dir`, without
        following a link below the base. Returns (whether the slot exists, why it is damaged or
        None). A directory another user owns or can write, or a link or non-directory above the
        slot, is a WorkspaceError: nothing can be built or loaded safely there. The slot itself
        being a link or not a directory is damage (it can be moved aside and rebuilt).
        With `slot_inside` False, `key_dir` is any directory to load from (a KILN_NO_CACHE
        temporary directory: checked on its own) and a problem with it is a WorkspaceError."""
        key_dir = Path(key_dir)
        uid = os.getuid()
        inside = key_dir.is_relative_to(self.base)
        chain = [self.base, *reversed([p for p in key_dir.parents if p.is_relative_to(self.base)
                                       and p != self.base])] if inside else []
        chain.append(key_dir)
        for d in chain:
            top = d == self.base or not inside
            slot = d == key_dir and slot_inside and inside
            try:
                st = d.stat() if top else d.lstat()  # the base (a configured path) may be a link
            except FileNotFoundError:
                return False, None
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                what = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
                if slot:
                    return True, f"the cache slot {what}"
                raise self._refuse(key_dir, d, what + " (kiln follows no link inside its "
                                   "workspace)", "Remove it, or set KILN_WORKSPACE_BASE to a "
                                   "private directory.")
            if st.st_uid != uid and st.st_uid != 0:
                raise self._refuse(key_dir, d, f"belongs to uid {st.st_uid}, not to you (uid "
                                   f"{uid})", "Set KILN_WORKSPACE_BASE to a directory of your own.")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise self._refuse(key_dir, d, f"is writable by other users (mode "
                                   f"{stat.S_IMODE(st.st_mode):o}), so its contents could be "
                                   "replaced", f"Run 'chmod go-w {d}' or set KILN_WORKSPACE_BASE "
                                   "to a private directory.")
        return True, None
