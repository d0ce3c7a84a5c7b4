"""Trace templates: the workload a public API describes about itself.

A template names the API's axes (variable per call, or constant for one model), its inputs and
outputs with shapes in those axes and their dtypes, a reference implementation in plain torch and
the tolerance the API must meet against it. Examples bind the constant axes to a real model's
numbers and list the variable axes' values seen in decode or prefill; template x example is one
benchmark definition (benchmarks/definitions/<op>/<example>.json).

Shapes are tuples of dimensions, each an axis name or a small integer expression of axes
("batch_size + 1", "batch_size * cdiv(kv_len, page_size)": + - * // and cdiv); the dtype of a
tensor is a torch dtype name ("float32", "int32") or WORKLOAD_DTYPE, the dtype the workload runs
in (one of the template's `dtypes`).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kiln.runtime.record import Record

WORKLOAD_DTYPE = "$dtype"

# kiln's short dtype names (the `dtype` dispatch axis, the harness's --dtype) <-> torch's names.
SHORT_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def dtype_name(name: str) -> str:
    """A torch dtype name from either spelling ('bf16' or 'bfloat16'); ValueError otherwise."""
    name = SHORT_DTYPE.get(name, name)
    if not isinstance(getattr(torch, name, None), torch.dtype):
        allowed = ", ".join(f"{s}/{t}" for s, t in SHORT_DTYPE.items())
        raise ValueError(f"unknown dtype {name!r}; use a torch dtype name or one of {allowed}")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, dtype_name(name))


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}


def _dim_value(node: ast.AST, axes: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Expression):
        return _dim_value(node.body, axes, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in axes:
            raise ValueError(f"dimension {text!r} names {node.id!r}, which is not an axis")
        return axes[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_dim_value(node.left, axes, text), _dim_value(node.right, axes, text))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cdiv"
            and len(node.args) == 2 and not node.keywords):
        a, b = (_dim_value(x, axes, text) for x in node.args)
        return -(-a // b)
    raise ValueError(f"dimension {text!r}: only axis names, integers, + - * // and cdiv(a, b)")


def dim(text: str, axes: Mapping[str, int]) -> int:
    """The value of one shape entry (an axis name or an expression of axes)."""
    if text in axes:
        return axes[text]
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"dimension {text!r} is not an expression of axes: {e.msg}") from e
    return _dim_value(tree, axes, text)


@dataclass(frozen=True)
class Axis:
    """A named dimension. `var`: changes from call to call (tokens, batch size, kv length);
    `const`: fixed for a model (hidden size, heads), set by the template (`value`) or by each
    example when `value` is None."""

    kind: Literal["var", "const"]
    value: int | None = None
    doc: str = ""

    def __post_init__(self):
        if self.kind not in ("var", "const"):
            raise ValueError(f"Axis.kind must be 'var' or 'const', got {self.kind!r}")
        if self.kind == "var" and self.value is not None:
            raise ValueError("a var axis has no fixed value; make it const or drop the value")


def var(doc: str = "") -> Axis:
    return Axis("var", None, doc)


def const(value: int | None = None, doc: str = "") -> Axis:
    return Axis("const", value, doc)


class Tensor(Record):
    """A tensor argument or result: `shape` in axis names, `dtype` a torch name or WORKLOAD_DTYPE."""

    __slots__ = ("shape", "dtype", "doc")

    def __init__(self, shape: tuple[str, ...], dtype: str = WORKLOAD_DTYPE, doc: str = ""):
        self._init(shape, dtype, doc)


def entry_tensors(label: str, entry: str, axes: Mapping[str, str],
                  skip: tuple[str, ...] = ()) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The inputs and outputs of the entry point `entry` that `label`'s BUILD file declares, as
    trace tensors: the tensors it reads and the ones it writes (both, for one updated in place),
    each declared size and leading dimensions ("*rows", one axis here) renamed by `axes`, "2*d" as
    "d * 2"; "elem" tensors in the workload's dtype. `skip`: tensors the API does not take."""
    from kiln.codegen.graph import load_graph

    found = [e for e in load_graph().target(label).entries if e.name == entry]
    if not found:
        raise LookupError(f"{label} declares no entry {entry!r}")

    def dim(d) -> str:
        if d.kind == "fixed":
            return str(d.coef)
        name = axes.get(d.name)
        if name is None:
            raise KeyError(f"{label}:{entry}: no trace axis for the declared size {d.name!r}; "
                           f"axes= maps {sorted(axes)}")
        if d.kind == "plus":
            return f"{name} + {d.coef}"
        return name if d.coef == 1 else f"{name} * {d.coef}"

    inputs: dict[str, Tensor] = {}
    outputs: dict[str, Tensor] = {}
    for t in found[0].tensors:
        if t.name in skip:
            continue
        if t.shape is None or not isinstance(t.dtype, str):
            raise ValueError(f"{label}:{entry}: tensor {t.name!r} has no declared shape or one dtype; "
                             "write it in the template (or skip it)")
        tensor = Tensor(tuple(dim(d) for d in t.shape),
                        WORKLOAD_DTYPE if t.dtype == "elem" else t.dtype)
        if t.read:
            inputs[t.name] = tensor
        if t.written:
            outputs[t.name] = tensor
    return inputs, outputs


class Scalar(Record):
    """A non-tensor argument (eps, scale). `default` must equal the API's default; an example may
    set a model's own value (Llama's eps is 1e-5). `axis`: the value is that axis's (plan()'s
    num_qo_heads, head_dim, page_size)."""

    __slots__ = ("dtype", "default", "doc", "axis")

    def __init__(self, dtype: str, default: Any = None, doc: str = "", axis: str | None = None):
        self._init(dtype, default, doc, axis)


@dataclass(frozen=True)
class Example:
    """A realistic workload for one model and phase: values of the constant axes, scalar values,
    and the variable axes' values to run (each dict one workload)."""

    name: str  # "llama-3.1-8b-decode": the definition's file name
    model: str
    phase: str  # "decode" | "prefill"
    consts: Mapping[str, int]
    workloads: tuple[Mapping[str, int], ...]
    scalars: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # where the model's numbers come from


Reference = Callable[..., Mapping[str, torch.Tensor]]
MakeInputs = Callable[["TraceTemplate", Mapping[str, int], str, torch.device, torch.Generator],
                      dict[str, Any]]


@dataclass(frozen=True, eq=False)
class TraceTemplate:
    """The workload description attached to one public API with kiln.trace.traced."""

    name: str  # the op's name: the routine, the definitions folder
    description: str
    axes: Mapping[str, Axis]
    inputs: Mapping[str, Tensor | Scalar]  # names are the API's parameter names
    outputs: Mapping[str, Tensor]  # an output named like an input is written in place into it
    reference: Reference  # (**inputs) -> {output name: tensor}; may compute in a wider dtype
    tolerance: Mapping[str, tuple[float, float]]  # torch dtype name -> (rtol, atol); keys: dtypes
    examples: tuple[Example, ...]
    small: tuple[Mapping[str, int], ...]  # values of the var axes for quick CPU runs (CI)
    plan_inputs: tuple[str, ...] = ()  # plan/run APIs: the inputs that go to plan(), not run()
    options: Mapping[str, str] = field(default_factory=dict)  # API parameters that are no part
    # of the workload (layout switches, return_lse), each with why
    make_inputs: MakeInputs | None = None  # makes the inputs that are not random floats
    # (indices, lengths); returns {name: value} for those only
    target: str = ""  # the build-graph label whose kernels run the API ("//ops:norm")

    def __post_init__(self):
        probe = dict.fromkeys(self.axes, 1)
        for where, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for name, spec in specs.items():
                dims = spec.shape if isinstance(spec, Tensor) else ((spec.axis,) if spec.axis else ())
                for d in dims:
                    try:
                        dim(d, probe)
                    except ValueError as e:
                        raise ValueError(f"trace template {self.name}: {where}[{name!r}]: {e}; "
                                         f"axes: {list(self.axes)}") from e
        for dt in self.tolerance:
            dtype_name(dt)
        for ex in self.examples:
            self.resolve_axes(ex.consts, ex.workloads[0] if ex.workloads else {}, ex.name)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self.tolerance)

    def var_axes(self) -> tuple[str, ...]:
        return tuple(n for n, a in self.axes.items() if a.kind == "var")

    def resolve_axes(self, consts: Mapping[str, int], workload: Mapping[str, int],
                     where: str = "") -> dict[str, int]:
        """Every axis's value: the template's constants, then `consts`, then `workload`."""
        values: dict[str, int] = {}
        at = f" ({where})" if where else ""
        for name, axis in self.axes.items():
            if axis.kind == "const":
                if name in workload:
                    raise ValueError(f"{self.name}{at}: axis {name!r} is constant; it is set by the "
                                     f"example ({consts.get(name, axis.value)}), not per workload")
                value = axis.value if axis.value is not None else consts.get(name)
            else:
                value = workload.get(name)
            if value is None:
                raise ValueError(f"{self.name}{at}: no value for the {axis.kind} axis {name!r}; "
                                 f"axes: {list(self.axes)}")
            values[name] = int(value)
        extra = sorted((set(consts) | set(workload)) - set(self.axes))
        if extra:
            raise ValueError(f"{self.name}{at}: unknown axes {extra}; axes: {list(self.axes)}")
        return values

    def shape_of(self, spec: Tensor, axes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(dim(d, axes) for d in spec.shape)

    def dtype_of(self, spec: Tensor | Scalar, dtype: str) -> torch.dtype:
        return torch_dtype(dtype if spec.dtype == WORKLOAD_DTYPE else spec.dtype)

    def scalar_values(self, overrides: Mapping[str, Any] = (),
                      axes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Scalar inputs: `overrides` (an example's), else the default; axis-valued scalars from
        `axes` (left out when no axes are given)."""
        overrides = dict(overrides)
        out = {}
        for n, s in self.inputs.items():
            if isinstance(s, Scalar) and s.axis is None:
                out[n] = overrides.get(n, s.default)
            elif isinstance(s, Scalar) and axes is not None:
                out[n] = axes[s.axis]
        return out

    def build_inputs(self, axes: Mapping[str, int], dtype: str, device: torch.device | str,
                     seed: int, scalars: Mapping[str, Any] = ()) -> dict[str, Any]:
        """Fresh inputs for one workload: what make_inputs makes (index and length tensors), then
        standard-normal floats for the other tensors (generated in float32 on the CPU, so every
        device and dtype sees the same values), scalars from `scalars`, the defaults or the axes."""
        dtype = dtype_name(dtype)
        if dtype not in self.dtypes:
            raise ValueError(f"{self.name} does not support {dtype}; supported: {list(self.dtypes)}")
        gen = torch.Generator().manual_seed(seed)
        made = {}
        if self.make_inputs is not None:  # the inputs that are not random floats, first
            made = dict(self.make_inputs(self, axes, dtype, torch.device(device), gen))
        for name, spec in self.inputs.items():
            if isinstance(spec, Scalar) or name in made:
                continue
            tdtype = self.dtype_of(spec, dtype)
            if not tdtype.is_floating_point:
                raise TypeError(f"{self.name}: input {name!r} is {tdtype}; make it in the "
                                "template's make_inputs (only float inputs are made randomly)")
            t = torch.randn(self.shape_of(spec, axes), generator=gen, dtype=torch.float32)
            made[name] = t.to(device=device, dtype=tdtype)
        made.update(self.scalar_values(scalars, axes))
        missing = sorted(set(self.inputs) - set(made))
        if missing:
            raise ValueError(f"{self.name}: make_inputs did not make {missing}")
        return made

    def run_reference(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The reference outputs for `inputs` (cloned first: in-place APIs mutate theirs)."""
        args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        out = dict(self.reference(**args))
        if set(out) != set(self.outputs):
            raise ValueError(f"{self.name}: the reference returned {sorted(out)}, the template "
                             f"declares outputs {sorted(self.outputs)}")
        return out


def reference_source(fn: Callable) -> str:
    """The source of a reference function and of the module-level helpers it calls, so a
    definition file shows the whole computation."""
    seen: list[Callable] = []

    def visit(f):
        if f in seen:
            return
        seen.append(f)
        for name in f.__code__.co_names:
            g = f.__globals__.get(name)
            if inspect.isfunction(g) and g.__module__ == fn.__module__:
                visit(g)

    visit(fn)
    return "\n\n".join(inspect.getsource(f).rstrip() for f in seen) + "\n"
