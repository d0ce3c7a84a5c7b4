"""The diagnostic settings, read from the environment (runtime/env.py declares each variable).

`logged_api` reads them when it decorates an API, i.e. when kiln is imported: at level 0 with no
dump and no forced backend it returns the function itself, so a disabled diagnostic costs nothing
per call (R6.2). Changing KILN_LOGLEVEL after `import kiln` therefore has no effect.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from kiln.runtime import env

# Each level adds to the ones below it; 2 and 4 act as 1 and 3.
LEVELS = {0: "off", 1: "call names", 3: "arguments and outputs", 5: "tensor statistics"}
BACKENDS = ("host", "cuda")


def _patterns(name: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in str(env.get(name)).split(",") if p.strip())


@dataclass(frozen=True)
class Settings:
    level: int = 0
    dest: str = "stderr"
    dump: bool = False
    dump_dir: str = ""
    dump_max_count: int = 1000
    dump_max_bytes: int = 10 * 2**30
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    force_backend: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        level = env.get("KILN_LOGLEVEL")
        if level > 5:
            raise env.EnvError(
                f"KILN_LOGLEVEL={level} is not a level; use 0 (off), 1 (call names), 3 (arguments "
                "and outputs) or 5 (also tensor statistics)")
        dump = env.get("KILN_DUMP")
        dump_dir = env.get("KILN_DUMP_DIR")
        if dump and not dump_dir:
            raise env.EnvError(
                "KILN_DUMP=1 needs KILN_DUMP_DIR: set it to a dedicated directory for the dumps "
                "(created owner-only if missing)")
        force = str(env.get("KILN_FORCE_BACKEND")).lower()
        if force and force not in BACKENDS:
            raise env.EnvError(
                f"KILN_FORCE_BACKEND={force!r} is not a backend; use 'host' or 'cuda', or leave it "
                "unset (the default: each call runs on the backend of its tensors' device)")
        return cls(
            level=level,
            dest=str(env.get("KILN_LOGDEST")) or "stderr",
            dump=dump,
            dump_dir=dump_dir,
            dump_max_count=env.get("KILN_DUMP_MAX_COUNT"),
            dump_max_bytes=env.get("KILN_DUMP_MAX_BYTES"),
            include=_patterns("KILN_DUMP_INCLUDE"),
            exclude=_patterns("KILN_DUMP_EXCLUDE"),
            force_backend=force,
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
