"""Getting the compiled module for an op on a device: the torch-facing side of the JIT.

module_for(label, params, device) picks the backend from the device (CUDA -> the cuda toolchain,
CPU -> the host toolchain), checks the device's arch against the target's families, and loads the
module through kiln.runtime.jit (in-process, precompiled, disk cache, else compile). Results are
cached per (label, params, device) so the per-call cost is a dict lookup.
"""

from __future__ import annotations

import functools
import threading

import torch

from kiln.codegen.graph import load_graph
from kiln.codegen.specs import module_spec
from kiln.runtime import jit
from kiln.runtime.arch import Arch, ArchContext, ArchError, format_arch_list

from . import utils

_cache: dict[tuple, object] = {}
_lock = threading.Lock()
# Set by API logging when diagnostics are on (kiln/diagnostics/call.py), so a logged call can
# record which module it used before the kernel runs; None otherwise (one global read per call).
module_observer = None


def backend_of(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda"
    if device.type == "cpu":
        return "host"
    raise ValueError(f"kiln has no backend for {device.type} tensors; use CUDA or CPU tensors")


@functools.cache
def axis_values(label: str, axis: str) -> tuple[str, ...]:
    return load_graph().target(label).axes[axis]


def _arch_context(label: str, device: torch.device) -> ArchContext:
    """The arch context for a module used on `device`: the requested list must cover it."""
    ctx = ArchContext.current()
    dev_arch = Arch(*utils.compute_capability(device))
    if not ctx.requested:
        # No arch list and the driver query saw no device: use the framework's view of it.
        ctx = ArchContext((dev_arch,), f"device {device} ({dev_arch})")
    if not any(a.cc == dev_arch.cc for a in ctx.requested):
        raise ArchError(
            f"{label} on {device} needs compute capability {dev_arch.cc}, but the arch list in force "
            f"[{format_arch_list(ctx.requested)}] ({ctx.source}) does not include it; add "
            f"{dev_arch.cc} to KILN_CUDA_ARCH_LIST or unset it"
        )
    return ctx


def module_for(label: str, params: tuple[tuple[str, str], ...], device: torch.device):
    module = _cache.get((label, params, device)) or _load(label, params, device)
    if module_observer is not None:
        module_observer(label, params, device, module)
    return module


def _load(label: str, params: tuple[tuple[str, str], ...], device: torch.device):
    key = (label, params, device)
    with _lock:
        module = _cache.get(key)
        if module is None:
            backend = backend_of(device)
            spec = module_spec(label, dict(params), backend)
            if backend == "cuda":
                utils.require_arch_supported(label, device)
                module = jit.load(spec, _arch_context(label, device))
            else:
                module = jit.load(spec)
            _cache[key] = module
    return module


def dl(t: torch.Tensor):
    """A DLPack capsule borrowing `t` (no copy, no stream synchronisation)."""
    return torch._C._to_dlpack(t)


def stream_of(device: torch.device) -> int:
    """The caller's current CUDA stream on `device` as an integer handle (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)
