"""An op's entry points, declared once in its BUILD.py: the schema the binding, the torch custom op
and the trace template's tensors are all generated from.

    op_library(
        name="activation", ...,
        headers=["ops/activation/activation.h"],      # what the generated binding includes
        entries=[entry(
            "act_and_mul", doc="out = act(input[..., :d]) * input[..., d:]",
            args=[tensor("out", shape=["*rows", "d"], access="w"),
                  tensor("input", shape=["*rows", "2*d"]),
                  choice("act", {"silu": "kiln::activation::Act::kSilu", ...})],
            pdl=True,                                  # a `pdl` launch flag (sm90+ CUDA)
            dispatch={"dtype": "input.dtype"},         # module axes from the arguments
            api="kiln.{act}_and_mul",                  # the name errors use (str arguments)
            params=params("kiln::activation::ActParams", out="out.data", d="out.size(-1)", ...),
            call="kiln::activation::act_and_mul")],
    )

tensor(name, shape, dtype, access, ...):
    shape   a list of dimensions: "hidden" (a size, named: bound where it first appears, checked
            everywhere else), "2*d" (a multiple of a named size), "batch+1" (a size plus a
            constant: an indptr), 1 (a literal), and first, at
            most once, "*rows" (any number of leading dimensions, the same in every tensor naming
            rows; ndim=(lo, hi) bounds the total). None: any shape (numel= may fix the count).
    dtype   "elem" (the module's element type, kiln::spec::dtype), a torch name ("float32"),
            or {torch name: C++ value} (one of those dtypes; the value, as `<name>_dtype`, is
            what params may use). Default "elem".
    access  "r" (read), "w" (written), "rw" (both). A written tensor must not overlap itself or
            any other tensor of the call, except `may_alias`, which it may be exactly (in place).
    optional  None is accepted (the view's data is then nullptr and its checks are skipped).
    layout  "last" (contiguous in the last dimension, any leading strides) or "any".
    like    the shape of that tensor (an output of its input's shape: "k_out.shape must equal
            k.shape"), checked after it, so that an input's own mistake is reported on it.
    as_bytes  the launcher passes a uint8 view (of an fp8 tensor: not every torch build exports
            fp8 through DLPack); declare dtype="uint8".
scalar(name, type, value=None): "float" (double), "int" (int64_t), "bool". value: a Python
    expression over the op's arguments ("out.dtype == torch.float8_e5m2"): the binding's
    argument, computed by the launcher, not the op's.
choice(name, {python value: C++ value}): a str in Python, the C++ value in the binding.
require(cond, message): a C++ condition over the arguments (views and scalars by name, a declared
    size as dim_<name>) that must hold; "{x}" in the message is scalar x's value (a tensor's shape,
    a declared size's value, or else the value of that C++ integer expression: "{k.size(-1)}").
bands=True: the tensors may be bands of one tensor (q and k as heads of a fused qkv, outputs as the
    column bands of one): what is written is checked apart from what is read and written before
    it by an overlap test that proves such bands disjoint (kb::check_apart); a written tensor is
    named first, one computed in place by its input's name ("q and k overlap").
size_words={size: words}: how a shape error names where a declared size came from, instead of
    the dimension it was read from ("q.shape[0] (nnz)" for "q.shape[0]").
params(type, **fields): the backend's parameter struct, each field a C++ expression over the
    arguments ("a.b" sets a nested member); the binding calls `call(p, ctx)`.

The binding's arguments are the entry's in order, then `pdl` (when declared), `errors` (when
declared: the device's index-error record) and `stream`. The first tensor read is the anchor:
its device is the call's, and "elem" dtypes are checked against the module's through it.
"""

from __future__ import annotations

import re

from kiln.runtime.record import Record

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_DIM = re.compile(r"^(?:(\d+)\*)?([a-z_][a-z0-9_]*)$")
_PLUS = re.compile(r"^([a-z_][a-z0-9_]*)\+(\d+)$")  # "batch+1": a size plus a constant (indptr)
_EXPR = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")
SCALAR_TYPES = {"float": ("double", "float"), "int": ("int64_t", "int"), "bool": ("bool", "bool")}
# torch dtype names a tensor may declare, and their C++ element types (bindings' dl_dtype<T>).
DTYPES = {"float32": "float", "float16": "kiln::f16_t", "bfloat16": "kiln::bf16_t",
          "float8_e4m3fn": "kiln::e4m3_t", "float8_e5m2": "kiln::e5m2_t", "int32": "int32_t",
          "int64": "int64_t", "uint8": "uint8_t"}


class EntryError(ValueError):
    """An entry declaration is invalid; the message names the entry and the argument."""


class Dim(Record):
    """One dimension of a declared shape: kind "lead" (name), "size" (name, coef), "fixed" (coef) or
    "plus" (name + coef: "batch+1")."""

    __slots__ = ("kind", "name", "coef")

    def __init__(self, kind: str, name: str, coef: int):
        self._init(kind, name, coef)

    def spelling(self) -> str:
        if self.kind == "lead":
            return "*" + self.name
        if self.kind == "fixed":
            return str(self.coef)
        if self.kind == "plus":
            return f"{self.name}+{self.coef}"
        return self.name if self.coef == 1 else f"{self.coef}*{self.name}"


class TensorArg(Record):
    __slots__ = ("name", "shape", "dtype", "access", "optional", "may_alias", "layout", "ndim",
                 "numel", "why", "as_bytes", "like")

    def __init__(self, name, shape, dtype, access, optional, may_alias, layout, ndim, numel, why,
                 as_bytes=False, like=None):
        self._init(name, shape, dtype, access, optional, may_alias, layout, ndim, numel, why, as_bytes,
                   like)

    kind = "tensor"

    @property
    def read(self) -> bool:
        return "r" in self.access

    @property
    def written(self) -> bool:
        return "w" in self.access


class ScalarArg(Record):
    __slots__ = ("name", "type", "value")

    def __init__(self, name: str, type: str, value: str | None = None):
        self._init(name, type, value)

    kind = "scalar"


class ChoiceArg(Record):
    __slots__ = ("name", "values")  # ((python value, C++ value), ...)

    def __init__(self, name: str, values: tuple[tuple[str, str], ...]):
        self._init(name, values)

    kind = "choice"


class Require(Record):
    __slots__ = ("cond", "message")

    def __init__(self, cond: str, message: str):
        self._init(cond, message)


class Params(Record):
    __slots__ = ("type", "fields")

    def __init__(self, type: str, fields: tuple[tuple[str, str], ...]):
        self._init(type, fields)


class Entry(Record):
    """One entry point: its arguments, the module axes they select, the backend call."""

    __slots__ = ("name", "doc", "args", "params", "call", "dispatch", "api", "pdl", "errors",
                 "requires", "size_words", "bands")

    def __init__(self, name, doc, args, params, call, dispatch, api, pdl, errors, requires, size_words=(),
                 bands=False):
        self._init(name, doc, args, params, call, dispatch, api, pdl, errors, requires, size_words, bands)

    @property
    def tensors(self) -> tuple[TensorArg, ...]:
        return tuple(a for a in self.args if a.kind == "tensor")

    @property
    def anchor(self) -> TensorArg:
        return next(t for t in self.tensors if t.read and not t.optional)

    @property
    def mutated(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.written)

    def arg(self, name: str):
        return next(a for a in self.args if a.name == name)


def parse_dim(where: str, spec, first: bool) -> Dim:
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return Dim("fixed", "", spec)
    if isinstance(spec, str) and spec.startswith("*") and _IDENT.match(spec[1:]):
        if not first:
            raise EntryError(f"{where}: {spec!r} (leading dimensions) must be the shape's first entry")
        return Dim("lead", spec[1:], 1)
    plus = _PLUS.match(spec) if isinstance(spec, str) else None
    if plus is not None:
        return Dim("plus", plus.group(1), int(plus.group(2)))
    m = _DIM.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise EntryError(f"{where}: dimension {spec!r} must be a size name ('hidden'), a multiple "
                         "('2*d'), a literal (1) or leading dimensions first ('*rows')")
    coef = int(m.group(1) or 1)
    if coef < 1:
        raise EntryError(f"{where}: dimension {spec!r} needs a positive multiple")
    return Dim("size", m.group(2), coef)


def tensor(name: str, shape=None, *, dtype="elem", access: str = "r", optional: bool = False,
           may_alias: str | None = None, layout: str = "last", ndim=None, numel: int | None = None,
           why: str = "", as_bytes: bool = False, like: str | None = None) -> TensorArg:
    where = f"tensor({name!r})"
    if not isinstance(name, str) or not _IDENT.match(name):
        raise EntryError(f"{where}: the name must match {_IDENT.pattern}")
    dims = None if shape is None else tuple(parse_dim(where, d, i == 0) for i, d in enumerate(shape))
    if isinstance(dtype, dict):
        if not dtype or any(k not in DTYPES for k in dtype):
            raise EntryError(f"{where}: dtype= names {sorted(dtype)}; known: {', '.join(DTYPES)}")
        dt = tuple((str(k), str(v)) for k, v in dtype.items())
    elif dtype == "elem" or dtype in DTYPES:
        dt = dtype
    else:
        raise EntryError(f"{where}: dtype={dtype!r} must be 'elem', a torch name ({', '.join(DTYPES)}) "
                         "or {torch name: C++ value}")
    if access not in ("r", "w", "rw"):
        raise EntryError(f"{where}: access={access!r} must be 'r', 'w' or 'rw'")
    if layout not in ("last", "any"):
        raise EntryError(f"{where}: layout={layout!r} must be 'last' or 'any'")
    if ndim is not None:
        lo, hi = ndim
        if not 0 <= lo <= hi <= 8:
            raise EntryError(f"{where}: ndim={ndim!r} must be (lo, hi) with 0 <= lo <= hi <= 8")
        ndim = (int(lo), int(hi))
    if may_alias is not None and "w" not in access:
        raise EntryError(f"{where}: may_alias= is for a written tensor (one computed in place)")
    if as_bytes and dtype != "uint8":
        raise EntryError(f"{where}: as_bytes= passes a uint8 view: declare dtype='uint8'")
    if like is not None and (shape is not None or ndim is not None or numel is not None):
        raise EntryError(f"{where}: like= is the whole shape; it takes no shape=, ndim= or numel=")
    return TensorArg(name, dims, dt, access, bool(optional), may_alias, layout, ndim, numel, why,
                     bool(as_bytes), like)


def scalar(name: str, type: str, *, value: str | None = None) -> ScalarArg:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise EntryError(f"scalar({name!r}): the name must match {_IDENT.pattern}")
    if type not in SCALAR_TYPES:
        raise EntryError(f"scalar({name!r}): type={type!r} must be one of {', '.join(SCALAR_TYPES)}")
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise EntryError(f"scalar({name!r}): value= takes the Python expression the launcher passes")
    return ScalarArg(name, type, value)


def choice(name: str, values: dict) -> ChoiceArg:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise EntryError(f"choice({name!r}): the name must match {_IDENT.pattern}")
    if not isinstance(values, dict) or not values:
        raise EntryError(f"choice({name!r}): values= takes {{python value: C++ value}}")
    return ChoiceArg(name, tuple((str(k), str(v)) for k, v in values.items()))


def require(cond: str, message: str) -> Require:
    if not cond or not message:
        raise EntryError("require() needs a C++ condition and the message when it fails")
    return Require(cond, message)


def params(type: str, **fields: str) -> Params:
    if not type or not fields:
        raise EntryError("params() needs the struct's C++ type and its fields")
    return Params(type, tuple((k.replace("__", "."), str(v)) for k, v in fields.items()))


def entry(name: str, *, doc: str, args, params: Params, call: str, dispatch: dict | None = None,
          api: str | None = None, pdl: bool = False, errors: bool = False, requires=(),
          size_words: dict | None = None, bands: bool = False) -> Entry:
    where = f"entry({name!r})"
    if not isinstance(name, str) or not _IDENT.match(name):
        raise EntryError(f"{where}: the name must match {_IDENT.pattern}")
    args = tuple(args)
    names = [a.name for a in args]
    reserved = {"pdl", "errors", "stream"} & set(names)
    if reserved:
        raise EntryError(f"{where}: {sorted(reserved)} are the launch arguments the entry adds itself")
    if len(set(names)) != len(names):
        raise EntryError(f"{where}: argument names repeat: {names}")
    if not isinstance(params, Params):
        raise EntryError(f"{where}: params= takes params(type, field=expression, ...)")
    tensors = [a for a in args if a.kind == "tensor"]
    if not any(t.read and not t.optional for t in tensors):
        raise EntryError(f"{where}: needs a tensor it reads that is not optional (the call's anchor)")
    for t in tensors:
        if t.may_alias is not None and t.may_alias not in names:
            raise EntryError(f"{where}: {t.name} may_alias={t.may_alias!r}, not an argument")
        if t.like is not None and t.like not in [x.name for x in tensors if x is not t]:
            raise EntryError(f"{where}: {t.name} like={t.like!r}, not another tensor of the entry")
    leads: dict[str, int] = {}
    for t in tensors:
        for d in t.shape or ():
            if d.kind == "lead":
                leads[d.name] = leads.get(d.name, 0) + 1
    for axis, expr in (dispatch or {}).items():
        if not isinstance(expr, str) or not _EXPR.match(expr) or expr.split(".")[0] not in names:
            raise EntryError(f"{where}: dispatch {axis}={expr!r} must be an argument's attribute "
                             "('input.dtype')")
    if api is not None:
        for field in re.findall(r"{(\w+)}", api):
            if field not in names:
                raise EntryError(f"{where}: api={api!r} names {field!r}, not an argument")
    for r in requires:
        if not isinstance(r, Require):
            raise EntryError(f"{where}: requires= takes require(cond, message) entries")
    sizes = {d.name for t in tensors for d in t.shape or () if d.kind in ("size", "plus")}
    for size in size_words or {}:
        if size not in sizes:
            raise EntryError(f"{where}: size_words= names {size!r}, not a declared size "
                             f"({', '.join(sorted(sizes))})")
    return Entry(name, doc, args, params, call, tuple((dispatch or {}).items()), api, bool(pdl),
                 bool(errors), tuple(requires), tuple((size_words or {}).items()), bool(bands))


# What BUILD files see, besides op_library and its siblings.
BUILD_FUNCTIONS = {"entry": entry, "tensor": tensor, "scalar": scalar, "choice": choice,
                   "require": require, "params": params}
