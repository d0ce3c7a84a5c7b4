"""pytest's --sample option (registered in conftest.py): keep every N-th case of each test, at a
per-module rate if asked. Its own module, free of conftest's side effects (the session workspace), so
tests can import it."""

from __future__ import annotations

import pytest


def sample_rates(specs: list[str]) -> tuple[int, dict[str, int]]:
    """--sample's values as (every N-th for any module, {module: N})."""
    default, per_module = 1, {}
    for spec in specs:
        module, _, every = spec.rpartition("=")
        if not every.isdigit() or int(every) < 1 or (module == "" and "=" in spec):
            raise pytest.UsageError(f"--sample {spec!r}: expected N or MODULE=N with N a whole number >= 1 "
                                    "(e.g. --sample 10 --sample test_page=1)")
        if module:
            per_module[module] = int(every)
        else:
            default = int(every)
    return default, per_module


def sampled(config, items) -> None:
    default, per_module = sample_rates(config.getoption("sample"))
    if default == 1 and all(n == 1 for n in per_module.values()):
        return
    seen: dict[tuple, int] = {}
    kept, dropped = [], []
    for item in items:
        every = per_module.get(item.path.stem, default)
        key = (item.path, getattr(item, "originalname", item.name))
        index = seen[key] = seen.get(key, -1) + 1
        if index % every:
            dropped.append(item)
            continue
        kept.append(item)
        if every > 1:
            item.user_properties.append(("sample", every))
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept
