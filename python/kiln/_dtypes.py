"""torch dtype <-> kiln's dtype short names (the `dtype` dispatch axis of WORKSPACE.py)."""

from __future__ import annotations

import torch

SHORT_NAME = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
}
TORCH_DTYPE = {v: k for k, v in SHORT_NAME.items()}
