"""The writable workspaces (R2.6-11): generated sources and JIT artifacts, in separate trees.

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
from dataclasses import dataclass
from pathlib import Path

from . import env


class WorkspaceError(PermissionError):
    pass


@dataclass(frozen=True)
class Workspace:
    base: Path

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

    def check_private(self, path: Path) -> None:
        """Refuse a directory (and its parents up to the base) that another user could write to."""
        path = Path(path)
        uid = os.getuid()
        # Check from the module's directory up to the base; a directory outside the base (a
        # KILN_NO_CACHE temp dir, a precompiled package) is checked on its own.
        chain = [path]
        if path.is_relative_to(self.base):
            chain += [p for p in path.parents if p.is_relative_to(self.base)]
        for d in chain:
            try:
                st = d.stat()
            except FileNotFoundError:
                continue
            if st.st_uid != uid and st.st_uid != 0:
                raise WorkspaceError(
                    f"refusing to load a kiln module from {path}: {d} belongs to uid {st.st_uid}, "
                    f"not to you (uid {uid}). Set KILN_WORKSPACE_BASE to a directory of your own."
                )
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise WorkspaceError(
                    f"refusing to load a kiln module from {path}: {d} is writable by other users "
                    f"(mode {stat.S_IMODE(st.st_mode):o}), so its contents could be replaced. Run "
                    f"'chmod go-w {d}' or set KILN_WORKSPACE_BASE to a private directory."
                )
