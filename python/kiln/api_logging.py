"""API logging: one decorator, `logged_api`, on every public kiln API and on the executing method
(`run`) of every plan/run wrapper, so no API is forgotten.

    @logged_api                                   # named from __qualname__: "kiln.rmsnorm"
    def rmsnorm(input, weight, eps=1e-6, out=None): ...

    @logged_api("kiln.fused_add_rmsnorm", mutates=("input", "residual"))
    def fused_add_rmsnorm(input, residual, weight, eps=1e-6): ...

    class BatchDecodeWithPagedKVCacheWrapper:
        @logged_api                               # "kiln.BatchDecodeWithPagedKVCacheWrapper.run"
        def run(self, q, kv_cache): ...

`mutates` names the arguments an API writes (`out=`, in-place inputs); they are logged and dumped
as outputs after the call, beside the return value.

What the decorator does is decided once, when it runs, i.e. when kiln is imported: with
KILN_LOGLEVEL=0, no KILN_DUMP and no KILN_FORCE_BACKEND (the defaults) it returns the function
itself: no wrapper, no per-call cost. Otherwise it returns the wrapper of
kiln/diagnostics/call.py. Setting these variables later in a running process has no effect.

Every decorated API is registered by name whatever the settings: `python -m kiln replay` finds
the function of a dump there, and `uncovered(kiln)` lists public APIs that were left undecorated.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

from .diagnostics.registry import ApiEntry, register, registered
from .diagnostics.settings import Settings

__all__ = ["ApiEntry", "is_logged", "logged_api", "public_api", "registered", "uncovered"]


def _default_name(fn: Callable) -> str:
    module = fn.__module__ or ""
    if module == "kiln" or module.startswith("kiln."):
        return f"kiln.{fn.__qualname__}"
    return f"{module}.{fn.__qualname__}"


def _decorate(fn: Callable, name: str | None, mutates: tuple[str, ...]) -> Callable:
    if not callable(fn):
        raise TypeError(f"logged_api decorates functions and methods, not {type(fn).__name__}")
    entry = ApiEntry(name or _default_name(fn), fn, tuple(mutates))
    register(entry)
    fn.__kiln_api__ = entry.name  # marks it covered; an attribute costs nothing per call
    settings = Settings.from_env()
    if not settings.active:
        return fn
    from .diagnostics import call  # the machinery is imported only when diagnostics are on

    return call.wrap(entry, settings)


def logged_api(fn_or_name: Callable | str | None = None, /, *, mutates: tuple[str, ...] = ()):
    """Decorate a public API: `@logged_api`, `@logged_api("kiln.name")`, `@logged_api(mutates=...)`."""
    if callable(fn_or_name):
        return _decorate(fn_or_name, None, ())
    return lambda fn: _decorate(fn, fn_or_name, mutates)


def is_logged(obj: object) -> bool:
    """Was `obj` (a function, a method, or the wrapper returned for it) decorated by logged_api?"""
    return getattr(obj, "__kiln_api__", None) is not None


def public_api(module: types.ModuleType) -> dict[str, object]:
    """What must be logged in `module.__all__`: each function, and the `run` method of each class
    that has one (plan/run wrappers execute in `run`). Submodules and constants are not APIs."""
    out = {}
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if inspect.isclass(obj):
            if callable(getattr(obj, "run", None)):
                out[f"{name}.run"] = obj.run
        elif callable(obj) and not isinstance(obj, types.ModuleType):
            out[name] = obj
    return out


def uncovered(module: types.ModuleType) -> list[str]:
    """The public APIs of `module` that logged_api does not cover (should be none)."""
    return sorted(name for name, obj in public_api(module).items() if not is_logged(obj))
