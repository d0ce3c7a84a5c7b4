"""Benchmark definitions: one trace template bound to one example, as plain JSON data.

benchmarks/definitions/<op>/<example>.json are written from these (python -m benchmarks
definitions --regenerate) and committed; the harness runs from them and a test fails when they
no longer match the templates.
"""

from __future__ import annotations

from typing import Any

from .registry import Traced
from .template import Example, Scalar, Tensor, TraceTemplate, reference_source


def _tensor(spec: Tensor) -> dict[str, Any]:
    return {"shape": list(spec.shape), "dtype": spec.dtype, **({"doc": spec.doc} if spec.doc else {})}


def _input(spec: Tensor | Scalar, example: Example, name: str) -> dict[str, Any]:
    if isinstance(spec, Tensor):
        return _tensor(spec)
    out: dict[str, Any] = {"shape": None, "dtype": spec.dtype}
    if spec.axis:
        out["axis"] = spec.axis
    else:
        out["value"] = example.scalars.get(name, spec.default)
    return {**out, **({"doc": spec.doc} if spec.doc else {})}


def definition(traced: Traced, example: Example) -> dict[str, Any]:
    t: TraceTemplate = traced.template
    axes = {}
    for name, axis in t.axes.items():
        entry: dict[str, Any] = {"type": axis.kind}
        if axis.kind == "const":
            entry["value"] = axis.value if axis.value is not None else example.consts[name]
        if axis.doc:
            entry["doc"] = axis.doc
        axes[name] = entry
    for w in example.workloads:  # every workload must be complete and valid
        t.resolve_axes(example.consts, w, f"example {example.name}")
    return {
        "name": f"{t.name}/{example.name}",
        "op": t.name,
        "api": traced.api,
        "description": t.description,
        "example": {"model": example.model, "phase": example.phase, "source": example.source},
        "axes": axes,
        "dtypes": list(t.dtypes),
        "inputs": {n: _input(s, example, n) for n, s in t.inputs.items()},
        "outputs": {n: _tensor(s) for n, s in t.outputs.items()},
        "plan_inputs": list(t.plan_inputs),
        "tolerance": {dt: {"rtol": r, "atol": a} for dt, (r, a) in t.tolerance.items()},
        "workloads": [dict(w) for w in example.workloads],
        "small_workloads": [dict(w) for w in t.small],
        "reference": reference_source(t.reference),
    }


def definitions(traced: Traced) -> list[dict[str, Any]]:
    return [definition(traced, ex) for ex in traced.template.examples]
