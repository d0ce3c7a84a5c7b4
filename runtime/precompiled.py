"""Precompiled-package lookup (R1.7, R5.14): the hook the JIT consults before its disk cache.

No precompiled package exists yet (the release issue adds `python -m release build` and the
package format); until then the lookup finds nothing and the JIT builds or loads from its disk
cache. The hook is here so the lookup order of DESIGN.md is fixed now and tested.
"""

from __future__ import annotations

from types import ModuleType


def lookup(plan) -> ModuleType | None:
    """The module for `plan` from an installed precompiled package, or None."""
    return None
