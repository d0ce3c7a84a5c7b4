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
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .api_logging import logged_api


class KilnOp:
    """A launcher and its torch custom op; calling it picks one by whether torch.compile traces."""

    def __init__(self, name: str, fn: Callable, mutates: tuple[str, ...]):
        self.name = f"kiln::{name}"
        self.eager = fn
        self.op = torch.library.custom_op(self.name, mutates_args=mutates)(
            logged_api(self.name, mutates=mutates)(fn))
        self.op.register_fake(_nothing)

    def __call__(self, *args, **kwargs) -> None:
        if torch.compiler.is_compiling():
            return self.op(*args, **kwargs)
        return self.eager(*args, **kwargs)


def _nothing(*args, **kwargs) -> None:
    return None


def custom_op(name: str, mutates: tuple[str, ...]) -> Callable[[Callable], KilnOp]:
    """Register the decorated launcher as kiln::<name>, writing the arguments `mutates` names."""
    return lambda fn: KilnOp(name, fn, tuple(mutates))
