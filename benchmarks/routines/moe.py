"""Routines of kiln.moe: moe_topk, moe_align_block_size, moe_permute, moe_unpermute, fused_moe and
cutlass_fused_moe, each after a reference check (the trace template's).

Peers:
  routing / data movement   torch: what a model writes without a kernel (the references' torch
                            code: softmax/sigmoid + a stable sort; a stable argsort + gather;
                            index_add), vectorised for align
  fused_moe                 kiln_triton: kiln.fused_moe(backend="triton"), the grouped path on
                            the Triton grouped GEMM at every T (kiln: the CUDA backend);
                            torch_grouped_mm: the issue's torch pipeline (stable sort by expert,
                            torch._grouped_mm up, silu * mul, torch._grouped_mm down, weighted
                            index_add in float32); bf16 on sm90+
  cutlass_fused_moe         FlashInfer 0.7's cutlass_fused_moe (bf16, fc1 up rows first, as kiln's)
                            and the same torch pipeline reading the up-first fc1

The layer's counted bytes are what the floor needs: the weights of the experts the routing
selects (expected distinct experts of uniform random routing, E (1 - (1 - k/E)^T)), plus the
hidden states and the output once; its FLOPs are 6 T k H I (three H x I products per routed row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln
from kiln.trace import moe as moe_traces

from ..routine import Backend, Routine
from .gemm import _flashinfer_on, _grouped_mm_available, _nan_out, _triton_available
from .norm import _flashinfer, flashinfer_version, kiln_version, torch_version

# --- routing and data movement ---------------------------------------------------------------------

_TOPK_ARGS = (
    "top_k",
    "renormalize",
    "scoring",
    "num_expert_group",
    "topk_group",
    "correction_bias",
    "routed_scaling_factor",
)


def kiln_topk(inp, ctx):
    x, args = inp["router_logits"], {k: inp[k] for k in _TOPK_ARGS}
    return lambda: kiln.moe_topk(x, **args)


def torch_topk(inp, ctx):
    x, args = inp["router_logits"], {k: inp[k] for k in _TOPK_ARGS}
    return lambda: moe_traces.moe_topk_float(x, **args)


def kiln_align(inp, ctx):
    ids, bs, e = inp["topk_ids"], inp["block_size"], inp["num_experts"]
    return lambda: kiln.moe_align_block_size(ids, bs, e)


def torch_align(inp, ctx):
    """vLLM's align in torch ops on the device (no -1 ids in the workloads)."""
    ids, bs, e = inp["topk_ids"], inp["block_size"], inp["num_experts"]
    flat = ids.flatten().long()
    n = flat.numel()
    length = n + e * (bs - 1)
    blocks = -(-length // bs)

    def run():
        sorted_e, order = torch.sort(flat, stable=True)
        counts = torch.bincount(flat, minlength=e)
        padded = (counts + bs - 1) // bs * bs
        pend = padded.cumsum(0)
        start = counts.cumsum(0) - counts
        rank = torch.arange(n, device=flat.device) - start[sorted_e]
        out = torch.full((length,), n, dtype=torch.int32, device=flat.device)
        out[(pend - padded)[sorted_e] + rank] = order.to(torch.int32)
        pos = torch.arange(blocks, device=flat.device) * bs
        expert = torch.searchsorted(pend, pos, right=True)
        expert = torch.where(pos < pend[-1], expert, -1).to(torch.int32)
        return out, expert, pend[-1:].to(torch.int32)

    return run


def kiln_permute(inp, ctx):
    x, ids, e = inp["hidden_states"], inp["topk_ids"], inp["num_experts"]
    return lambda: kiln.moe_permute(x, ids, e)


def torch_permute(inp, ctx):
    x, ids, e = inp["hidden_states"], inp["topk_ids"], inp["num_experts"]
    return lambda: moe_traces.moe_permute_float(x, ids, e)


def kiln_unpermute(inp, ctx):
    rows, w, src = inp["permuted_rows"], inp["topk_weights"], inp["src_idx"]
    out = _nan_out((w.shape[0], rows.shape[1]), rows.dtype, rows.device)
    return lambda: kiln.moe_unpermute(rows, w, src, out=out)


def torch_unpermute(inp, ctx):
    rows, w, src = inp["permuted_rows"], inp["topk_weights"], inp["src_idx"]
    return lambda: moe_traces.moe_unpermute_float(rows, w, src).to(rows.dtype)


def _rows(axes):
    return axes["tokens"] * axes["top_k"]


MOE_TOPK = Routine(
    api=kiln.moe_topk,
    backends=(
        Backend("kiln", kiln_topk, version=kiln_version),
        Backend("torch", torch_topk, version=torch_version),
    ),
    flops_per_call=lambda axes, dtype: 8 * axes["tokens"] * axes["num_experts"],
)
MOE_ALIGN_BLOCK_SIZE = Routine(
    api=kiln.moe_align_block_size,
    backends=(
        Backend("kiln", kiln_align, version=kiln_version),
        Backend("torch", torch_align, version=torch_version),
    ),
)
MOE_PERMUTE = Routine(
    api=kiln.moe_permute,
    backends=(
        Backend("kiln", kiln_permute, version=kiln_version),
        Backend("torch", torch_permute, version=torch_version),
    ),
)
MOE_UNPERMUTE = Routine(
    api=kiln.moe_unpermute,
    backends=(
        Backend("kiln", kiln_unpermute, version=kiln_version),
        Backend("torch", torch_unpermute, version=torch_version),
    ),
    flops_per_call=lambda axes, dtype: 2 * _rows(axes) * axes["hidden"],
)

# --- the layer ---------------------------------------------------------------------------------------


def torch_pipeline(x, w13, w2, weights, ids, up_first=False):
    """The issue's torch reference pipeline built from torch._grouped_mm."""
    t, k = ids.shape
    e, two_i, _ = w13.shape
    i = two_i // 2
    flat = ids.flatten().long()
    sorted_e, order = torch.sort(flat, stable=True)
    offs = torch.bincount(flat, minlength=e).cumsum(0).to(torch.int32)
    tok = order // k
    h = torch._grouped_mm(x[tok], w13.transpose(1, 2), offs=offs)
    gate, up = (h[:, i:], h[:, :i]) if up_first else (h[:, :i], h[:, i:])
    y = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)
    out = torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, y.float() * weights.flatten()[order][:, None])
    return out.to(x.dtype)


def kiln_fused(inp, ctx):
    args = [inp[n] for n in ("hidden_states", "w13", "w2", "topk_weights", "topk_ids")]
    out = _nan_out(args[0].shape, args[0].dtype, args[0].device)
    return lambda: kiln.fused_moe(*args, out=out)


def kiln_triton_fused(inp, ctx):
    """backend="triton": the layer's GEMMs on kiln's Triton grouped GEMM at every batch size."""
    args = [inp[n] for n in ("hidden_states", "w13", "w2", "topk_weights", "topk_ids")]
    out = _nan_out(args[0].shape, args[0].dtype, args[0].device)
    return lambda: kiln.fused_moe(*args, out=out, backend="triton")


def torch_fused(inp, ctx):
    args = [inp[n] for n in ("hidden_states", "w13", "w2", "topk_weights", "topk_ids")]
    return lambda: torch_pipeline(*args)


_CUTLASS = (
    "input",
    "token_selected_experts",
    "token_final_scales",
    "fc1_expert_weights",
    "fc2_expert_weights",
)


def kiln_cutlass(inp, ctx):
    args = [inp[n] for n in _CUTLASS]
    out = _nan_out(args[0].shape, args[0].dtype, args[0].device)
    return lambda: kiln.cutlass_fused_moe(*args, args[0].dtype, output=out)[0]


def torch_cutlass(inp, ctx):
    x, ids, w, fc1, fc2 = (inp[n] for n in _CUTLASS)
    return lambda: torch_pipeline(x, fc1, fc2, w, ids, up_first=True)


def flashinfer_cutlass(inp, ctx):
    fn = _flashinfer()[0].fused_moe.cutlass_fused_moe
    x, ids, w, fc1, fc2 = (inp[n] for n in _CUTLASS)
    out = _nan_out(x.shape, x.dtype, x.device)

    def run():
        r = fn(x, ids, w, fc1, fc2, x.dtype, quant_scales=None, output=out)
        return r[0] if isinstance(r, list | tuple) else r

    return run


def flashinfer_cutlass_available(device, dtype):
    return _flashinfer_on(device, dtype, min_cc=(9, 0), why="(kiln's round runs it on sm90)")


def layer_bytes(axes, dtype) -> int:
    t, e, k, h, i = (axes[n] for n in ("tokens", "num_experts", "top_k", "hidden", "intermediate"))
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    experts = e * (1 - (1 - k / e) ** t)
    return int(experts * 3 * h * i * elem + 2 * t * h * elem + t * k * 8)


def layer_flops(axes, dtype) -> int:
    return 6 * axes["tokens"] * axes["top_k"] * axes["hidden"] * axes["intermediate"]


FUSED_MOE = Routine(
    api=kiln.fused_moe,
    backends=(
        Backend("kiln", kiln_fused, version=kiln_version),
        Backend("kiln_triton", kiln_triton_fused, available=_triton_available, version=kiln_version),
        Backend("torch_grouped_mm", torch_fused, available=_grouped_mm_available, version=torch_version),
    ),
    bytes_per_call=layer_bytes,
    flops_per_call=layer_flops,
    max_sets=2,
)
CUTLASS_FUSED_MOE = Routine(
    api=kiln.cutlass_fused_moe,
    backends=(
        Backend("kiln", kiln_cutlass, version=kiln_version),
        Backend(
            "flashinfer",
            flashinfer_cutlass,
            available=flashinfer_cutlass_available,
            version=flashinfer_version,
        ),
        Backend("torch_grouped_mm", torch_cutlass, available=_grouped_mm_available, version=torch_version),
    ),
    bytes_per_call=layer_bytes,
    flops_per_call=layer_flops,
    max_sets=2,
)

ROUTINES = (MOE_TOPK, MOE_ALIGN_BLOCK_SIZE, MOE_PERMUTE, MOE_UNPERMUTE, FUSED_MOE, CUTLASS_FUSED_MOE)
