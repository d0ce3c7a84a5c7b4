"""torch dtype <-> kiln's dtype short names (the `dtype` dispatch axis of WORKSPACE.py)."""

from __future__ import annotations

import torch

SHORT_NAME = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
}
TORCH_DTYPE = {v: k for k, v in SHORT_NAME.items()}


def short_name(dtype: torch.dtype, api: str, supported: tuple[str, ...]) -> str:
    """kiln's name for `dtype`, or a TypeError listing what `api` supports."""
    name = SHORT_NAME.get(dtype)
    if name is None or name not in supported:
        allowed = ", ".join(str(TORCH_DTYPE[s]).removeprefix("torch.") for s in supported)
        raise TypeError(
            f"{api}: input.dtype {str(dtype).removeprefix('torch.')} is not supported; "
            f"supported dtypes: {allowed}"
        )
    return name
