"""Attaching trace templates to public APIs, and finding them again.

    @traced(norm.RMSNORM)
    def rmsnorm(input, weight, eps=1e-6, out=None): ...

The decorator returns the function unchanged (it only records the pair and sets
`fn.__kiln_trace__`), so it stacks with any other decorator. For plan/run APIs decorate `run`
The registry fills as kiln's API modules are imported; traced_apis() imports them all first.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.runtime.record import Record

from .template import TraceTemplate


class Traced(Record):
    """A traced API: its template and its function (a Record, not a dataclass: every family module
    creates one per API at import, kiln/runtime/record.py)."""

    __slots__ = ("template", "function")

    def __init__(self, template: TraceTemplate, function: Callable):
        self._init(template, function)

    @property
    def api(self) -> str:
        """The public path: kiln.rmsnorm, kiln.BatchDecodeWithPagedKVCacheWrapper.run."""
        return f"kiln.{self.function.__qualname__}"


_TRACED: dict[str, Traced] = {}


def traced(template: TraceTemplate) -> Callable[[Callable], Callable]:
    if not isinstance(template, TraceTemplate):
        raise TypeError(f"traced() takes a TraceTemplate, got {type(template).__name__}")

    def attach(fn: Callable) -> Callable:
        known = _TRACED.get(template.name)
        if known is not None and known.function.__qualname__ != fn.__qualname__:
            raise ValueError(f"trace template {template.name!r} is attached to both "
                             f"{known.function.__qualname__} and {fn.__qualname__}; give each "
                             "API its own template")
        _TRACED[template.name] = Traced(template, fn)  # same name again: a module reload
        fn.__kiln_trace__ = template
        return fn

    return attach


def traced_apis() -> dict[str, Traced]:
    """Every traced API by template name (importing kiln registers them)."""
    import kiln

    kiln.load_api()  # registration happens when each API module is imported

    return dict(sorted(_TRACED.items()))


def traced_api(name: str) -> Traced:
    apis = traced_apis()
    if name not in apis:
        raise KeyError(f"no trace template named {name!r}; known: {', '.join(apis)}")
    return apis[name]
