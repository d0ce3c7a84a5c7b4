"""Record: the base of the small immutable value classes on the path of a warm first call.

    class Entry(Record):
        __slots__ = ("state", "md", "reason")

        def __init__(self, state: str, md, reason: str | None):
            self._init(state, md, reason)

behaves as `@dataclass(frozen=True)` with those fields does: ==, hash and repr over the fields in
order, FrozenInstanceError on assignment, pickling and copying by field. What it does not give is
dataclasses.fields/replace/asdict. Why not the dataclass: creating one costs 0.5 ms (1 ms
frozen) on the 2-core box under Python 3.11, where it generates and compiles each method's
source; a class with __slots__ costs ~0.01 ms. About 40 dataclasses were created on a warm first
call (docs/perf/compile-time.md).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError


class Record:
    __slots__ = ()

    def _init(self, *values) -> None:
        """Set the fields (__slots__, in order) to `values`: for the subclass's __init__."""
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({fields})"

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self):
        return self.__class__, self._values()
