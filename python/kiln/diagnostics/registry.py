"""Every API `logged_api` decorated in this process, by name: what `python -m kiln replay` looks a
dump's function up in (diagnostics/replay.py) and what the coverage check walks
(kiln/api_logging.py). Kept here, below the API layer, so replay needs nothing above diagnostics."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable

from kiln.runtime.record import Record


class ApiEntry(Record):
    """A decorated API: its name, the undecorated function and the arguments it writes (a Record,
    not a dataclass: every family module creates one per API at import, kiln/runtime/record.py)."""

    __slots__ = ("name", "fn", "mutates")

    def __init__(self, name: str, fn: Callable, mutates: tuple[str, ...] = ()):
        self._init(name, fn, mutates)

    @property
    def signature(self) -> inspect.Signature | None:
        return _signature(self.fn)

    def outputs(self, result: object, named: list[tuple[str, object]]) -> list[tuple[str, object]]:
        """What a call produced: the arguments it mutates, then its result unless that is one of
        them (rmsnorm(x, w, out=o) returns o: it is reported once, as `out`)."""
        given = dict(named)
        out = [(m, given[m]) for m in self.mutates if given.get(m) is not None]
        if result is not None and not any(result is v for _, v in out):
            out.append(("result", result))
        return out


@functools.cache
def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_registry: dict[str, ApiEntry] = {}
_registry_lock = threading.Lock()


def register(entry: ApiEntry) -> None:
    """Add `entry`; a name already given to another function is a ValueError."""
    with _registry_lock:
        old = _registry.get(entry.name)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (
                entry.fn.__module__, entry.fn.__qualname__):
            raise ValueError(
                f"logged_api: {entry.name!r} already names {old.fn.__module__}.{old.fn.__qualname__}; "
                f"give {entry.fn.__module__}.{entry.fn.__qualname__} a name of its own")
        _registry[entry.name] = entry


def registered() -> dict[str, ApiEntry]:
    """Every decorated API in this process, by name."""
    with _registry_lock:
        return dict(_registry)
