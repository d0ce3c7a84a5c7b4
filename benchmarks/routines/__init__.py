"""Every benchmark routine: each module of this package (one per op family) lists its Routines in
a module-level ROUTINES tuple, collected here in module-name order. Adding an op to the harness is
adding its Routine (and its API's trace template), never a new script and no edit here."""

from __future__ import annotations

import importlib
import pkgutil

from ..routine import Routine


def _collect() -> dict[str, Routine]:
    found: dict[str, Routine] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for r in getattr(module, "ROUTINES", ()):
            if r.name in found:
                raise ValueError(f"two routines are named {r.name!r} ({info.name} and an earlier module)")
            found[r.name] = r
    return found


ROUTINES: dict[str, Routine] = _collect()


def routine(name: str) -> Routine:
    if name not in ROUTINES:
        raise KeyError(f"no routine named {name!r}; routines: {', '.join(ROUTINES)} (or 'all')")
    return ROUTINES[name]
