"""Registering a kiln launcher as a torch custom op, so torch.compile(fullgraph=True) traces through
kiln calls and CUDA graphs capture them.

    @custom_op("rmsnorm", mutates=("out",))
    def _rmsnorm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        ...                                      # call the module's launcher

    _rmsnorm(out, x, w, 1e-6)    # eager: the function itself (no dispatcher); while torch.compile
                                 # traces: the custom op kiln::rmsnorm

Every kiln op writes its results into tensors the Python API allocated (`mutates`) and returns
None, so the fake implementation (what torch.compile runs on fake tensors) has nothing to compute.
The op is logged under its own name ("kiln::rmsnorm"): a compiled graph calls it at run time.
It is defined with torch.library.Library (define, then one kernel per dispatch key: the ones
torch.library.custom_op registers), not with custom_op itself, whose registration costs 1-2 ms an
op at import (see _register).
The function's annotations are its schema (torch.Tensor, int, float, bool, str, and
`torch.Tensor | None`).

kiln ops are inference ops: they record no autograd graph. A call with an input that requires
grad while grad mode is on gets a warning, once per op (the result has no grad_fn); run under
torch.inference_mode() or torch.no_grad() to silence it.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import torch
from torch._library.custom_ops import increment_version

from .api_logging import logged_api

_warned: set[str] = set()


def inference_only(name: str, *args) -> None:
    """Warn once per op when an input requires grad and grad mode is on (kiln has no backward)."""
    if name in _warned or not torch.is_grad_enabled():
        return
    for a in args:  # (a loop, not any() over a generator: this runs on every call in grad mode)
        if isinstance(a, torch.Tensor) and a.requires_grad:
            break
    else:
        return
    _warned.add(name)
    warnings.warn(
        f"{name}: kiln ops are inference-only and record no autograd graph; an input "
        "requires grad, and the result will have no grad_fn. Run under "
        "torch.inference_mode() or torch.no_grad().",
        UserWarning,
        stacklevel=3,
    )


# One torch.library.Library per op, as torch.library.custom_op keeps them: running a family module
# again (importlib.reload) replaces its ops instead of failing on a second definition.
_LIBRARIES: dict[str, torch.library.Library] = {}


def _register(name: str, fn: Callable, mutates: tuple[str, ...]) -> torch._ops.OpOverload:
    """Define kiln::<name> from fn's annotations and register the kernels torch.library.custom_op
    would: fn (logged under the op's name) for every backend, the fake implementation, autograd
    (no formula: the outputs are the mutated inputs, and the op returns nothing) and the version
    bump of each mutated input. Through torch.library.Library directly: custom_op costs 1-2 ms an
    op on the 2-core box (it creates a dataclass per op, and its register_fake reads the caller's
    source and scans sys.modules), this ~0.4 ms (docs/perf/compile-time.md)."""
    schema = torch.library.infer_schema(fn, mutates_args=mutates)
    if not schema.endswith("-> ()"):  # the fake and autograd kernels below assume no result
        raise TypeError(f"kiln::{name}: a kiln op writes into its `mutates` arguments and returns None, "
                        f"got the schema {schema}")
    old = _LIBRARIES.pop(name, None)
    if old is not None:
        old._destroy()
    lib = _LIBRARIES[name] = torch.library.Library("kiln", "FRAGMENT")
    lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    op = getattr(torch.ops.kiln, name).default
    # custom_op's backend kernel, without its aliasing check (there is no result to alias);
    # _disable_dynamo imports torch._dynamo on the op's first dispatch, never at registration
    lib.impl(name, torch._disable_dynamo(logged_api(f"kiln::{name}", mutates=mutates)(fn)),
             "CompositeExplicitAutograd")
    lib.impl(name, _nothing, "Meta")  # what torch.compile runs on fake tensors: nothing to compute
    below_autograd, below_inplace = torch._C._after_autograd_keyset, torch._C._after_ADInplaceOrView_keyset

    def autograd(keyset, *args, **kwargs):  # custom_op's, for an op with no result and no formula
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & below_autograd, *args, **kwargs)

    lib.impl(name, autograd, "Autograd", with_keyset=True)
    mutated = tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write)
    if mutated:
        def inplace_or_view(keyset, *args, **kwargs):  # the version bump custom_op registers
            for i, arg in mutated:  # (a list of tensors too: increment_version takes either)
                increment_version(args[i] if i < len(args) else kwargs.get(arg))
            return op.redispatch(keyset & below_inplace, *args, **kwargs)

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Warning only once for all operators",
                                    category=UserWarning)
            lib.impl(name, inplace_or_view, "ADInplaceOrView", with_keyset=True)
    return op


def _kiln_op(name: str, fn: Callable, mutates: tuple[str, ...]) -> Callable:
    """A launcher and its torch custom op as one function, which picks the op while torch.compile
    traces and the launcher otherwise; `.eager`, `.op` (the OpOverload kiln::<name>.default) and
    `.name` are the parts. A closure rather than an object with __call__: this runs on every call,
    and the closure costs ~0.2 us less."""
    qualname = f"kiln::{name}"
    op = _register(name, fn, mutates)
    tensor_args = _tensor_positions(fn)  # the grad check reads only the schema's tensors
    is_compiling, grad_enabled = torch.compiler.is_compiling, torch.is_grad_enabled

    def call(*args, **kwargs) -> None:
        if is_compiling():
            return op(*args, **kwargs)
        if grad_enabled() and qualname not in _warned:
            for i in tensor_args:
                if i < len(args) and args[i] is not None and args[i].requires_grad:
                    inference_only(qualname, args[i])
                    break
            else:
                if kwargs:
                    inference_only(qualname, *kwargs.values())
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = fn.__name__
    call.__doc__ = fn.__doc__
    call.name, call.eager, call.op = qualname, fn, op
    return call


def _tensor_positions(fn: Callable) -> tuple[int, ...]:
    """The indices of fn's parameters annotated torch.Tensor or torch.Tensor | None."""
    params = inspect.signature(fn, eval_str=True).parameters.values()
    return tuple(i for i, p in enumerate(params) if p.annotation in (torch.Tensor, torch.Tensor | None))


def _nothing(*args, **kwargs) -> None:
    return None


def custom_op(name: str, mutates: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Register the decorated launcher as kiln::<name>, writing the arguments `mutates` names."""
    return lambda fn: _kiln_op(name, fn, tuple(mutates))
