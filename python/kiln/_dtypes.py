"""torch dtype <-> kiln's dtype short names (the `dtype` dispatch axis of WORKSPACE.py)."""

from __future__ import annotations

import torch

SHORT_NAME = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}
TORCH_DTYPE = {v: k for k, v in SHORT_NAME.items()}
