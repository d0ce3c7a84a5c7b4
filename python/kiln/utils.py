"""Capability helpers, in one place (R4.2-4): what the local hardware is, which arch families a
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
    """The backends a target is built for: 'cuda' and/or 'host'."""
    return load_graph().target(label).toolchains


def nvcc_available() -> bool:
    """nvcc is installed, so CUDA modules can be (cross-)compiled here, GPU or not."""
    return toolchain.available("cuda")


def host_compiler_available() -> bool:
    return toolchain.available("host")


def backend_available(label: str, backend: str) -> bool:
    """Can `label` run on `backend` here: declared, and its toolchain (and device) present?"""
    if backend not in backends(label):
        return False
    if backend == "cuda":
        return cuda_available() and nvcc_available() and is_arch_supported(label)
    return host_compiler_available()
