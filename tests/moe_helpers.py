"""The MoE tests' independent oracle: the layer in float32, one token and one of its experts at a
time (kiln.trace.moe.fused_moe_float, the op's reference, works one expert at a time)."""

from __future__ import annotations

import torch

from kiln.trace.moe import act_float


def per_token_reference(x, w13, w2, weights, ids, activation="silu", up_first=False):
    """float32, one token and one of its k experts at a time: sum_j w_j * w2[e] (act(gate) * up)."""
    i = w13.shape[1] // 2
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = w13[e].float().cpu() @ x[t].float().cpu()
            gate, up = (h[i:], h[:i]) if up_first else (h[:i], h[i:])
            out[t] += float(weights[t, j]) * (w2[e].float().cpu() @ (act_float(gate, activation) * up))
    return out
