"""Facts recorded with every result: the device (name, arch, caches), the software (kiln
version and git commit, torch, Python, CUDA) and the time."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import torch

import kiln

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CPU_CACHE = 32 << 20  # when sysfs does not say
DEFAULT_GPU_L2 = 128 << 20  # when torch does not say: at least any current GPU's L2


def pick_device(name: str) -> torch.device:
    """'auto': the GPU when torch sees one, else the CPU (kiln's host backend)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device here; use --device cpu or auto")
    if name not in ("cuda", "cpu"):
        raise ValueError(f"--device must be auto, cuda or cpu, got {name!r}")
    return torch.device(name)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_cache_bytes() -> int:
    """The largest CPU cache (sysfs), the cache a cold-cache rotation has to exceed."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return max(sizes, default=DEFAULT_CPU_CACHE)


@functools.cache
def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": p.name, "arch": f"{p.major}.{p.minor}",
                "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
                "cache_bytes": int(getattr(p, "L2_cache_size", 0) or 0) or DEFAULT_GPU_L2}
    return {"type": "cpu", "name": _cpu_name(), "arch": platform.machine(),
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cache_bytes": cpu_cache_bytes()}


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


@functools.cache
def software() -> dict:
    commit = _git("rev-parse", "--verify", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "kiln_version": str(kiln.__version__),
        "git_commit": commit or "unknown",
        "git_dirty": None if status is None else bool(status),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
