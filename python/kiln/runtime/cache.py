"""The disk cache's slots: verifying one before anything in it is loaded, and recovering one that
cannot be used, so that the rebuild never trusts a build output it has not verified.

A slot is `artifacts/<module>/<spec key>/`: `build/` (ninja's files, objects, depfiles, the linked
library), the published library, and `metadata.json`, the commit marker. `verify` puts a slot in
one of four states (metadata.check):

    ok        everything verifies: the library is loaded from it;
    absent    no metadata: never built, or a build was interrupted (files but no commit marker);
              the slot is emptied and built from scratch;
    stale     everything verifies but a header the compiler read changed: the only state in which
              ninja may reuse the build directory, and only after every build output recorded at
              publish time is verified (size and SHA-256) and the objects that read a changed
              header are removed (ninja compares mtimes, kiln compares contents);
    damaged   anything else (a library that does not match its digest, metadata that is corrupt,
              inconsistent or of the wrong type, a file that is a link or that another user owns
              or can write, a slot that is a link): the slot is renamed into
              `artifacts/<module>/.quarantine/` with one log line saying what was wrong and where
              it went (the newest QUARANTINE_KEEP are kept) and the module is built from scratch.

Directories another user owns or can write are refused (WorkspaceError), never repaired. Recovery
happens only under the module lock; verifying takes no lock and writes nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

from . import metadata
from .key import file_digest, parse_depfile
from .log import logger
from .record import Record
from .workspace import WorkspaceError

QUARANTINE = ".quarantine"
QUARANTINE_KEEP = 3  # quarantined slots kept per module, newest first (for diagnosis)


class Entry(Record):
    """A slot's state ("ok", "absent", "stale", "damaged"), its metadata when it has valid
    metadata, and why it cannot be loaded (None when it can)."""

    __slots__ = ("state", "md", "reason")

    def __init__(self, state: str, md: metadata.Metadata | None, reason: str | None):
        self._init(state, md, reason)


def verify(p) -> Entry:
    """The state of `p`'s cache slot. Writes nothing; WorkspaceError for an unsafe workspace."""
    exists, damage = p.workspace.check_slot(p.key_dir)
    if not exists:
        return Entry("absent", None, "not built yet (no metadata)")
    if damage:
        return Entry("damaged", None, damage)
    try:
        md = metadata.read(p.key_dir)
    except metadata.CorruptMetadata as e:
        return Entry("absent" if e.outdated else "damaged", None, str(e))
    state, why = metadata.check(md, p.key_dir, p.spec_key, p.key_parts["kiln_version"],
                                p.key_parts["python_abi"])
    if state == "absent" and any(p.key_dir.iterdir()):
        why = "an interrupted build (files, but no metadata.json)"
    return Entry(state, md, why)


def prepare(p, entry: Entry, force: bool = False) -> None:
    """Make `p`'s slot ready for a compile (caller holds the module lock): quarantine a damaged
    slot, empty one with no metadata, and keep a build directory only where it can be verified.
    `force` always starts from an empty build directory (every unit recompiles)."""
    build_dir = p.key_dir / "build"
    if entry.state == "damaged":
        quarantine(p, entry.reason or "damaged")
        return
    if entry.state == "absent":
        if os.path.lexists(p.key_dir):
            _remove(p.key_dir)
        return
    if force:
        _remove(build_dir)
        return
    if entry.state == "stale" and p.spec.toolchain == "triton":
        _remove(build_dir)  # a triton build reuses nothing (runtime/build.py)
        return
    if entry.state == "stale":
        why = reusable_build_dir(p, entry.md)
        if why:
            logger().info("kiln: rebuilding %s from scratch: its build directory cannot be "
                          "reused (%s)", p.describe(), why)
            _remove(build_dir)


def quarantine(p, reason: str) -> Path:
    """Move `p`'s slot aside into the module's quarantine, saying why; returns where it went."""
    qdir = p.workspace.ensure(p.module_dir / QUARANTINE)
    dest = qdir / f"{time.strftime('%Y%m%dT%H%M%S')}.{time.time_ns() % 10**9:09d}.{os.getpid()}." \
                  f"{p.key_dir.name}"
    try:
        os.rename(p.key_dir, dest)
    except OSError as e:
        raise WorkspaceError(
            f"kiln: the cache slot {p.key_dir} of {p.describe()} cannot be used ({reason}) and "
            f"cannot be moved aside ({e.strerror}); remove it") from None
    logger().warning("kiln: the cached %s cannot be used: %s. Moved its slot to %s; rebuilding it "
                     "from scratch", p.describe(), reason, dest)
    for old in sorted(os.listdir(qdir))[:-QUARANTINE_KEEP]:
        _remove(qdir / old)
    return dest


def output_digests(build_dir: Path, names: list[str]) -> dict[str, list]:
    """{name: [size, SHA-256]} of the build outputs `names` in `build_dir` (recorded at publish)."""
    out = {}
    for name in names:
        path = build_dir / name
        out[name] = [path.stat().st_size, file_digest(path)]
    return out


def reusable_build_dir(p, md: metadata.Metadata) -> str | None:
    """Why the build directory of `p`'s (verified, stale) slot cannot be reused, or None after it
    has been made safe to: every recorded output matches its digest, and every object that read a
    changed header is removed so ninja recompiles it whatever the mtimes say."""
    build_dir = p.key_dir / "build"
    if not md.outputs:
        return "no build outputs are recorded"
    for name, (size, sha) in sorted(md.outputs.items()):
        path = build_dir / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != size or file_digest(path) != sha:
            return f"{name} does not match the digest recorded when it was built"
    changed = {d.path for d in md.deps if d.changed()}
    covered: set[str] = set()
    for u in p.spec.units:
        depfile = build_dir / (u.obj + ".d")
        if depfile.name not in md.outputs or u.obj not in md.outputs:
            return f"{u.obj} or its depfile was not recorded"
        read = {os.path.realpath(d) for d in parse_depfile(depfile.read_text())}
        if read & changed:
            covered |= read & changed
            (build_dir / u.obj).unlink()
    if changed - covered:
        return f"no unit's depfile names {sorted(changed - covered)[0]}"
    return None


def _remove(path: Path) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
