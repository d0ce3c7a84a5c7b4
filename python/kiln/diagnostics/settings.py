"""The diagnostic settings, read from the environment (runtime/env.py declares each variable).

`logged_api` reads them when it decorates an API, i.e. when kiln is imported: at level 0 with no
dump and no forced backend it returns the function itself, so a disabled diagnostic costs nothing
per call. Changing KILN_LOGLEVEL after `import kiln` therefore has no effect.
"""

from __future__ import annotations

import fnmatch

from kiln.runtime import env
from kiln.runtime.record import Record

# Each level adds to the ones below it; 2 and 4 act as 1 and 3.
LEVELS = {0: "off", 1: "call names", 3: "arguments and outputs", 5: "tensor statistics"}
BACKENDS = env.KNOBS["KILN_FORCE_BACKEND"].choices


def _patterns(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in str(text).split(",") if p.strip())


class Settings(Record):
    """The diagnostic settings in force (a Record, not a dataclass: it is created on the import
    path, kiln/runtime/record.py)."""

    __slots__ = ("level", "dest", "dump", "dump_dir", "dump_max_count", "dump_max_bytes", "include",
                 "exclude", "force_backend")

    def __init__(self, level: int = 0, dest: str = "stderr", dump: bool = False, dump_dir: str = "",
                 dump_max_count: int = 1000, dump_max_bytes: int = 10 * 2**30,
                 include: tuple[str, ...] = (), exclude: tuple[str, ...] = (), force_backend: str = ""):
        self._init(level, dest, dump, dump_dir, dump_max_count, dump_max_bytes, include, exclude,
                   force_backend)

    @classmethod
    def from_env(cls, snapshot: env.Snapshot | None = None) -> Settings:
        """The settings in force. Read through the environment table, so any malformed KILN_*
        value is an error here as everywhere (env.py). With `snapshot` (a report that shows every
        variable, valid or not), only the diagnostic variables' own errors are raised."""
        if snapshot is None:
            snapshot = env.snapshot()
            snapshot.check()
        get = snapshot.value
        dump, dump_dir = get("KILN_DUMP"), get("KILN_DUMP_DIR")
        if dump and not dump_dir:
            raise env.EnvError(
                "KILN_DUMP=1 needs KILN_DUMP_DIR: set it to a dedicated directory for the dumps "
                "(created owner-only if missing)")
        return cls(
            level=get("KILN_LOGLEVEL"),  # 0..5, checked by the table
            dest=str(get("KILN_LOGDEST")) or "stderr",
            dump=dump,
            dump_dir=dump_dir,
            dump_max_count=get("KILN_DUMP_MAX_COUNT"),
            dump_max_bytes=get("KILN_DUMP_MAX_BYTES"),
            include=_patterns(get("KILN_DUMP_INCLUDE")),
            exclude=_patterns(get("KILN_DUMP_EXCLUDE")),
            force_backend=get("KILN_FORCE_BACKEND"),  # "", "host" or "cuda", checked by the table
        )

    @property
    def active(self) -> bool:
        """Does any API need wrapping? False is the default, zero-overhead state."""
        return self.level > 0 or self.dump or bool(self.force_backend)

    def selected(self, api: str) -> bool:
        """Do the include/exclude filters let `api` be dumped and logged in detail (level >= 3)?

        A pattern matches the full name ("kiln.rmsnorm") or the name without "kiln."."""
        names = (api, api.removeprefix("kiln."))

        def hit(patterns):
            return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)

        if self.include and not hit(self.include):
            return False
        return not hit(self.exclude)
