"""What an op adds to be benchmarked: a Routine (its public API, whose trace template gives the
axes, inputs, reference and tolerance) and the Backends that implement the same computation.

A backend's `setup(inputs, ctx)` runs outside timing and returns the callable that is timed: for
a plain function it binds the inputs (and allocates `out=`); for a plan/run API it constructs the
wrapper and calls plan() there, returning `lambda: wrapper.run(...)`. The timed callable returns
the outputs (a tensor, a tuple in the template's output order, or a dict by output name); for
in-place APIs it returns the mutated inputs. Calls must not synchronise the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.trace import Tensor, TraceTemplate


@dataclass
class SetupContext:
    device: torch.device
    dtype: str  # torch dtype name of the workload
    axes: Mapping[str, int]
    shared: dict[str, Any] = field(default_factory=dict)  # kept across the rotating input sets of
    # one (workload, backend): a place for resources every set can reuse


Setup = Callable[[dict[str, Any], SetupContext], Callable[[], Any]]


def always_available(device: torch.device, dtype: str) -> str | None:
    return None


def cuda_only(device: torch.device, dtype: str = "") -> str | None:
    return None if device.type == "cuda" else f"needs a CUDA device (running on {device.type})"


@dataclass(frozen=True)
class Backend:
    name: str  # "kiln", "torch", "flashinfer", ...
    setup: Setup
    # (device, torch dtype name) -> None, or why this backend cannot run that here (a missing
    # package, a device or dtype it does not support): recorded `unavailable`, not `failed`
    available: Callable[[torch.device, str], str | None] = always_available
    version: Callable[[], str] = lambda: ""


@dataclass(frozen=True)
class Routine:
    api: Callable  # the public kiln API; its trace template names the routine
    backends: tuple[Backend, ...]
    # Counted work per call; default bytes: every input and output tensor once (outputs written
    # in place into an input counted again, as a write). Override when a call touches less
    # (paged attention reads only the used pages) or more.
    bytes_per_call: Callable[[Mapping[str, int], str], int] | None = None
    flops_per_call: Callable[[Mapping[str, int], str], int] | None = None
    max_sets: int | None = None  # cap on rotating input sets (each set's setup may hold state)

    @property
    def template(self) -> TraceTemplate:
        t = getattr(self.api, "__kiln_trace__", None)
        if t is None:
            raise TypeError(f"{self.api.__qualname__} has no trace template; attach one with "
                            "@kiln.trace.traced(...) next to its definition")
        return t

    @property
    def name(self) -> str:
        return self.template.name

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(f"routine {self.name} has no backend {name!r}; it has "
                       f"{', '.join(b.name for b in self.backends)}")

    def counted_bytes(self, axes: Mapping[str, int], dtype: str) -> int:
        if self.bytes_per_call is not None:
            return int(self.bytes_per_call(axes, dtype))
        return io_bytes(self.template, axes, dtype)

    def counted_flops(self, axes: Mapping[str, int], dtype: str) -> int | None:
        return None if self.flops_per_call is None else int(self.flops_per_call(axes, dtype))


def io_bytes(t: TraceTemplate, axes: Mapping[str, int], dtype: str) -> int:
    """Bytes of every tensor input read once plus every output written once."""
    total = 0
    for spec in [*t.inputs.values(), *t.outputs.values()]:
        if isinstance(spec, Tensor):
            total += math.prod(t.shape_of(spec, axes)) * t.dtype_of(spec, dtype).itemsize
    return total
