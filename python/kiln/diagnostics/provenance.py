"""What a call record says about where the call ran: the device and its arch, the compiled
module (URI, cache keys, archs, flags, from the metadata beside its library), the kiln, Python and
torch versions, and every KILN_* variable that is set."""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

import torch

from kiln.runtime import env, metadata
from kiln.runtime.sources import kiln_version


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {"device": f"cuda:{index}", "name": torch.cuda.get_device_name(index),
                "arch": f"{major}.{minor}"}
    return {"device": str(device), "name": platform.processor() or platform.machine(),
            "arch": platform.machine()}


@functools.cache
def _metadata(library: str) -> dict:
    try:
        md = metadata.read(Path(library).parent)
    except metadata.CorruptMetadata as e:
        return {"metadata": str(e)}
    if md is None:
        return {"metadata": f"none beside {library}"}
    return {"label": md.label, "spec_key": md.spec_key, "action_key": md.action_key,
            "archs": md.archs, "toolchain": md.toolchain, "flags": md.key_parts.get("flags"),
            "build_env": md.key_parts.get("env")}


def module_info(module, backend: str) -> dict:
    """The loaded kiln module a call used, and the cache metadata of its library."""
    library = getattr(module, "__file__", None) or ""
    info = {"module": module.__name__, "uri": getattr(module, "uri", None), "backend": backend,
            "library": library}
    if library:
        info.update(_metadata(library))
    return info


def module_summary(info: dict) -> str:
    """One line for the log: 'norm_dtype_f32_host (//ops:norm, host backend, spec key 1a2b..)'."""
    key = info.get("spec_key")
    parts = [info.get("label") or info.get("uri") or "?", f"{info['backend']} backend"]
    if info.get("archs"):
        parts.append("archs " + " ".join(info["archs"]))
    parts.append(f"spec key {key[:16]}" if key else info.get("metadata", "no metadata"))
    return f"{info['module']} ({', '.join(parts)})"


def kiln_env() -> dict[str, str]:
    """Every KILN_* variable (and the other declared knobs) that is set, as set."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("KILN_") or k in env.KNOBS}


def environment() -> dict:
    try:
        non_default = env.non_default()
    except env.EnvError as e:  # an unrelated knob holds a bad value: record that instead
        non_default = {"error": str(e)}
    return {"kiln_version": kiln_version(), "python": sys.version.split()[0],
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "platform": platform.platform(), "env": kiln_env(), "non_default": non_default}
