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


def _kiln_op(name: str, fn: Callable, mutates: tuple[str, ...]) -> Callable:
    """A launcher and its torch custom op as one function, which picks the op while torch.compile
    traces and the launcher otherwise; `.eager`, `.op` and `.name` are the parts. A closure rather
    than an object with __call__: this runs on every call, and the closure costs ~0.2 us less."""
    qualname = f"kiln::{name}"
    op = torch.library.custom_op(qualname, mutates_args=mutates)(logged_api(qualname, mutates=mutates)(fn))
    op.register_fake(_nothing)
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
