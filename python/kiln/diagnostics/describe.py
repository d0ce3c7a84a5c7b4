"""Arguments and results as log text: tensors by their metadata (level 3) and, only at level 5,
their statistics. Statistics read the tensor's values, which synchronises with the device,
so they are skipped while a CUDA graph is being captured.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch

_MAX_REPR = 200
CAPTURE_NOTE = "skipped: a CUDA graph is being captured"


def capturing() -> bool:
    """Is the current CUDA stream capturing a graph? (False, cheaply, when CUDA was never used.)"""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def named_arguments(sig: inspect.Signature | None, args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """(parameter name, value) for every argument as passed; defaults are not filled in."""
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            bound = None  # the call itself will raise the TypeError; log what was passed
        if bound is not None:
            out = []
            for name, value in bound.arguments.items():
                kind = sig.parameters[name].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    out += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    out += list(value.items())
                else:
                    out.append((name, value))
            return out
    return [(f"args[{i}]", v) for i, v in enumerate(args)] + list(kwargs.items())


def tensor(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    offset = f", offset={t.storage_offset()}" if t.storage_offset() else ""
    ptr = f", ptr=0x{t.data_ptr():x}" if t.device.type != "meta" else ""
    return (f"Tensor(shape={list(t.shape)}, dtype={str(t.dtype).removeprefix('torch.')}, "
            f"device={t.device}, strides={list(t.stride())}{offset}, {layout}{ptr})")


def value(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return tensor(v)
    if v is None or isinstance(v, bool | int | float | str | torch.dtype | torch.device):
        return repr(v)
    if isinstance(v, list | tuple):
        inner = ", ".join(value(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    text = repr(v)
    if len(text) > _MAX_REPR:
        text = text[:_MAX_REPR] + "..."
    return f"<{type(v).__qualname__}> {text}"


def tensors_in(v: object, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in a value (itself, or inside lists and tuples), with a name for each."""
    if isinstance(v, torch.Tensor):
        yield name, v
    elif isinstance(v, list | tuple):
        for i, x in enumerate(v):
            yield from tensors_in(x, f"{name}[{i}]")


def stats(t: torch.Tensor) -> str:
    """min, max and mean of the finite values, and the NaN and Inf counts (reads the values)."""
    if t.numel() == 0:
        return "empty"
    if t.is_complex() or t.device.type == "meta":
        return f"no statistics for {t.dtype} on {t.device}"
    x = t.detach()
    if x.dtype == torch.bool:
        return f"true={int(x.sum().item())} of {x.numel()}"
    nan = inf = 0
    if x.is_floating_point() and x.element_size() == 1:
        x = x.float()  # fp8: torch has no isnan/isinf for it; widening keeps every value exactly
    if x.is_floating_point():
        nan = int(torch.isnan(x).sum().item())
        inf = int(torch.isinf(x).sum().item())
        if nan or inf:
            x = x[torch.isfinite(x)]
    if x.numel() == 0:
        return f"no finite values, nan={nan} inf={inf}"
    x = x if x.dtype == torch.float64 else x.float()
    lo, hi = torch.aminmax(x)
    return (f"min={lo.item():.6g} max={hi.item():.6g} mean={x.mean().item():.6g} "
            f"nan={nan} inf={inf}")
