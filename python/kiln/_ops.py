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


class KilnOp:
    """A launcher and its torch custom op; calling it picks one by whether torch.compile traces."""

    def __init__(self, name: str, fn: Callable, mutates: tuple[str, ...]):
        self.name = f"kiln::{name}"
        self.eager = fn
        self.op = torch.library.custom_op(self.name, mutates_args=mutates)(
            logged_api(self.name, mutates=mutates)(fn)
        )
        self.op.register_fake(_nothing)
        # the positions the schema declares as tensors: the grad check reads only those
        self._tensor_args = _tensor_positions(fn)

    def __call__(self, *args, **kwargs) -> None:
        if torch.compiler.is_compiling():
            return self.op(*args, **kwargs)
        if torch.is_grad_enabled() and self.name not in _warned:
            for i in self._tensor_args:
                if i < len(args) and args[i] is not None and args[i].requires_grad:
                    inference_only(self.name, args[i])
                    break
            else:
                if kwargs:
                    inference_only(self.name, *kwargs.values())
        return self.eager(*args, **kwargs)


def _tensor_positions(fn: Callable) -> tuple[int, ...]:
    """The indices of fn's parameters annotated torch.Tensor or torch.Tensor | None."""
    params = inspect.signature(fn, eval_str=True).parameters.values()
    return tuple(i for i, p in enumerate(params) if p.annotation in (torch.Tensor, torch.Tensor | None))


def _nothing(*args, **kwargs) -> None:
    return None


def custom_op(name: str, mutates: tuple[str, ...]) -> Callable[[Callable], KilnOp]:
    """Register the decorated launcher as kiln::<name>, writing the arguments `mutates` names."""
    return lambda fn: KilnOp(name, fn, tuple(mutates))
