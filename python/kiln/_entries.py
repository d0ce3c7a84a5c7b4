"""A torch custom op made from an entry point a BUILD file declares (kiln/codegen/entries.py):

    _act_and_mul = entry_op("//ops:activation", "act_and_mul")
    _act_and_mul(out, input, "silu", pdl)        # kiln::act_and_mul

The op's schema follows the entry's arguments (a tensor it writes is a mutated argument, a choice
a str, then `pdl` when the entry takes it); its launcher finds the module from the entry's
`dispatch` (on the anchor tensor's device) and calls the generated binding by position with
DLPack capsules, the choices' indices, the error record's address (`errors`) and the stream. The
launcher is compiled from source once per op so that a call is the same straight-line code a
hand-written launcher is (docs/perf/host-overhead.md: a call's cost is counted in tenths of us).
"""

from __future__ import annotations

import torch

from . import _jit, errors
from ._ops import custom_op

_ANNOTATION = {"float": "float", "int": "int", "bool": "bool"}


def find_entry(label: str, name: str):
    from kiln.codegen.graph import load_graph

    target = load_graph().target(label)
    for e in target.entries:
        if e.name == name:
            return e
    raise LookupError(f"{label} declares no entry {name!r}; its entries: "
                      f"{', '.join(e.name for e in target.entries) or '(none)'}")


def launcher_source(entry, label: str, *, fn_name: str | None = None, alias=None,
                    api: str | None = None) -> str:
    """The Python source of the launcher of `entry` (a def named after it, or `fn_name`). `alias`
    {written tensor: tensor read}: that argument is not the op's, the one it names is passed in its
    place (an in-place variant); `api`: the name errors use instead of the entry's."""
    alias, api_override = alias or {}, api
    params, call = [], []
    for a in entry.args:
        if a.name in alias:
            call.append(f"_dl({alias[a.name]})")
        elif a.kind == "tensor" and a.as_bytes:  # a uint8 view: fp8 without DLPack's fp8 codes
            params.append(f"{a.name}: torch.Tensor | None" if a.optional else f"{a.name}: torch.Tensor")
            view = f"_dl({a.name}.view(torch.uint8))"
            call.append(f"None if {a.name} is None else {view}" if a.optional else view)
        elif a.kind == "scalar" and a.value is not None:
            call.append(f"({a.value})")
        elif a.kind == "tensor":
            params.append(f"{a.name}: torch.Tensor | None" if a.optional else f"{a.name}: torch.Tensor")
            call.append(f"None if {a.name} is None else _dl({a.name})" if a.optional else f"_dl({a.name})")
        elif a.kind == "scalar":
            params.append(f"{a.name}: {_ANNOTATION[a.type]}")
            call.append(a.name)
        else:
            params.append(f"{a.name}: str")
            call.append(f"_choice_{a.name}[{a.name}]")
    anchor = entry.anchor.name
    if entry.pdl:
        params.append("pdl: bool")
        call.append("pdl")
    if entry.errors:
        call.append(f"_record_address({anchor}.device)")
    call.append(f"_stream_of({anchor}.device)")
    api = f"f{entry.api!r}" if entry.api else repr(f"kiln::{entry.name}")
    if api_override is not None:
        api = repr(api_override)
    values = ", ".join(expr for _, expr in entry.dispatch)
    lines = [f"def {fn_name or entry.name}({', '.join(params)}) -> None:",
             f"    mod = _modules.get({api}, {anchor}.device{', ' + values if values else ''})",
             f"    mod.{entry.name}({', '.join(call)})"]
    if entry.errors:
        lines.append(f"    _after_launch({anchor}.device)")
    return "\n".join(lines) + "\n"


def entry_launcher(label: str, entry, *, fn_name: str | None = None, alias=None, api: str | None = None):
    """The launcher function of `entry` (not yet a custom op); the keywords as launcher_source's."""
    names = {axis: expr for axis, expr in entry.dispatch}
    namespace = {
        "torch": torch, "_dl": _jit.dl, "_stream_of": _jit.stream_of,
        "_record_address": errors.record_address, "_after_launch": errors.after_launch,
        "_modules": _jit.Modules(label, *names, names=names),
    }
    for a in entry.args:
        if a.kind == "choice":
            namespace[f"_choice_{a.name}"] = {value: i for i, (value, _) in enumerate(a.values)}
    source = launcher_source(entry, label, fn_name=fn_name, alias=alias, api=api)
    code = compile(source, f"<kiln entry {label}:{fn_name or entry.name}>", "exec")
    exec(code, namespace)  # noqa: S102 - source made from kiln's own BUILD declarations
    fn = namespace[fn_name or entry.name]
    fn.__doc__ = f"{entry.doc}\n\n(the launcher of {label}'s entry {entry.name}, generated)"
    fn.modules = namespace["_modules"]  # its module lookup (benchmarks/host_overhead.py times it)
    return fn


def entry_op(label: str, name: str, *, op_name: str | None = None, alias: dict | None = None,
             api: str | None = None):
    """kiln::<name>: the custom op of the entry `name` that `label`'s BUILD file declares.

    A variant of it: kiln::<op_name>, where `alias` {written tensor: tensor read} drops those
    arguments and passes the tensors they name in their place (in place: alias={"out": "input"}
    makes an op that mutates input; the binding sees out and input as one view), and `api` the
    name its errors use."""
    entry = find_entry(label, name)
    alias = dict(alias or {})
    if alias and op_name in (None, entry.name):
        raise ValueError(f"{label}:{name}: a variant with alias= needs an op_name of its own")
    tensors = {t.name: t for t in entry.tensors}
    for out, source in alias.items():
        if out not in tensors or not tensors[out].written or source not in tensors or source in alias:
            raise ValueError(f"{label}:{name}: alias {out!r}: {source!r} must map a tensor the entry writes "
                             "to one it takes that is not aliased itself")
    mutates = tuple(dict.fromkeys(alias.get(m, m) for m in entry.mutated))
    fn = entry_launcher(label, entry, fn_name=op_name, alias=alias, api=api)
    return custom_op(op_name or entry.name, mutates=mutates)(fn)
