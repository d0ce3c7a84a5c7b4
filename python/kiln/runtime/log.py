"""The JIT's own logger, 'kiln.jit': compiles, cache misses, lock waits, loads (R7.8).

It is separate from API-call logging and has its own level, KILN_JIT_LOGLEVEL (default INFO: a
compile announces itself and reports its time, so a first call never looks hung; cache hits are
DEBUG). It writes to stderr. It is set up on first use, never at import time.
"""

from __future__ import annotations

import logging
import sys

from . import env

_configured = False


def logger() -> logging.Logger:
    global _configured
    log = logging.getLogger("kiln.jit")
    if not _configured:
        _configured = True
        level_name = str(env.get("KILN_JIT_LOGLEVEL")).upper()
        level = logging.getLevelName(level_name)
        if not isinstance(level, int):
            raise env.EnvError(
                f"KILN_JIT_LOGLEVEL={level_name!r} is not a level; use DEBUG, INFO, WARNING or ERROR"
            )
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.propagate = False
        log.setLevel(level)
    return log
