"""The MoE tests' independent oracles: the layer in float32, one token and one of its experts at a
time (kiln.trace.moe.fused_moe_float, the op's reference, works one expert at a time), for
fused_moe's activations and for cutlass_fused_moe's (activation types, parameters, biases, EP)."""

from __future__ import annotations

import math

import torch

from kiln.trace.moe import act_float, expert_act_float


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


def cutlass_reference(
    x, fc1, fc2, weights, ids, kind="swiglu", params=(1.0, 0.0, math.inf), b1=None, b2=None, first=0
):
    """FlashInfer's cutlass_fused_moe, float32, one token and one of its k experts at a time: fc1
    [E, 2I, H] up rows then gate (gated kinds) or [E, I, H]; `kind` and params p0..p2 (floats or
    one per expert) as kiln.trace.moe.expert_act_float; b1 [E, rows of fc1], b2 [E, H] biases; this
    rank holds global experts [first, first + E) and every other id adds nothing."""
    e_count, rows, _ = fc1.shape
    gated = kind in ("swiglu", "swiglu_step", "geglu", "geglu_tanh", "situ")
    i = rows // 2 if gated else rows
    out = torch.zeros((x.shape[0], fc2.shape[1]), dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - first
            if not 0 <= e < e_count:
                continue
            h = fc1[e].float().cpu() @ x[t].float().cpu()
            if b1 is not None:
                h = h + b1[e].float().cpu()
            p = [float(v[e]) if isinstance(v, list | tuple | torch.Tensor) else v for v in params]
            a = expert_act_float(kind, h[i:], h[:i], *p) if gated else expert_act_float(kind, h, None, *p)
            y = fc2[e].float().cpu() @ a
            if b2 is not None:
                y = y + b2[e].float().cpu()
            out[t] += float(weights[t, j]) * y
    return out
