"""The JIT's own logger, 'kiln.jit': compiles, cache misses, lock waits, loads.

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
        level = logging.getLevelName(env.get("KILN_JIT_LOGLEVEL"))  # a name the table checked
        _configured = True
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.propagate = False
        log.setLevel(level)
    return log
