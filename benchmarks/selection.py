"""--shapes: which workloads a run covers. Each value (the flag may be repeated) is one of

    examples                  every workload of every committed definition (the default)
    small                     every definition at its small workloads (quick; CPU, CI)
    <example>                 one definition's workloads: llama-3.1-8b-decode, or a model name
                              for all its phases: llama-3.1-8b
    <example>:axis=v,...      one workload of that definition (the var axes), e.g.
                              llama-3.1-70b-prefill:tokens=8192 (what repro lines use)
    axis=v,...                an ad-hoc workload, every axis given: tokens=16384,hidden=8192
                              (the template's default scalars; no definition)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .definitions import Definition
from .routine import Routine

PRESETS = ("examples", "small")


@dataclass(frozen=True)
class Case:
    """One workload of one routine: every axis's value, the scalars, where it came from."""

    routine: Routine
    axes: dict[str, int]
    scalars: dict[str, Any]
    definition: Definition | None
    selector: str  # the --shapes value that selects exactly this workload
    dtypes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items())


def parse_axes(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--shapes: {part!r} is not axis=integer (e.g. tokens=128)")
        out[name.strip()] = int(value)
    return out


def _selector(d: Definition, workload: dict[str, int]) -> str:
    return f"{d.example}:" + ",".join(f"{k}={v}" for k, v in workload.items())


def _from_definition(r: Routine, d: Definition, workloads) -> list[Case]:
    t = r.template
    return [Case(r, t.resolve_axes(d.consts, w, d.name), t.scalar_values(d.scalars), d,
                 _selector(d, w), d.dtypes) for w in workloads]


def select(r: Routine, defs: list[Definition], shapes: list[str]) -> list[Case]:
    """The cases `shapes` selects for routine `r`, in order, without duplicates."""
    t = r.template
    cases: list[Case] = []
    for value in shapes or ["examples"]:
        head, colon, tail = value.partition(":")
        if value in PRESETS:
            for d in defs:
                cases += _from_definition(r, d, d.workloads if value == "examples" else d.small_workloads)
        elif "=" in head:
            given = parse_axes(value)
            consts = {k: v for k, v in given.items() if k in t.axes and t.axes[k].kind == "const"}
            work = {k: v for k, v in given.items() if k not in consts}
            axes = t.resolve_axes(consts, work, f"--shapes {value}")
            cases.append(Case(r, axes, t.scalar_values(), None, value, t.dtypes))
        else:
            matched = [d for d in defs if head in (d.example, d.model)]
            if not matched:
                known = sorted({d.example for d in defs} | {d.model for d in defs})
                raise ValueError(f"--shapes {value!r}: {r.name} has no example or model {head!r}; "
                                 f"use {', '.join(PRESETS)}, axis=value lists, or one of: "
                                 f"{', '.join(known)}")
            for d in matched:
                cases += _from_definition(r, d, [parse_axes(tail)] if colon else d.workloads)
    unique, seen = [], set()
    for c in cases:  # the same computation once, even when two definitions share it
        key = (tuple(c.axes.items()), tuple(c.scalars.items()))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique
