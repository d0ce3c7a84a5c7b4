"""Dispatch-matrix expansion: a target's axes -> its specialisations, each with a deterministic,
readable URI.

    //ops:norm, dispatch={"dtype": ["f32", "f16", "bf16"]}
      -> norm_dtype_f32, norm_dtype_f16, norm_dtype_bf16
    //ops/attention:cascade, dispatch={"dtype": [...], "head_dim": [...]}
      -> attention_cascade_dtype_f16_head_dim_64, ...

A URI is the target's URI prefix (its name, after its family's name when they differ) followed by
`<axis>_<value>` for each axis in declaration order. The module built from it by a toolchain is
`<uri>_<toolchain>`. Combinations the target excludes are
never expanded; asking for one, or for a value outside an axis, is an error naming what is allowed.
"""

from __future__ import annotations

import itertools

from kiln.runtime.record import Record

from .rules import NoRelease, Target


class DispatchError(ValueError):
    pass


class Specialisation(Record):
    """One target at one value of each dispatch axis."""

    __slots__ = ("target", "params")

    def __init__(self, target: Target, params: tuple[tuple[str, str], ...]):
        self._init(target, params)

    @property
    def uri(self) -> str:
        return "_".join([self.target.uri_prefix] + [f"{a}_{v}" for a, v in self.params])

    def module_name(self, toolchain: str) -> str:
        return f"{self.uri}_{toolchain}"

    @property
    def param_dict(self) -> dict[str, str]:
        return dict(self.params)


def expand(target: Target, selection: dict[str, list[str]] | None = None) -> list[Specialisation]:
    """Every supported specialisation of `target`, optionally restricted by `selection`
    (axis -> allowed values, e.g. from `--set dtype=bf16`)."""
    selection = {a: [str(v).lower() for v in vs] for a, vs in (selection or {}).items()}
    axes = target.axes
    for axis, values in selection.items():
        if axis not in axes:
            raise DispatchError(
                f"{target.label} has no dispatch axis {axis!r}; its axes are "
                f"{', '.join(axes) or '(none)'}"
            )
        bad = [v for v in values if v not in axes[axis]]
        if bad:
            raise DispatchError(
                f"{target.label}: {axis}={','.join(bad)} is not supported; {axis} takes "
                f"{', '.join(axes[axis])}"
            )
    names = list(axes)
    pools = [selection.get(a, axes[a]) for a in names]
    out = []
    for combo in itertools.product(*pools):
        params = dict(zip(names, combo, strict=True))
        if any(ex.matches(params) for ex in target.exclude):
            continue
        out.append(Specialisation(target, tuple(params.items())))
    return out


def released(target: Target) -> list[Specialisation]:
    """The specialisations precompiled packages ship, as the target's `release=` registers them;
    [] for a target that registers none."""
    if target.release is None or isinstance(target.release, NoRelease):
        return []
    return expand(target, {axis: list(values) for axis, values in target.release})


def specialisation(target: Target, params: dict) -> Specialisation:
    """The one specialisation for a full assignment of the target's axes, or a clear error."""
    params = {a: str(v).lower() for a, v in params.items()}
    axes = target.axes
    missing = [a for a in axes if a not in params]
    extra = [a for a in params if a not in axes]
    if missing or extra:
        raise DispatchError(
            f"{target.label} needs exactly the axes {', '.join(axes) or '(none)'}; "
            f"missing {missing}, unknown {extra}"
        )
    for axis, value in params.items():
        if value not in axes[axis]:
            raise DispatchError(
                f"{target.label}: {axis}={value} is not supported; {axis} takes "
                f"{', '.join(axes[axis])}"
            )
    for ex in target.exclude:
        if ex.matches(params):
            shown = ", ".join(f"{a}={v}" for a, v in ex.match)
            raise DispatchError(f"{target.label}: {shown} is not supported: {ex.reason}")
    return Specialisation(target, tuple((a, params[a]) for a in axes))
