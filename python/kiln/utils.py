"""Capability helpers, in one place: what the local hardware is, which arch families a
target supports, and which backends can run here. Tests skip unsupported hardware through these.
"""

from __future__ import annotations

import functools

import torch

from kiln.codegen.graph import load_graph
from kiln.codegen.specs import arch_families
from kiln.runtime import toolchain
from kiln.runtime.arch import Arch, ArchFamily, supports


def cuda_available() -> bool:
    """A CUDA device is visible to torch."""
    return torch.cuda.is_available()


def compute_capability(device: torch.device | int | str | None = None) -> tuple[int, int]:
    if isinstance(device, torch.device) and device.type != "cuda":
        raise ValueError(f"{device} has no compute capability")
    return torch.cuda.get_device_capability(device)


def get_compute_capability(device: torch.device | int | str | None = None) -> tuple[int, int]:
    """FlashInfer's name for :func:`compute_capability`."""
    return compute_capability(device)


@functools.cache
def _cc_of_index(index: int) -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None  # no CUDA runtime: a "cuda" device here is a fake tensor's (torch.compile tracing)
    return torch.cuda.get_device_capability(index)


def _cuda_cc(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA device, None for any other device (cached per index)."""
    if device.type != "cuda":
        return None
    if device.index is not None:  # a tensor's device always has its index
        return _cc_of_index(device.index)
    return _cc_of_index(torch.cuda.current_device()) if torch.cuda.is_available() else None


def device_support_pdl(device: torch.device) -> bool:
    """Can kernels on `device` use programmatic dependent launch (a CUDA device of sm90 or later)?"""
    cc = _cuda_cc(torch.device(device))
    return cc is not None and cc[0] >= 9


def is_sm90a_supported(device: torch.device) -> bool:
    """Does `device` run sm_90a kernels (wgmma, TMA): compute capability 9.0 exactly."""
    return _cuda_cc(torch.device(device)) == (9, 0)


def use_pdl(enable_pdl: bool | None, device: torch.device) -> bool:
    """FlashInfer's ``enable_pdl`` resolved for one launch: None means "where the device supports
    it", True asks for it (ignored on CPU tensors and below sm90, where there is none), False never."""
    if enable_pdl is False:
        return False
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl must be a bool or None, got {type(enable_pdl).__name__}")
    return device_support_pdl(device)


@functools.cache
def target_arch_families(label: str) -> tuple[ArchFamily, ...]:
    """The GPU arch families a target declares in its BUILD file (empty: no CUDA backend)."""
    graph = load_graph()
    target = graph.target(label)
    return arch_families(graph, target) if target.srcs else ()


def is_arch_supported(label: str, device: torch.device | int | str | None = None) -> bool:
    """Does `label` have CUDA kernels for the compute capability of `device`?"""
    return supports(target_arch_families(label), Arch(*compute_capability(device)))


def require_arch_supported(label: str, device: torch.device) -> None:
    arch = Arch(*compute_capability(device))
    families = target_arch_families(label)
    if not supports(families, arch):
        shown = ", ".join(str(f) for f in families) or "none (no CUDA backend)"
        raise RuntimeError(
            f"{label} has no CUDA kernels for {device} (compute capability {arch.cc}); it supports "
            f"the arch families {shown}. Run it on a supported GPU or on CPU tensors."
        )


def backends(label: str) -> tuple[str, ...]:
    """The backends a target is built for: 'cuda', 'host' and/or 'triton'."""
    return load_graph().target(label).toolchains


def nvcc_available() -> bool:
    """nvcc is installed, so CUDA modules can be (cross-)compiled here, GPU or not."""
    return toolchain.available("cuda")


def host_compiler_available() -> bool:
    return toolchain.available("host")


def precompiled_available(label: str, backend: str, **axes) -> bool:
    """Is a module of `label` for `backend` (the specialisation `axes` names, else any that ships)
    installed precompiled here, for the local GPU? Looks where modules already are (an artifact
    directory, installed packages, the download cache): nothing is downloaded."""
    from kiln import _jit
    from kiln.codegen.dispatch import released, specialisation
    from kiln.codegen.specs import compile_spec
    from kiln.runtime import build, precompiled

    graph = load_graph()
    target = graph.target(label)
    if backend not in target.toolchains:
        return False
    if axes:
        wanted = [specialisation(target, dict(_jit.axis_params(label, "precompiled_available", axes)))]
    else:
        wanted = released(target)
    ctx = _jit.arch_context(label, torch.device("cuda")) if backend in ("cuda", "triton") else None
    for spec in wanted:
        plan = build.plan(compile_spec(spec, backend, graph), ctx)
        if precompiled.find(plan, download=False)[0] is not None:
            return True
    return False


def backend_available(label: str, backend: str, **axes) -> bool:
    """Can `label` run on `backend` here: declared, a device for it, and a compiler or a
    precompiled module (of the specialisation `axes` names, else of any that ships)?"""
    if backend not in backends(label):
        return False
    if backend == "triton":  # CUDA kernels too, compiled by the triton package
        if not (cuda_available() and is_arch_supported(label)):
            return False
        return toolchain.available("triton") or precompiled_available(label, "triton", **axes)
    if backend == "cuda":
        if not (cuda_available() and is_arch_supported(label)):
            return False
        return nvcc_available() or precompiled_available(label, "cuda", **axes)
    return host_compiler_available() or precompiled_available(label, "host", **axes)
