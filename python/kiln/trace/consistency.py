"""Does a trace template still describe its API? Used by the tests; each problem names
the API, the parameter and what to change.

Checked against the decorated function's signature (`plan`'s too for plan/run APIs):
  - every template input is a parameter (plan inputs of plan(), the rest of the traced method);
  - every parameter is an input, an output passed in (`out=`), or a listed option (*args too);
  - a scalar input's default equals the parameter's default;
  - tensor inputs are annotated as tensors and scalars are not (where annotated).
"""

from __future__ import annotations

import inspect
import sys

from .registry import Traced
from .template import Scalar, Tensor


def _params(fn) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(fn).parameters)
    params.pop("self", None)
    return params


def _plan_method(traced: Traced):
    owner = traced.function.__qualname__.rsplit(".", 1)[0]
    cls = getattr(sys.modules[traced.function.__module__], owner, None)
    plan = getattr(cls, "plan", None)
    if plan is None:
        raise LookupError(f"{traced.api}: the template lists plan_inputs but {owner} has no plan()")
    return plan


def signature_problems(traced: Traced) -> list[str]:
    t, api = traced.template, traced.api
    problems: list[str] = []
    calls = [(api, _params(traced.function), [n for n in t.inputs if n not in t.plan_inputs])]
    if t.plan_inputs:
        try:
            plan = _plan_method(traced)
        except LookupError as e:
            return [str(e)]
        calls.append((f"{api.rsplit('.', 1)[0]}.plan", _params(plan), list(t.plan_inputs)))
    for where, params, inputs in calls:
        for name in inputs:
            if name not in params:
                problems.append(f"{where}: template {t.name} input {name!r} is not a parameter "
                                f"(parameters: {', '.join(params)})")
                continue
            spec, p = t.inputs[name], params[name]
            if isinstance(spec, Scalar) and p.default is not inspect.Parameter.empty \
                    and p.default != spec.default:
                problems.append(f"{where}: {name} defaults to {p.default!r}, template {t.name} says "
                                f"{spec.default!r}; make them agree")
            annotation = str(p.annotation) if p.annotation is not inspect.Parameter.empty else ""
            if annotation and isinstance(spec, Tensor) != ("Tensor" in annotation):
                kind = "tensor" if isinstance(spec, Tensor) else "scalar"
                problems.append(f"{where}: template {t.name} declares {name!r} a {kind}, the "
                                f"parameter is annotated {annotation}")
        for name, p in params.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in t.options:
                problems.append(f"{where}: *{name} cannot be described by a trace template; name "
                                "the parameters, or list it in options= with why it is no workload")
            elif p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            elif name not in t.inputs and name not in t.outputs and name not in t.options:
                problems.append(f"{where}: parameter {name!r} is not an input, output or option of "
                                f"template {t.name}; add it there (options= with why if it is no "
                                "part of the workload)")
    return problems
