"""KILN_FORCE_BACKEND: run calls on a chosen backend whatever their tensors' device.

A diagnostic control, never a default: `host` runs CUDA tensors through the CPU backend (copied to
the host and back, synchronising), which tells whether a wrong result or a crash comes from a CUDA
kernel or from its inputs; `cuda` runs CPU tensors through the CUDA kernels. It is announced in the
API log the first time it takes effect, and every record of a forced call says so.

The call gets copies of its tensor arguments on the forced device (a tensor passed twice gets one
copy); afterwards the arguments the API mutates are copied back into the caller's tensors, and a
returned tensor is the caller's own when it is one of those arguments, else a copy on the caller's
device.
"""

from __future__ import annotations

import torch

from .describe import capturing


def device_for(backend: str) -> torch.device:
    if backend == "host":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("KILN_FORCE_BACKEND=cuda, but torch sees no CUDA device here; unset it or "
                           "use KILN_FORCE_BACKEND=host")
    return torch.device("cuda", torch.cuda.current_device())


def run(fn, backend: str, args: tuple, kwargs: dict, mutated: list[str], names: list[str]):
    """fn(*args, **kwargs) with every tensor moved to `backend`'s device.

    names: the parameter name of each positional argument (for `mutated`)."""
    target = device_for(backend)
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(original) -> (original, copy)

    def move(v):
        if isinstance(v, torch.Tensor):
            if v.device == target:
                return v
            if capturing():
                raise RuntimeError(f"KILN_FORCE_BACKEND={backend} copies tensors between devices, "
                                   "which cannot happen while a CUDA graph is being captured; "
                                   "unset it to capture")
            if id(v) not in copies:
                copies[id(v)] = (v, v.detach().to(target))
            return copies[id(v)][1]
        if isinstance(v, list | tuple):
            return type(v)(move(x) for x in v)
        return v

    moved_args = tuple(move(a) for a in args)
    moved_kwargs = {k: move(v) for k, v in kwargs.items()}
    result = fn(*moved_args, **moved_kwargs)

    given = dict(zip(names, args, strict=False)) | kwargs
    for name in mutated:
        original = given.get(name)
        if isinstance(original, torch.Tensor) and id(original) in copies:
            original.copy_(copies[id(original)][1])

    def back(v):
        if isinstance(v, torch.Tensor):
            for original, copy in copies.values():
                if v is copy:  # the caller's own tensor, holding the result
                    return original.copy_(copy)
            home = next(iter(copies.values()))[0].device if copies else v.device
            return v.to(home)
        if isinstance(v, list | tuple):
            return type(v)(back(x) for x in v)
        return v

    return back(result)
