"""Getting the compiled module for an op on a device: the torch-facing side of the JIT.

    module(label, device, api, dtype=torch.bfloat16, head_dim=128, soft_cap=False)

takes the target's dispatch axes as keywords with Python values (a torch dtype, an int, a bool),
checks each against the axis's values in the BUILD file (an error names the API, the axis, the
value and what is supported), and returns the loaded module. module_for(label, params, device) is
the same from axis strings. The backend follows the device (CUDA -> the cuda toolchain, CPU -> the
host toolchain); the device's arch is checked against the target's families; the module is loaded
through kiln.runtime.jit (in-process, precompiled, disk cache, else compile). Both are cached, so
the per-call cost is a dict lookup. Modules(label, "dtype") is the same for a hot call site that
passes its values positionally.
"""

from __future__ import annotations

import functools
import threading

import torch

from kiln.codegen.graph import load_graph
from kiln.codegen.specs import module_spec
from kiln.runtime import jit
from kiln.runtime.arch import Arch, ArchContext, ArchError, format_arch_list

from . import _dtypes, errors, utils
from .diagnostics import hooks

_cache: dict[tuple, object] = {}
_by_value: dict[tuple, object] = {}
_lock = threading.Lock()


def backend_of(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda"
    if device.type == "cpu":
        return "host"
    raise ValueError(f"kiln has no backend for {device.type} tensors; use CUDA or CPU tensors")


@functools.cache
def axis_values(label: str, axis: str) -> tuple[str, ...]:
    return load_graph().target(label).axes[axis]


def arch_context(label: str, device: torch.device) -> ArchContext:
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


def axis_value(value) -> str:
    """The BUILD-file spelling of a dispatch value: bf16 for torch.bfloat16, true, 128."""
    if isinstance(value, torch.dtype):
        return _dtypes.SHORT_NAME.get(value, str(value).removeprefix("torch."))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).lower()


def _shown(axis: str, value: str) -> str:
    return str(_dtypes.TORCH_DTYPE[value]).removeprefix("torch.") if axis == "dtype" else value


def axis_params(label: str, api: str, axes: dict, names: dict | None = None) -> tuple[tuple[str, str], ...]:
    """The (axis, value) pairs of `label` for Python values, in the target's axis order; a TypeError
    (dtype) or ValueError naming the API, the argument (`names[axis]`, else the axis), the value
    and the supported values otherwise."""
    declared = load_graph().target(label).axes
    if set(axes) != set(declared):
        raise TypeError(f"{api}: {label} dispatches on {', '.join(declared) or 'nothing'}, "
                        f"not {', '.join(axes) or 'nothing'}")  # a kiln bug, not a user error
    out = []
    for axis, allowed in declared.items():
        value = axis_value(axes[axis])
        if value not in allowed:
            supported = ", ".join(_shown(axis, v) for v in allowed)
            got = str(axes[axis]).removeprefix("torch.")
            error = TypeError if axis == "dtype" else ValueError
            raise error(f"{api}: {(names or {}).get(axis, axis)} {got} is not supported; supported"
                        f"{' dtypes' if axis == 'dtype' else ''}: {supported}")
        out.append((axis, value))
    return tuple(out)


def module(label: str, device: torch.device, api: str, *, names: dict | None = None, **axes):
    """The module of `label` for these dispatch values (Python values) on `device`; `names` says how
    an error names the argument an axis value came from ({"dtype": "input.dtype"})."""
    key = (label, device, *axes.items())
    found = _by_value.get(key)
    if found is None:
        found = _by_value[key] = module_for(label, axis_params(label, api, axes, names), device)
    elif hooks.module_observer is not None:
        hooks.module_observer(label, None, device, found)
    return found


class Modules:
    """The modules of one target for a call site that passes its dispatch values positionally, in
    the order given here:

        _NORM = _jit.Modules("//ops:norm", "dtype", names={"dtype": "input.dtype"})
        mod = _NORM.get("kiln.rmsnorm", x.device, x.dtype)

    The same modules as module(); the per-call cost is one lookup on (device, *values), where
    module() first builds its key from keywords (0.3-0.35 us more a call, measured)."""

    __slots__ = ("label", "axes", "names", "_found")

    def __init__(self, label: str, *axes: str, names: dict | None = None):
        self.label, self.axes, self.names = label, axes, names
        self._found: dict[tuple, object] = {}

    def get(self, api: str, device: torch.device, *values):
        found = self._found.get((device, *values))
        if found is None:  # module() checks the values and calls the observer
            axes = dict(zip(self.axes, values, strict=True))
            found = module(self.label, device, api, names=self.names, **axes)
            self._found[(device, *values)] = found
        elif hooks.module_observer is not None:
            hooks.module_observer(self.label, None, device, found)
        return found


def module_for(label: str, params: tuple[tuple[str, str], ...], device: torch.device):
    module = _cache.get((label, params, device)) or _load(label, params, device)
    if hooks.module_observer is not None:
        hooks.module_observer(label, params, device, module)
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
                module = jit.load(spec, arch_context(label, device))
            else:
                module = jit.load(spec)
            errors.learn_texts(module)  # the index-error messages it exports (kiln/errors.py)
            _cache[key] = module
    return module


def triton_module(label: str, device: torch.device, api: str, *, names: dict | None = None, **axes):
    """The triton toolchain's module of `label` (runtime/triton_module.py: its cubins, launched
    through the CUDA driver) for these dispatch values on CUDA `device`; cached like `module`."""
    fast = (label, device, "triton", *axes.items())
    found = _by_value.get(fast)
    if found is not None:
        if hooks.module_observer is not None:
            hooks.module_observer(label, None, device, found)
        return found
    if device.type != "cuda":
        raise ValueError(f"{api}: the triton backend runs on CUDA tensors, got {device} tensors")
    params = axis_params(label, api, axes, names)
    key = (label, params, device, "triton")
    found = _cache.get(key)
    if found is None:
        with _lock:
            found = _cache.get(key)
            if found is None:
                utils.require_arch_supported(label, device)
                spec = module_spec(label, dict(params), "triton")
                found = _cache[key] = jit.load(spec, arch_context(label, device))
    _by_value[fast] = found
    if hooks.module_observer is not None:
        hooks.module_observer(label, params, device, found)
    return found


def dl(t: torch.Tensor):
    """A DLPack capsule borrowing `t` (no copy, no stream synchronisation)."""
    return torch._C._to_dlpack(t)


def stream_of(device: torch.device) -> int:
    """The caller's current CUDA stream on `device` as an integer handle (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)
