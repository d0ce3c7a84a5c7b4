"""Mixture of experts (//ops:moe): routing, data movement and the fused layer, with vLLM's, SGLang's
and FlashInfer's names and argument order.

    moe_topk(router_logits, top_k, renormalize=True, scoring="softmax", num_expert_group=None,
             topk_group=None, correction_bias=None, routed_scaling_factor=1.0)
                                                   -> (topk_weights f32 [T, k], topk_ids i32 [T, k])
    moe_align_block_size(topk_ids, block_size, num_experts)
                                  -> (sorted_token_ids, expert_ids, num_tokens_post_padded)  (vLLM)
    moe_permute(hidden_states, topk_ids, num_experts)   -> (permuted [T*k, H], offs [E], src_idx [T*k])
    moe_unpermute(permuted_rows, topk_weights, src_idx) -> out [T, H]
    fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, activation="silu", w13_scale=None,
              w2_scale=None, out=None, *, backend="auto")     w13 [E, 2I, H]: gate rows, then up
    cutlass_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights,
                      fc2_expert_weights, output_dtype=None, quant_scales=None, ... FlashInfer
                      0.7.2's 36 positional and 4 keyword-only arguments) -> [output]
                                                               fc1 [E, 2I, H]: up rows, then gate
    cutlass_fused_moe_workspace_size(max_num_tokens, hidden_size, intermediate_size,
                                     num_experts_total, top_k, *, x_dtype, weight_dtype, ...)
    ActivationType                                             FlashInfer's enum (its values)

The layer is moe_permute -> kiln.grouped_mm (gate and up in one GEMM) -> silu/gelu-tanh-and-mul ->
kiln.grouped_mm (down) -> moe_unpermute (the weighted sum over the k experts, float32); with fp8
weights the GEMMs are kiln.group_gemm_fp8_nt_groupwise on activations quantised per 1 x 128
(kiln.per_token_group_quant_fp8); at decode
sizes (T <= 64, T*k <= 8E) the two GEMMs and the activation are the small-batch expert kernels
instead (the activation fused into the up projection; only the selected experts' weights read).
backend= picks the grouped GEMMs' backend: "triton" runs both projections through
kiln.grouped_mm(backend="triton") at every batch size (never the small-batch kernels), "cuda" and
"auto" (today the same: measured, docs/perf/gemm-triton.md) the CUDA ones. Every step
is a launch of a size fixed by the shapes: no host synchronisation, no allocation that depends on
the routing, so the layer captures in a CUDA graph and replays with new routing. Expert id -1 (an
expert of another rank) contributes nothing. Ids outside [-1, E) are an IndexError at once on the
CPU and with KILN_VALIDATE_INDICES=1; on CUDA they give no row and are recorded for
kiln.check_errors(). cutlass_fused_moe's other activation types, biases and activation parameters
take the generic path: the up projection whole, kiln's expert_act kernel (per-expert parameters),
the down projection; expert parallelism maps global ids in the sort; a workspace_buffer holds every
scratch tensor. docs/moe.md has the layouts, the tie rules and what each refuses.
"""

from __future__ import annotations

import enum
import math

import torch

from . import _jit, errors
from ._ops import custom_op
from .activation import gelu_tanh_and_mul, silu_and_mul
from .api_logging import logged_api
from .gemm import _group_fp8, grouped_mm
from .quantization import per_token_group_quant_fp8
from .trace import moe as moe_traces
from .trace import traced

LABEL = "//ops:moe"
_16BIT = (torch.bfloat16, torch.float16)
_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
_INDEX = (torch.int32, torch.int64)
SCORINGS = ("softmax", "sigmoid")
ACTIVATIONS = {"silu": silu_and_mul, "gelu": gelu_tanh_and_mul}
# The layer's GEMM backends (kiln.grouped_mm's): "auto" is "cuda" until a measurement says
# otherwise (docs/perf/gemm-triton.md: the triton grouped GEMM wins only in a narrow band).
BACKENDS = ("auto", "cuda", "triton")
BLOCK = 128  # fp8 block scales: 128 x 128 weights share one float32 scale (DeepSeek-V3)
# The small-batch path (ops/moe/moe.cuh's expert kernels) runs for at most this many tokens when
# the routed rows average at most 8 per expert; the grouped GEMMs otherwise (past that the grouped
# GEMMs measured faster: docs/perf/moe.md). Shapes only: the choice never depends on the routing.
SMALL_BATCH_TOKENS = 64
SMALL_BATCH_ROWS_PER_EXPERT = 8
# The grouped path with fp8 e4m3 weights: True (default) runs kiln.group_gemm_fp8_nt_groupwise on
# the fp8 weights as they are, the activations quantised to e4m3 per 1 x 128 group (float32 scales,
# kiln.per_token_group_quant_fp8) before each GEMM: ~3 % relative rms error per quantised GEMM
# input (docs/moe.md measures it). False: the fallback, the weights dequantised to the activation
# dtype every call and the 16-bit grouped GEMMs (no activation quantisation; reads the fp8
# weights and writes and reads a 16-bit copy). A diagnostic switch, process-wide; the GEMM's
# depth must be a multiple of 128 (H for the up, I for the down projection) for the fp8 GEMM,
# else that projection takes the fallback anyway.
FP8_GROUPED_GEMM = True


def _module(api: str, device: torch.device, dtype: torch.dtype, name: str):
    return _jit.module(LABEL, device, api, dtype=dtype, names={"dtype": name})


def _tensor(api: str, name: str, t, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{api}: {name} must be {ndim}-D, got shape {list(t.shape)}")
    return t


def _same_device(api: str, ref_name: str, ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{api}: {name} is on {t.device} but {ref_name} is on {ref.device}")


def _ids(api: str, name: str, ids, device: torch.device, tokens: int | None = None) -> torch.Tensor:
    _tensor(api, name, ids, 2)
    if ids.dtype not in _INDEX:
        raise TypeError(f"{api}: {name} must be int32 (or int64), got {ids.dtype}")
    if ids.device != device:
        raise ValueError(f"{api}: {name} is on {ids.device} but the hidden states are on {device}")
    if tokens is not None and ids.shape[0] != tokens:
        raise ValueError(f"{api}: {name}.shape[0] must be the tokens ({tokens}), got {list(ids.shape)}")
    if ids.dtype == torch.int64:  # saturate, so an id past int32 stays an error instead of wrapping
        ids = ids.clamp(-(2**31), 2**31 - 1)
    return ids.to(torch.int32).contiguous()


def _num_experts(api: str, num_experts) -> int:
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{api}: num_experts must be a positive int, got {num_experts!r}")
    return num_experts


# --- routing ---------------------------------------------------------------------------------------


@custom_op("moe_topk", mutates=("topk_weights", "topk_ids"))
def _topk_op(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    scoring: str,
    renormalize: bool,
    num_groups: int,
    topk_group: int,
    correction_bias: torch.Tensor | None,
    scale: float,
) -> None:
    device = router_logits.device
    mod = _module("kiln.moe_topk", device, router_logits.dtype, "router_logits.dtype")
    dl = _jit.dl
    mod.topk(
        weights=dl(topk_weights),
        ids=dl(topk_ids),
        logits=dl(router_logits),
        top_k=top_k,
        scoring=mod.scorings[scoring],
        renormalize=renormalize,
        num_groups=num_groups,
        topk_group=topk_group,
        bias=None if correction_bias is None else dl(correction_bias),
        scale=scale,
        errors=errors.record_address(device),
        stream=_jit.stream_of(device),
    )
    errors.after_launch(device)


@logged_api
@traced(moe_traces.MOE_TOPK)
def moe_topk(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to ``top_k`` experts.

    ``scores = softmax(router_logits)`` or ``sigmoid(router_logits)`` (float32); the selection keys
    are ``scores + correction_bias`` (bias for selection only). Plain routing takes the top_k keys;
    grouped routing (DeepSeek-V3: ``num_expert_group`` groups of E / num_expert_group experts)
    first keeps the ``topk_group`` groups with the largest sum of their two largest keys, then
    takes the top_k keys among their experts. The weights are the chosen experts' unbiased
    scores, divided by their sum when ``renormalize``, then times ``routed_scaling_factor``.
    Ties go to the lower expert id (and the lower group id); the k picks come in descending key
    order.

    Args:
        router_logits: ``[T, E]`` float32, bfloat16 or float16, E <= 1024, rows contiguous.
        top_k: experts per token, in [1, E] (grouped: at most topk_group * E / num_expert_group).
        correction_bias: optional ``[E]`` (float32; other float dtypes are converted).

    Returns:
        ``(topk_weights float32 [T, k], topk_ids int32 [T, k])``.
    """
    api = "kiln.moe_topk"
    _tensor(api, "router_logits", router_logits, 2)
    if router_logits.dtype not in _FLOAT:
        raise TypeError(
            f"{api}: router_logits.dtype must be float32, bfloat16 or float16, got {router_logits.dtype}"
        )
    if scoring not in SCORINGS:
        raise ValueError(f"{api}: scoring must be one of {list(SCORINGS)}, got {scoring!r}")
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError(
            f"{api}: num_expert_group and topk_group go together (got {num_expert_group!r} and "
            f"{topk_group!r})"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"{api}: top_k must be an int, got {top_k!r}")
    if correction_bias is not None:
        _tensor(api, "correction_bias", correction_bias, 1)
        _same_device(api, "router_logits", router_logits, correction_bias=correction_bias)
        correction_bias = correction_bias.to(torch.float32).contiguous()
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    t = router_logits.shape[0]
    weights = torch.empty((t, top_k if top_k > 0 else 0), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(weights.shape, dtype=torch.int32, device=router_logits.device)
    _topk_op(
        weights,
        ids,
        router_logits,
        top_k,
        scoring,
        bool(renormalize),
        int(num_expert_group or 0),
        int(topk_group or 0),
        correction_bias,
        float(routed_scaling_factor),
    )
    return weights, ids


# --- data movement ---------------------------------------------------------------------------------


@custom_op("moe_align_block_size", mutates=("sorted_token_ids", "expert_ids", "num_tokens_post_padded"))
def _align_op(
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
) -> None:
    device = topk_ids.device
    mod = _module("kiln.moe_align_block_size", device, torch.float32, "float32 (any module sorts)")
    dl = _jit.dl
    mod.sort(
        ids=dl(topk_ids),
        num_experts=num_experts,
        sorted_ids=dl(sorted_token_ids),
        expert_ids=dl(expert_ids),
        num_post_pad=dl(num_tokens_post_padded),
        block_size=block_size,
        errors=errors.record_address(device),
        stream=_jit.stream_of(device),
    )
    errors.after_launch(device)


@logged_api
@traced(moe_traces.MOE_ALIGN_BLOCK_SIZE)
def moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's and SGLang's moe_align_block_size: the routed slots grouped by expert, padded per
    expert to a multiple of ``block_size``, for a GEMM that takes one expert per block of rows.

    Args:
        topk_ids: ``[T, k]`` int32 (int64 converted); -1 (an expert of another rank) gives no entry.
        block_size: rows per GEMM block (positive).
        num_experts: E, at most 1024.

    Returns:
        ``sorted_token_ids int32 [T*k + E*(block_size-1)]``: the flat slot ids ``t*k + j`` grouped by
        ascending expert, ascending within an expert, each expert's run padded to a multiple of
        block_size with the value ``T*k`` (and the tail after the last expert filled with it too);
        ``expert_ids int32 [ceil(len / block_size)]``: each block's expert, -1 for blocks past the
        padded total; ``num_tokens_post_padded int32 [1]``: the padded total. The sizes depend on
        the shapes only.
    """
    api = "kiln.moe_align_block_size"
    _tensor(api, "topk_ids", topk_ids)
    num_experts = _num_experts(api, num_experts)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{api}: block_size must be a positive int, got {block_size!r}")
    ids = _ids(api, "topk_ids", topk_ids.reshape(1, topk_ids.numel()), topk_ids.device)
    n = ids.numel()
    length = n + num_experts * (block_size - 1)
    dev = ids.device
    sorted_ids = torch.empty(length, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(-(-length // block_size), dtype=torch.int32, device=dev)
    post = torch.empty(1, dtype=torch.int32, device=dev)
    _align_op(sorted_ids, expert_ids, post, ids, block_size, num_experts)
    return sorted_ids, expert_ids, post


@custom_op("moe_permute", mutates=("permuted", "offs", "src_idx"))
def _permute_op(
    permuted: torch.Tensor,
    offs: torch.Tensor,
    src_idx: torch.Tensor,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    first_expert: int = 0,
    total_experts: int = 0,
) -> None:
    """first_expert, total_experts: expert parallelism (ops/moe/moe.h): ids in [first_expert,
    first_expert + num_experts) are this rank's experts, other ids in [0, total_experts) give no row
    (total_experts 0: num_experts)."""
    device = hidden_states.device
    mod = _module("kiln.moe_permute", device, hidden_states.dtype, "hidden_states.dtype")
    dl, stream, errs = _jit.dl, _jit.stream_of(device), errors.record_address(device)
    mod.sort(
        ids=dl(topk_ids),
        num_experts=num_experts,
        offs=dl(offs),
        src_idx=dl(src_idx),
        first_expert=first_expert,
        total_experts=total_experts,
        errors=errs,
        stream=stream,
    )
    mod.gather(
        out=dl(permuted),
        hidden=dl(hidden_states),
        src_idx=dl(src_idx),
        top_k=topk_ids.shape[1],
        errors=errs,
        stream=stream,
    )
    errors.after_launch(device)


def _hidden(api: str, name: str, x) -> torch.Tensor:
    _tensor(api, name, x, 2)
    if x.dtype not in _FLOAT:
        raise TypeError(f"{api}: {name}.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    return x if x.stride(-1) == 1 else x.contiguous()


@logged_api
@traced(moe_traces.MOE_PERMUTE)
def moe_permute(
    hidden_states: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row of ``hidden_states`` per routed slot, grouped by expert: the input of a grouped GEMM.

    Args:
        hidden_states: ``[T, H]`` bfloat16, float16 or float32 (rows contiguous, any row stride).
        topk_ids: ``[T, k]`` int32 (int64 converted); -1 gives no row.
        num_experts: E, at most 1024.

    Returns:
        ``permuted [T*k, H]``: rows grouped by ascending expert, ascending flat slot ``t*k + j``
        within an expert; rows past ``offs[-1]`` (as many as there are -1 ids) are zero.
        ``offs int32 [E]``: cumulative row ends (torch._grouped_mm's offs). ``src_idx int32 [T*k]``:
        each row's flat slot index (-1 for the rows past offs[-1]).
    """
    api = "kiln.moe_permute"
    x = _hidden(api, "hidden_states", hidden_states)
    num_experts = _num_experts(api, num_experts)
    ids = _ids(api, "topk_ids", topk_ids, x.device, x.shape[0])
    n = ids.numel()
    permuted = torch.empty((n, x.shape[1]), dtype=x.dtype, device=x.device)
    offs = torch.empty(num_experts, dtype=torch.int32, device=x.device)
    src_idx = torch.empty(n, dtype=torch.int32, device=x.device)
    _permute_op(permuted, offs, src_idx, x, ids, num_experts)
    return permuted, offs, src_idx


@custom_op("moe_unpermute", mutates=("out", "inv"))
def _unpermute_op(
    out: torch.Tensor,
    inv: torch.Tensor,
    permuted_rows: torch.Tensor,
    topk_weights: torch.Tensor,
    src_idx: torch.Tensor,
) -> None:
    device = permuted_rows.device
    mod = _module("kiln.moe_unpermute", device, permuted_rows.dtype, "permuted_rows.dtype")
    dl = _jit.dl
    mod.unpermute(
        out=dl(out),
        rows=dl(permuted_rows),
        weights=dl(topk_weights),
        src_idx=dl(src_idx),
        inv=dl(inv),
        errors=errors.record_address(device),
        stream=_jit.stream_of(device),
    )
    errors.after_launch(device)


def _unpermute(api: str, rows, topk_weights, src_idx, out, inv=None) -> torch.Tensor:
    rows = _hidden(api, "permuted_rows", rows)
    _tensor(api, "topk_weights", topk_weights, 2)
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"{api}: topk_weights.dtype must be float32, got {topk_weights.dtype}")
    _tensor(api, "src_idx", src_idx, 1)
    if src_idx.dtype not in _INDEX:
        raise TypeError(f"{api}: src_idx must be int32 (or int64), got {src_idx.dtype}")
    _same_device(api, "permuted_rows", rows, topk_weights=topk_weights, src_idx=src_idx, out=out)
    t = topk_weights.shape[0]
    if topk_weights.stride(-1) != 1:
        topk_weights = topk_weights.contiguous()
    if out is None:
        out = torch.empty((t, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    else:
        _tensor(api, "out", out, 2)
        if out.dtype != rows.dtype or tuple(out.shape) != (t, rows.shape[1]):
            raise ValueError(
                f"{api}: out must be {rows.dtype} [{t}, {rows.shape[1]}], got {out.dtype} {list(out.shape)}"
            )
    if inv is None:
        inv = torch.empty(src_idx.numel(), dtype=torch.int32, device=rows.device)
    _unpermute_op(out, inv, rows, topk_weights, src_idx.to(torch.int32).contiguous())
    return out


@logged_api
@traced(moe_traces.MOE_UNPERMUTE)
def moe_unpermute(
    permuted_rows: torch.Tensor,
    topk_weights: torch.Tensor,
    src_idx: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted scatter-add back to the tokens: ``out[t] = sum_j topk_weights[t, j] *
    permuted_rows[r]`` over the rows r with ``src_idx[r] = t*k + j`` (float32 sums, in j order;
    slots with no row add nothing).

    Args:
        permuted_rows: ``[T*k, H]`` (moe_permute's rows after the experts).
        topk_weights: ``[T, k]`` float32.
        src_idx: ``[T*k]`` int32, moe_permute's (each flat slot at most once; -1: unused row).
        out: optional ``[T, H]`` of permuted_rows' dtype.
    """
    return _unpermute("kiln.moe_unpermute", permuted_rows, topk_weights, src_idx, out)


# --- the layer -------------------------------------------------------------------------------------


def _check_weight(api: str, name: str, w: torch.Tensor, scale, dtype: torch.dtype) -> bool:
    """Whether w is fp8 (e4m3 with float32 scales, per expert [E] or per 128 x 128 block); 16-bit
    weights must have the activation dtype and no scale."""
    if w.dtype in _16BIT:
        if scale is not None:
            raise ValueError(f"{api}: {name}_scale is for fp8 weights; {name} is {w.dtype}")
        if w.dtype != dtype:
            raise TypeError(
                f"{api}: {name}.dtype must be the hidden states' ({dtype}) or float8_e4m3fn, got {w.dtype}"
            )
        return False
    if w.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{api}: {name}.dtype must be {dtype} or float8_e4m3fn, got {w.dtype}")
    if scale is None:
        raise ValueError(
            f"{api}: fp8 {name} needs {name}_scale (float32, [E] or [E, ceil(rows/128), ceil(cols/128)])"
        )
    _tensor(api, f"{name}_scale", scale)
    e, r, c = w.shape
    blocks = (e, -(-r // BLOCK), -(-c // BLOCK))
    if scale.dtype != torch.float32 or tuple(scale.shape) not in ((e,), blocks):
        raise ValueError(
            f"{api}: {name}_scale must be float32 [{e}] (per expert) or {list(blocks)} (128 x 128 "
            f"blocks), got {scale.dtype} {list(scale.shape)}"
        )
    return True


@custom_op("moe_dequant", mutates=("out",))
def _dequant_op(out: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> None:
    """out = w (fp8 e4m3, contiguous [E, R, C]) times its per-expert or 128 x 128 block scales, in
    out's dtype (one bandwidth-bound kernel: 1 byte read, 2 written per weight)."""
    device = w.device
    mod = _module("kiln.fused_moe", device, out.dtype, "hidden_states.dtype")
    dl = _jit.dl
    mod.dequant(out=dl(out), w=dl(w), w_scale=dl(scale), stream=_jit.stream_of(device))


def _dequantized(w: torch.Tensor, scale, dtype: torch.dtype, out=None) -> torch.Tensor:
    """fp8 w times its scales in the activation dtype (the grouped path's fallback); 16-bit w as is."""
    if scale is None:
        return w
    if out is None:
        out = torch.empty(w.shape, dtype=dtype, device=w.device)
    _dequant_op(out, w.contiguous(), scale.to(torch.float32).contiguous())
    return out


@custom_op("moe_experts", mutates=("out",))
def _experts_op(
    out: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    gated: bool,
    activation: str,
    gate_row0: int,
    up_row0: int,
    w_scale: torch.Tensor | None = None,
) -> None:
    device = x.device
    mod = _module("kiln.fused_moe", device, x.dtype, "hidden_states.dtype")
    dl = _jit.dl
    mod.experts(
        out=dl(out),
        x=dl(x),
        w=dl(w),
        offs=dl(offs),
        gated=gated,
        act=mod.acts[activation],
        gate_row0=gate_row0,
        up_row0=up_row0,
        w_scale=None if w_scale is None else dl(w_scale),
        errors=errors.record_address(device),
        stream=_jit.stream_of(device),
    )
    errors.after_launch(device)


# expert_act's gated activations (moe.h is_gated).
_GATED_KINDS = frozenset(("swiglu", "swiglu_step", "geglu", "geglu_tanh", "situ"))


@custom_op("moe_experts_act", mutates=("out",))
def _experts_act_op(
    out: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    act: str,
    gate_row0: int,
    up_row0: int,
    p0: torch.Tensor | None,
    p1: torch.Tensor | None,
    p2: torch.Tensor | None,
    d0: float,
    d1: float,
    d2: float,
    bias: torch.Tensor | None,
    w_scale: torch.Tensor | None = None,
) -> None:
    """The small-batch expert GEMM with the generic epilogue: out [rows, cols] = the activation
    `act` (ops/moe/moe.h ExpertAct) of the float32 dot products of w's rows [gate_row0, +cols) (and
    [up_row0, +cols) when gated) plus bias (x's dtype [E, >= those rows], column = weight row), with
    each expert's p0..p2 (float32 [E] or [1]; None: d0..d2), rounded once."""
    device = x.device
    mod = _module("kiln.cutlass_fused_moe", device, x.dtype, "hidden_states.dtype")
    dl = _jit.dl
    code = mod.expert_acts[act]
    mod.experts(
        out=dl(out),
        x=dl(x),
        w=dl(w),
        offs=dl(offs),
        gated=act in _GATED_KINDS,
        act=0,
        gate_row0=gate_row0,
        up_row0=up_row0,
        w_scale=None if w_scale is None else dl(w_scale),
        expert_act=code,
        p0=None if p0 is None else dl(p0),
        p1=None if p1 is None else dl(p1),
        p2=None if p2 is None else dl(p2),
        defaults=(d0, d1, d2),
        bias=None if bias is None else dl(bias),
        errors=errors.record_address(device),
        stream=_jit.stream_of(device),
    )
    errors.after_launch(device)


@custom_op("moe_expert_act", mutates=("out",))
def _expert_act_op(
    out: torch.Tensor,
    input: torch.Tensor,
    offs: torch.Tensor,
    act: str,
    gate_col0: int,
    up_col0: int,
    p0: torch.Tensor | None,
    p1: torch.Tensor | None,
    p2: torch.Tensor | None,
    d0: float,
    d1: float,
    d2: float,
    bias: torch.Tensor | None,
) -> None:
    """out [rows, cols] = the activation `act` (ops/moe/moe.h ExpertAct) of input's columns
    [gate_col0, +cols) (and [up_col0, +cols) when gated), each row with its expert's parameters
    p0..p2 (float32 [E] or [1]; None: d0..d2) and bias row (input's dtype [E, >= columns])."""
    device = input.device
    mod = _module("kiln.cutlass_fused_moe", device, input.dtype, "input.dtype")
    dl = _jit.dl
    mod.expert_act(
        out=dl(out),
        input=dl(input),
        offs=dl(offs),
        act=mod.expert_acts[act],
        gate_col0=gate_col0,
        up_col0=up_col0,
        p0=None if p0 is None else dl(p0),
        p1=None if p1 is None else dl(p1),
        p2=None if p2 is None else dl(p2),
        defaults=(d0, d1, d2),
        bias=None if bias is None else dl(bias),
        stream=_jit.stream_of(device),
    )


class _Act:
    """An activation of the generic path (kiln's expert_act kernel): its kernel name, whether it is
    gated (fc1 holds 2I rows), per-expert parameters p0..p2 (float32 tensors or None) and their
    defaults (ops/moe/moe.h's table)."""

    __slots__ = ("kind", "gated", "params", "defaults")

    def __init__(self, kind: str, gated: bool, params=(None, None, None), defaults=(0.0, 0.0, 0.0)):
        self.kind, self.gated, self.params, self.defaults = kind, gated, tuple(params), tuple(defaults)


# --- scratch: new tensors, or views of a caller's workspace_buffer ----------------------------------

_ALIGN = 256  # bytes: every scratch view starts on a 256-byte boundary (16-byte vectors, TMA)


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _plan_bytes(plan) -> int:
    """The bytes a workspace_buffer needs for these buffers: each rounded up to _ALIGN, plus _ALIGN
    for aligning the buffer's own start."""
    return _ALIGN + sum(_round_up(math.prod(shape) * dtype.itemsize, _ALIGN) for _, shape, dtype in plan)


class WorkspaceError(ValueError, RuntimeError):
    """A workspace_buffer that cannot serve the call (a ValueError, and a RuntimeError as
    FlashInfer's C++ check raises)."""


def _check_workspace(api: str, ws, device: torch.device) -> None:
    _tensor(api, "workspace_buffer", ws)
    if ws.dtype not in (torch.uint8, torch.int8):
        raise WorkspaceError(f"{api}: workspace_buffer dtype must be int8 or uint8, got {ws.dtype}")
    if ws.device != device:
        kind = "CUDA" if device.type == "cuda" else "CPU"
        raise WorkspaceError(
            f"{api}: workspace_buffer must be a {kind} tensor on the input's device ({device}); {ws.device} "
            "does not match input device"
        )
    if ws.dim() != 1:
        raise WorkspaceError(f"{api}: workspace_buffer must be 1-D, got shape {list(ws.shape)}")
    if not ws.is_contiguous():
        raise WorkspaceError(f"{api}: workspace_buffer must be contiguous, got stride {ws.stride()}")


def _take(api: str, plan, device: torch.device, workspace) -> dict[str, torch.Tensor]:
    """The buffers of `plan` ((name, shape, dtype), ...): new tensors, or consecutive views of
    workspace_buffer (nothing allocated)."""
    if workspace is None:
        return {name: torch.empty(shape, dtype=dtype, device=device) for name, shape, dtype in plan}
    need = _plan_bytes(plan)
    if workspace.numel() < need:
        raise WorkspaceError(
            f"{api}: workspace_buffer too small: this call needs {need} bytes (kiln.moe."
            f"cutlass_fused_moe_workspace_size gives them for up to max_num_tokens), got {workspace.numel()}"
        )
    # Views from the first 256-byte boundary (torch.compile's fake tensors have no address: a real
    # torch allocation starts on one).
    at = 0 if torch.compiler.is_compiling() else (-workspace.data_ptr()) % _ALIGN
    views = {}
    for name, shape, dtype in plan:
        size = math.prod(shape) * dtype.itemsize
        views[name] = workspace[at : at + size].view(dtype).view(shape)
        at += _round_up(size, _ALIGN)
    return views


def _decide(t, k, e, h, i, fp8_13, fp8_2, block13, up_first, generic, backend, unit13=True, unit2=True):
    """The layer's path for these shapes (never the routing): (small, gemm13, gemm2) -- the
    small-batch expert kernels, and on the grouped path whether each projection runs the fp8
    grouped GEMM (else fp8 weights are dequantised first). unit13, unit2: the weights' rows are
    contiguous (the small-batch kernels stream them; the fp8 GEMM reads them so)."""
    n = t * k
    small = (
        backend != "triton"
        and unit13
        and unit2
        and t <= SMALL_BATCH_TOKENS
        and n <= SMALL_BATCH_ROWS_PER_EXPERT * e
    )
    fp8_gemm = FP8_GROUPED_GEMM and backend != "triton" and not small
    # fc1's two halves are separate GEMMs on the standard up-first path: block scales split at row I
    # need I % 128 == 0 (the generic path runs one GEMM over every row).
    split_ok = generic or not up_first or not block13 or i % BLOCK == 0
    gemm13 = fp8_gemm and fp8_13 and h % BLOCK == 0 and split_ok and unit13
    gemm2 = fp8_gemm and fp8_2 and i % BLOCK == 0 and unit2
    return small, gemm13, gemm2


def _layer_plan(t, k, e, h, i, rows13, dtype, small, deq13, deq2, x_copy):
    """The scratch buffers of one layer call, in the order the call takes them: the workspace need
    is their sum (_plan_bytes). The fp8 grouped GEMMs' quantised activations are not in it
    (kiln.per_token_group_quant_fp8 allocates them)."""
    n, i32 = t * k, torch.int32
    plan = [("x", (t, h), dtype)] if x_copy else []
    plan += [("permuted", (n, h), dtype), ("offs", (e,), i32), ("src_idx", (n,), i32)]
    if deq13:
        plan.append(("deq13", (e, rows13, h), dtype))
    if deq2:
        plan.append(("deq2", (e, h, i), dtype))
    if not small:  # (the small-batch kernels fuse the activation into the up projection)
        plan.append(("up", (n, rows13), dtype))
    plan += [("act", (n, i), dtype), ("down", (n, h), dtype), ("inv", (n,), i32)]
    return plan


def _layer(
    api,
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation,
    w13_scale,
    w2_scale,
    out,
    up_first,
    backend="auto",
    *,
    act: _Act | None = None,
    bias13=None,
    bias2=None,
    experts=None,
    workspace=None,
    x_copy=False,
):
    """The MoE layer for fused_moe and cutlass_fused_moe. `activation` ("silu", "gelu") runs the
    measured fused paths; `act` (an _Act) or a bias runs the generic one (the up projection whole,
    then kiln's expert_act kernel). experts: (first_expert, total_experts) for expert parallelism.
    workspace: a checked uint8/int8 buffer the scratch is carved from. x_copy: hidden_states are
    fp8 and are first converted into the dtype of `out` (cutlass_fused_moe's per-tensor fp8)."""
    if backend not in BACKENDS:
        raise ValueError(f"{api}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    x = _tensor(api, "hidden_states", hidden_states, 2)
    dtype = out.dtype if x_copy else x.dtype
    if not x_copy and x.dtype not in _16BIT:
        raise TypeError(f"{api}: hidden_states.dtype must be bfloat16 or float16, got {x.dtype}")
    _tensor(api, "w13", w13, 3)
    _tensor(api, "w2", w2, 3)
    if act is None and activation not in ACTIVATIONS:
        raise ValueError(
            f"{api}: activation must be one of {list(ACTIVATIONS)} (gelu: the tanh approximation), "
            f"got {activation!r}"
        )
    gated = act is None or act.gated
    generic = act is not None  # (biases come with an _Act: cutlass_fused_moe builds one)
    t, h = x.shape
    e, rows13, h13 = w13.shape
    if (gated and rows13 % 2) or h13 != h:
        form = "2I" if gated else "I"
        raise ValueError(
            f"{api}: w13 must be [E, {form}, H = {h}] (hidden_states.shape[1]), got {list(w13.shape)}"
        )
    i = rows13 // 2 if gated else rows13
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(
            f"{api}: w2 must be [E = {e}, H = {h}, I = {i}] (from w13 {list(w13.shape)}), got "
            f"{list(w2.shape)}"
        )
    _same_device(
        api,
        "hidden_states",
        x,
        w13=w13,
        w2=w2,
        topk_weights=topk_weights,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        out=out,
    )
    ids = _ids(api, "topk_ids", topk_ids, x.device, t)
    _tensor(api, "topk_weights", topk_weights, 2)
    if tuple(topk_weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"{api}: topk_weights must have topk_ids' shape {list(ids.shape)}, got {list(topk_weights.shape)}"
        )
    if out is not None:
        _tensor(api, "out", out, 2)
        if out.dtype not in _16BIT or tuple(out.shape) != (t, h) or (not x_copy and out.dtype != x.dtype):
            raise ValueError(f"{api}: out must be {dtype} [{t}, {h}], got {out.dtype} {list(out.shape)}")
    fp8_13 = _check_weight(api, "w13", w13, w13_scale, dtype)
    fp8_2 = _check_weight(api, "w2", w2, w2_scale, dtype)
    k = ids.shape[1]
    block13 = fp8_13 and w13_scale.dim() == 3
    unit13, unit2 = w13.stride(-1) == 1, w2.stride(-1) == 1
    small, gemm13, gemm2 = _decide(
        t, k, e, h, i, fp8_13, fp8_2, block13, up_first, generic, backend, unit13, unit2
    )
    deq13, deq2 = not small and fp8_13 and not gemm13, not small and fp8_2 and not gemm2
    plan = _layer_plan(t, k, e, h, i, rows13, dtype, small, deq13, deq2, x_copy)
    buf = _take(api, plan, x.device, workspace)
    if x_copy:
        x = buf["x"].copy_(x)
    first, total = experts if experts is not None else (0, e)
    permuted, offs, src_idx = buf["permuted"], buf["offs"], buf["src_idx"]
    _permute_op(
        permuted, offs, src_idx, _hidden(api, "hidden_states", x), ids, _num_experts(api, e), first, total
    )
    weights = topk_weights.to(torch.float32)
    s13 = w13_scale if fp8_13 else None
    s2 = w2_scale if fp8_2 else None
    # The up projection (and the activation).
    gate0, up0 = ((i, 0) if up_first else (0, i)) if gated else (0, 0)
    b13 = None if bias13 is None else bias13.to(dtype)
    if generic and small:
        # The activation (its parameters and fc1's bias) fused into the small-batch up projection:
        # fc1's output stays float32 into it and only the activation is rounded, as the fused SwiGLU.
        a = buf["act"]
        _experts_act_op(a, permuted, w13, offs, act.kind, gate0, up0, *act.params, *act.defaults, b13, s13)
    elif generic:
        h1 = buf["up"]  # [n, rows13]: the whole of fc1's rows, in their order
        if gemm13:
            xq, xs = per_token_group_quant_fp8(permuted, BLOCK)
            sc = w13_scale if block13 else _block_scales(w13_scale, w13.shape)
            _group_fp8(api, xq, w13, xs, sc.to(torch.float32), offs, True, "K", h1)
        else:
            w = _dequantized(w13, s13, dtype, buf.get("deq13"))
            grouped_mm(permuted, w.transpose(1, 2), offs, out=h1, backend=backend)
        a = buf["act"]
        _expert_act_op(a, h1, offs, act.kind, gate0, up0, *act.params, *act.defaults, b13)
    elif small:
        # Few rows per expert (decode): the small-batch kernels read each selected expert's weights
        # once (fp8 ones as they are, scaled in the kernel), the activation fused into the up
        # projection.
        a = buf["act"]
        _experts_op(a, permuted, w13, offs, True, activation, gate0, up0, s13)
    else:
        up = buf["up"]
        # (weight rows, their block-scale rows, the output columns) of each GEMM: one for w13's
        # gate and up rows together; FlashInfer's fc1 (up_first) holds up rows, then gate, and the
        # activation takes the gate first: two GEMMs writing the halves of up. (No slicing for the
        # one-GEMM form: it stays traceable on fake tensors of any device.)
        if up_first:
            parts = [
                (w13[:, i:], slice(i // BLOCK, -(-rows13 // BLOCK)), up[:, :i]),
                (w13[:, :i], slice(0, -(-i // BLOCK)), up[:, i:]),
            ]
        else:
            parts = [(w13, None, up)]
        if gemm13:
            xq, xs = per_token_group_quant_fp8(permuted, BLOCK)
            for rows, blocks, dst in parts:
                if block13:  # block scales: the blocks of these rows (I % 128 == 0 when split)
                    sc = w13_scale if blocks is None else w13_scale[:, blocks]
                else:
                    sc = _block_scales(w13_scale, rows.shape)
                _group_fp8(api, xq, rows, xs, sc.to(torch.float32), offs, True, "K", dst)
        else:
            deq = _dequantized(w13, s13, dtype, buf.get("deq13"))
            if up_first:
                parts = [(deq[:, i:], None, up[:, :i]), (deq[:, :i], None, up[:, i:])]
            else:
                parts = [(deq, None, up)]
            for rows, _, dst in parts:
                grouped_mm(permuted, rows.transpose(1, 2), offs, out=dst, backend=backend)
        a = ACTIVATIONS[activation](up, out=buf["act"])
    # The down projection.
    down = buf["down"]
    if small and bias2 is not None:  # fc2's bias in the epilogue too: one rounding of fc2's output
        _experts_act_op(
            down, a, w2, offs, "identity", 0, 0, None, None, None, 0.0, 0.0, 0.0, bias2.to(dtype), s2
        )
        bias2 = None
    elif small:
        _experts_op(down, a, w2, offs, False, "silu", 0, 0, s2)
    elif gemm2:
        aq, as_ = per_token_group_quant_fp8(a, BLOCK)
        _group_fp8(api, aq, w2, as_, _block_scales(w2_scale, w2.shape), offs, True, "K", down)
    else:
        w = _dequantized(w2, s2, dtype, buf.get("deq2"))
        grouped_mm(a, w.transpose(1, 2), offs, out=down, backend=backend)
    if bias2 is not None:  # into the permuted rows' buffer, which the up projection has consumed
        _expert_act_op(
            permuted, down, offs, "identity", 0, 0, None, None, None, 0.0, 0.0, 0.0, bias2.to(dtype)
        )
        down = permuted
    return _unpermute(api, down, weights, src_idx, out, buf["inv"])


def _block_scales(scale: torch.Tensor, shape) -> torch.Tensor:
    """An fp8 weight's scales as the [E, ceil(rows/128), ceil(cols/128)] grid the fp8 grouped GEMM
    reads ("K" layout): block scales as they are, a per-expert [E] scale as a stride-0 view."""
    scale = scale.to(torch.float32)
    e, r, c = shape
    if scale.dim() == 3:
        return scale
    return scale[:, None, None].expand(e, -(-r // BLOCK), -(-c // BLOCK))


@logged_api(mutates=("out",))
@traced(moe_traces.FUSED_MOE)
def fused_moe(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """The MoE layer (vLLM's and SGLang's weight layout):
    ``out[t] = sum_j topk_weights[t, j] * w2[e] @ (act(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t))``,
    ``e = topk_ids[t, j]``; -1 ids contribute nothing.

    Args:
        hidden_states: ``[T, H]`` bfloat16 or float16.
        w13: ``[E, 2I, H]``, gate rows first, then up; the hidden states' dtype, or float8_e4m3fn
            with ``w13_scale`` float32 ``[E]`` (per expert) or ``[E, ceil(2I/128), ceil(H/128)]``.
        w2: ``[E, H, I]``, likewise (``w2_scale`` ``[E]`` or ``[E, ceil(H/128), ceil(I/128)]``).
        topk_weights: ``[T, k]`` float32 (other float dtypes are converted).
        topk_ids: ``[T, k]`` int32 (int64 converted), in [-1, E).
        activation: ``"silu"`` or ``"gelu"`` (the tanh approximation).
        out: optional ``[T, H]`` output of the hidden states' dtype.
        backend: the GEMMs' backend. ``"triton"``: both projections through
            ``kiln.grouped_mm(backend="triton")`` (the Triton kernel) at every batch size, never
            the decode-size CUDA expert kernels (so fp8 weights are dequantised per call at every
            size). ``"cuda"``: the CUDA grouped GEMMs, and the small-batch expert kernels where
            they apply. ``"auto"`` (default): what measurement says, today ``"cuda"`` (the
            Triton grouped GEMM is faster only in a narrow band of sizes:
            docs/perf/gemm-triton.md). CPU tensors run the host backend
            whatever it says (with ``"triton"``, its grouped path at every size).

    The up and down projections are rounded to the hidden states' dtype (the GEMM outputs; at
    decode sizes the activation product and the down projection), the k-way sum is float32.
    fp8 weights are read as fp8 by the decode-size kernels (scales applied in float32); at larger
    batches by the fp8 grouped GEMM (kiln.group_gemm_fp8_nt_groupwise), the activations quantised
    to e4m3 per 1 x 128 group before each projection (~4.5 % relative error against the float32
    layer; H and I multiples of 128, else the weights are dequantised per call; docs/moe.md,
    FP8_GROUPED_GEMM).
    """
    return _layer(
        "kiln.fused_moe",
        hidden_states,
        w13,
        w2,
        topk_weights,
        topk_ids,
        activation,
        w13_scale,
        w2_scale,
        out,
        up_first=False,
        backend=backend,
    )


# --- FlashInfer's cutlass_fused_moe ------------------------------------------------------------------


class ActivationType(enum.IntEnum):
    """FlashInfer's activation types (``flashinfer.ActivationType``, the same names and values) for
    :func:`cutlass_fused_moe`. Gated ones read fc1 as ``[E, 2I, H]`` (up rows, then gate), the others
    as ``[E, I, H]``; the formulas are kiln's expert_act table (ops/moe/moe.h, docs/moe.md)."""

    Gelu = 0
    Relu = 1
    Silu = 2
    Swiglu = 3
    Geglu = 4
    SwigluBias = 5
    Relu2 = 6
    SwigluStep = 7
    GegluTanh = 8
    Identity = 9
    Situ = 10
    InvalidType = 11
    ClampedRelu2 = 12

    @property
    def is_gated(self) -> bool:
        """Whether the activation takes a gate and an up projection (fc1 holds 2I rows)."""
        return self in _GATED


_GATED = frozenset(
    {
        ActivationType.Swiglu,
        ActivationType.Geglu,
        ActivationType.SwigluBias,
        ActivationType.SwigluStep,
        ActivationType.GegluTanh,
        ActivationType.Situ,
    }
)
# FlashInfer's defaults of the parametrised activations.
DEFAULT_SWIGLU_ALPHA = 1.0
DEFAULT_SWIGLU_BETA = 0.0
DEFAULT_SWIGLU_STEP_LIMIT = 7.0  # SwigluStep without swiglu_limit (Step-3's)
DEFAULT_SITU_BETA = 4.0
DEFAULT_SITU_LINEAR_BETA = 25.0
# ActivationType -> (expert_act kernel, the FlashInfer arguments that feed p0, p1, p2, their defaults).
_ACT_KERNELS = {
    ActivationType.Swiglu: (
        "swiglu",
        ("swiglu_alpha", "swiglu_beta", "swiglu_limit"),
        (DEFAULT_SWIGLU_ALPHA, DEFAULT_SWIGLU_BETA, math.inf),
    ),
    ActivationType.SwigluStep: (
        "swiglu_step",
        (None, None, "swiglu_limit"),
        (0.0, 0.0, DEFAULT_SWIGLU_STEP_LIMIT),
    ),
    ActivationType.Geglu: ("geglu", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.GegluTanh: ("geglu_tanh", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.Situ: (
        "situ",
        ("situ_beta", "situ_linear_beta", "swiglu_limit"),
        (DEFAULT_SITU_BETA, DEFAULT_SITU_LINEAR_BETA, math.inf),
    ),
    ActivationType.Gelu: ("gelu", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.Relu: ("relu", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.Silu: ("silu", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.Relu2: ("relu2", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.Identity: ("identity", (None, None, None), (0.0, 0.0, 0.0)),
    ActivationType.ClampedRelu2: ("clamped_relu2", (None, None, "clamped_relu2_limit"), (0.0, 0.0, 0.0)),
}
_ACT_KERNELS[ActivationType.SwigluBias] = _ACT_KERNELS[ActivationType.Swiglu]
_CUTLASS_BACKENDS = ("cutlass", *BACKENDS)


def _activation_type(api: str, activation_type) -> ActivationType:
    try:
        a = ActivationType(activation_type)
    except ValueError:
        a = None
    if a is None or a == ActivationType.InvalidType or isinstance(activation_type, bool):
        raise ValueError(
            f"{api}: unsupported activation_type {activation_type!r}: one of "
            f"{', '.join(m.name for m in ActivationType if m != ActivationType.InvalidType)}"
        )
    return a


def _act_param(api: str, name: str, t, e: int, device: torch.device, one: bool = False) -> torch.Tensor:
    """A per-expert activation parameter: float [e] (or, with one=True, the model-wide [1])."""
    _tensor(api, name, t)
    want = (1,) if one else (e,)
    if not t.is_floating_point() or tuple(t.shape) != want:
        raise ValueError(
            f"{api}: {name} must be a float tensor of shape {want} "
            f"({'model-wide' if one else 'one per expert of this rank'}), got {t.dtype} {tuple(t.shape)}"
        )
    if t.device != device:
        raise ValueError(f"{api}: {name} is on {t.device} but the input is on {device}")
    return t.to(torch.float32).contiguous()


def _cutlass_activation(api, a: ActivationType, e, device, given: dict) -> _Act | None:
    """The generic path's _Act for activation type `a` and its parameter tensors (None: the fused
    SwiGLU / GeGLU-tanh paths apply)."""
    kind, names, defaults = _ACT_KERNELS[a]
    if a == ActivationType.ClampedRelu2:
        limit = given["clamped_relu2_limit"]
        if limit is None:
            raise ValueError(
                f"{api}: ActivationType.ClampedRelu2 requires a one-element clamped_relu2_limit tensor"
            )
        if not isinstance(limit, torch.Tensor) or limit.dim() != 1 or limit.numel() != 1:
            shape = tuple(limit.shape) if isinstance(limit, torch.Tensor) else type(limit).__name__
            raise ValueError(
                f"{api}: ActivationType.ClampedRelu2 requires model-wide clamped_relu2_limit with shape "
                f"(1,), got {shape}"
            )
        if any(given[n] is not None for n in ("swiglu_alpha", "swiglu_beta", "swiglu_limit")):
            raise ValueError(
                f"{api}: ActivationType.ClampedRelu2 does not accept SwiGLU activation parameters"
            )
        if any(given[n] is not None for n in ("situ_beta", "situ_linear_beta")):
            raise ValueError(f"{api}: ActivationType.ClampedRelu2 does not accept SiTU activation parameters")
    elif given["clamped_relu2_limit"] is not None:
        raise ValueError(f"{api}: clamped_relu2_limit is supported only with ActivationType.ClampedRelu2")
    for name, value in given.items():
        if value is not None and name not in names:
            raise ValueError(
                f"{api}: {name} does not go with ActivationType.{a.name} (its parameters: "
                f"{', '.join(n for n in names if n) or 'none'})"
            )
    params = tuple(
        None
        if n is None or given[n] is None
        else _act_param(api, n, given[n], e, device, n == "clamped_relu2_limit")
        for n in names
    )
    if (
        a in (ActivationType.Swiglu, ActivationType.SwigluBias, ActivationType.GegluTanh)
        and params == (None,) * 3
    ):
        return None
    return _Act(kind, a in _GATED, params, defaults)


def _scalar_scale(api: str, name: str, t, e: int, device: torch.device, per_expert: bool) -> torch.Tensor:
    """A per-tensor fp8 scale: one value ([], [1]) broadcast to [e] when per_expert, or [e] itself."""
    _tensor(api, name, t)
    ok = t.numel() == 1 or (per_expert and t.numel() == e)
    if not ok or not t.is_floating_point():
        want = f"[{e}] or one value" if per_expert else "one value"
        raise ValueError(f"{api}: quant_scales' {name} must be float, {want}, got {t.dtype} {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{api}: quant_scales' {name} is on {t.device} but the input is on {device}")
    t = t.to(torch.float32).reshape(-1)
    return t.expand(e).contiguous() if per_expert else t


def _not_claimed(api: str, what: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"{api}: {what} is not supported by kiln ({why})")


def _check_parallel(api: str, name: str, size, rank) -> None:
    for n, v in ((f"{name}_size", size), (f"{name}_rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{api}: {n} must be an int, got {v!r}")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(
            f"{api}: {name}_size must be >= 1 and {name}_rank in [0, {name}_size), got {size}, {rank}"
        )


@logged_api(mutates=("output", "workspace_buffer"))
@traced(moe_traces.CUTLASS_FUSED_MOE)
def cutlass_fused_moe(
    input: torch.Tensor,
    token_selected_experts: torch.Tensor,
    token_final_scales: torch.Tensor,
    fc1_expert_weights: torch.Tensor,
    fc2_expert_weights: torch.Tensor,
    output_dtype: torch.dtype | None = None,
    quant_scales: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
    fc1_expert_biases: torch.Tensor | None = None,
    fc2_expert_biases: torch.Tensor | None = None,
    input_sf: torch.Tensor | None = None,
    swiglu_alpha: torch.Tensor | None = None,
    swiglu_beta: torch.Tensor | None = None,
    swiglu_limit: torch.Tensor | None = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    cluster_size: int = 1,
    cluster_rank: int = 0,
    output: torch.Tensor | None = None,
    enable_alltoall: bool = False,
    use_deepseek_fp8_block_scale: bool = False,
    use_w4_group_scaling: bool = False,
    use_mxfp8_act_scaling: bool = False,
    min_latency_mode: bool = False,
    use_packed_weights: bool = False,
    use_wfp4afp8_humming: bool = False,
    tune_max_num_tokens: int = 8192,
    enable_pdl: bool | None = None,
    activation_type: ActivationType = ActivationType.Swiglu,
    swizzled_input_sf: bool = True,
    use_fused_finalize: bool = True,
    profile_ids: list[int] | None = None,
    workspace_buffer: torch.Tensor | None = None,
    *,
    clamped_relu2_limit: torch.Tensor | None = None,
    situ_beta: torch.Tensor | None = None,
    situ_linear_beta: torch.Tensor | None = None,
    backend: str = "auto",
) -> list[torch.Tensor]:
    """FlashInfer 0.7.2's cutlass_fused_moe (its arguments, their order and its weight layout) on
    kiln's MoE layer: for each token t and its k slots ``e = token_selected_experts[t, j]`` of this
    rank, ``out[t] = sum_j token_final_scales[t, j] * (fc2[e] @ act(fc1[e] @ x_t + b1[e]) + b2[e])``.

    Args:
        input: ``[T, H]`` bfloat16 or float16; float8_e4m3fn with the per-tensor fp8 quant_scales.
        token_selected_experts: ``[T, k]`` int32 (int64 converted) global expert ids in
            ``[0, E * ep_size)``; -1 and the experts of other ranks contribute nothing.
        token_final_scales: ``[T, k]`` float32 routing weights.
        fc1_expert_weights: ``[E, 2I, H]`` for gated activations, **up rows first, then the gate**
            (FlashInfer's "w31"), ``[E, I, H]`` for the others; input's dtype (output_dtype's for
            fp8 input) or float8_e4m3fn with quant_scales. E: this rank's experts.
        fc2_expert_weights: ``[E, H, I]``, likewise.
        output_dtype: bfloat16 or float16 (None: the input's); a 16-bit input must have it.
        quant_scales: None or [] for 16-bit weights; for float8_e4m3fn weights either
            ``(fc1_scale, fc2_scale)``, float32 per expert ``[E]`` or per 128 x 128 block
            (``[E, ceil(rows/128), ceil(cols/128)]``, DeepSeek-V3; 16-bit input, as with
            use_deepseek_fp8_block_scale), or FlashInfer's per-tensor four
            ``[fc1_dequant [E], fc2_act_quant (one), fc2_dequant [E], fc1_input_dequant (one)]`` with
            an e4m3 input quantised by fc1_input_dequant: ``fc1 = (x_q @ W1_q^T) * fc1_dequant[e]``
            (fc1_dequant includes the input's scale), ``fc2 = act @ W2_q^T * fc2_act_quant *
            fc2_dequant[e]``. Where FlashInfer rounds the activation to e4m3 with fc2_act_quant
            (saturating at 448 / fc2_act_quant), kiln keeps it 16-bit at decode sizes, or quantises
            it per 1 x 128 on the fp8 grouped path: the same result without that rounding.
        fc1_expert_biases, fc2_expert_biases: optional ``[E, 2I]`` (``[E, I]`` plain) and ``[E, H]``,
            added to each expert's fc1 output before the activation and to its fc2 output. With
            tensor parallelism every rank adds the fc2 bias it is given (pass it on one rank).
        input_sf, use_w4_group_scaling, use_mxfp8_act_scaling, use_packed_weights,
            use_wfp4afp8_humming: fp4 / mxfp8 / w4a8 / humming formats, not supported
            (NotImplementedError when set); swizzled_input_sf only describes input_sf.
        swiglu_alpha, swiglu_beta, swiglu_limit: float32 ``[E]``: SwiGLU with bias (Swiglu,
            SwigluBias: ``g = min(g, limit)``, ``g sigmoid(alpha g) (clamp(u, -limit, limit) +
            beta)``), SwigluStep's limit (7.0 without it), Situ's clamp.
        tp_size, tp_rank: tensor parallelism; the weights passed are this rank's slice of the
            intermediate dimension (fc1's up and gate rows, fc2's columns), so the output is this
            rank's partial sum (the caller all-reduces). Checked, no other effect.
        ep_size, ep_rank: expert parallelism; this rank holds global experts
            ``[ep_rank * E, (ep_rank + 1) * E)``.
        cluster_size, cluster_rank: 1 and 0 only; enable_alltoall: False only (kiln's layer does no
            communication).
        output: optional ``[T, H]`` of output_dtype (written, and returned as the list's entry).
        use_deepseek_fp8_block_scale: fp8 e4m3 weights with 128 x 128 block scales (quant_scales
            ``(fc1_scale, fc2_scale)``), activations quantised per 1 x 128 on the fp8 grouped path;
            on every GPU kiln runs (FlashInfer: sm90 only).
        min_latency_mode: must be False (FlashInfer 0.7.2 raises NotImplementedError for it too).
        tune_max_num_tokens, profile_ids (``[gemm1, gemm2]`` tactic indices of FlashInfer's tuner):
            accepted and checked; kiln's GEMMs take their tactics from kiln's autotuner.
        enable_pdl: accepted (None, True or False) and resolved; the layer's kernels do not use
            programmatic dependent launch, so it does not change the launches.
        activation_type: an :class:`ActivationType` (or its int value); InvalidType is refused.
        use_fused_finalize: accepted, the same result either way: kiln's final weighted sum over the
            k experts is always deterministic (no atomics), bit for bit from run to run.
        workspace_buffer: optional 1-D uint8/int8 buffer on the input's device of at least
            :func:`cutlass_fused_moe_workspace_size` bytes: the layer's scratch is carved from it
            and nothing is allocated but ``output`` (when not given). Otherwise scratch is
            allocated per call.
        clamped_relu2_limit: the ``[1]`` float32 limit of ClampedRelu2
            (``(limit tanh(relu(x) / limit))^2``), required with it and only with it.
        situ_beta, situ_linear_beta: float32 ``[E]`` Situ scales (4.0 and 25.0 without them).
        backend: "cutlass" (FlashInfer's name for its default) or "auto" (default): kiln's choice,
            today the CUDA GEMMs; "cuda"; "triton" (kiln's Triton grouped GEMM at every batch size,
            as :func:`fused_moe`). FlashInfer's "cake" is not supported.

    Returns:
        ``[output]``: a list whose first entry is the ``[T, H]`` output, as FlashInfer's (whose list
        also carries three min-latency-mode tensors, left unset outside that mode).
    """
    api = "kiln.cutlass_fused_moe"
    _tensor(api, "input", input, 2)
    device = input.device
    if backend == "cake":
        raise _not_claimed(api, 'backend="cake"', "FlashInfer's prepared TP8 SiTU NVFP4 path")
    if backend not in _CUTLASS_BACKENDS:
        raise ValueError(f"{api}: backend must be one of {', '.join(_CUTLASS_BACKENDS)}, got {backend!r}")
    layer_backend = "auto" if backend == "cutlass" else backend
    for name, value in (
        ("input_sf", input_sf is not None),
        ("use_w4_group_scaling", use_w4_group_scaling),
        ("use_mxfp8_act_scaling", use_mxfp8_act_scaling),
        ("use_packed_weights", use_packed_weights),
        ("use_wfp4afp8_humming", use_wfp4afp8_humming),
    ):
        if value:
            raise _not_claimed(
                api, name, "nvfp4, mxfp8, mxfp4, w4a8 and humming formats are FlashInfer's alone"
            )
    if enable_alltoall:
        raise _not_claimed(api, "enable_alltoall", "the layer does no communication")
    if min_latency_mode:
        raise _not_claimed(api, "min_latency_mode", "FlashInfer 0.7.2 raises NotImplementedError for it too")
    if cluster_size != 1 or cluster_rank != 0:
        raise _not_claimed(api, f"cluster_size {cluster_size} / cluster_rank {cluster_rank}", "only 1 and 0")
    _check_parallel(api, "tp", tp_size, tp_rank)
    _check_parallel(api, "ep", ep_size, ep_rank)
    if (
        isinstance(tune_max_num_tokens, bool)
        or not isinstance(tune_max_num_tokens, int)
        or tune_max_num_tokens < 1
    ):
        raise ValueError(f"{api}: tune_max_num_tokens must be a positive int, got {tune_max_num_tokens!r}")
    if profile_ids is not None and (not isinstance(profile_ids, list | tuple) or len(profile_ids) != 2):
        raise ValueError(
            f"{api}: profile_ids must contain [gemm1_profile, gemm2_profile], got {profile_ids!r}"
        )
    if enable_pdl is not None and not isinstance(enable_pdl, bool):  # (the launches do not use PDL)
        raise TypeError(f"{api}: enable_pdl must be a bool or None, got {type(enable_pdl).__name__}")
    a = _activation_type(api, activation_type)
    _tensor(api, "fc1_expert_weights", fc1_expert_weights, 3)
    _tensor(api, "fc2_expert_weights", fc2_expert_weights, 3)
    e = fc1_expert_weights.shape[0]
    given = {
        "swiglu_alpha": swiglu_alpha,
        "swiglu_beta": swiglu_beta,
        "swiglu_limit": swiglu_limit,
        "situ_beta": situ_beta,
        "situ_linear_beta": situ_linear_beta,
        "clamped_relu2_limit": clamped_relu2_limit,
    }
    act = _cutlass_activation(api, a, e, device, given)
    if output_dtype is None:
        output_dtype = input.dtype
    if output_dtype not in _16BIT:
        raise TypeError(f"{api}: output_dtype must be torch.bfloat16 or torch.float16, got {output_dtype}")
    fp8_input = input.dtype == torch.float8_e4m3fn
    if not fp8_input and input.dtype not in _16BIT:
        raise TypeError(
            f"{api}: input.dtype must be bfloat16, float16, or float8_e4m3fn with the per-tensor fp8 "
            "quant_scales, "
            f"got {input.dtype}"
        )
    if not fp8_input and output_dtype != input.dtype:
        raise TypeError(f"{api}: output_dtype must be the input's dtype ({input.dtype}), got {output_dtype}")
    scales = list(quant_scales) if isinstance(quant_scales, list | tuple) else quant_scales
    if scales is not None and not isinstance(scales, list):
        raise TypeError(
            f"{api}: quant_scales must be a list of tensors or None, got {type(quant_scales).__name__}"
        )
    fc1_scale = fc2_scale = None
    if scales:
        if len(scales) == 2:
            fc1_scale, fc2_scale = scales
            if fp8_input:
                raise ValueError(
                    f"{api}: (fc1_scale, fc2_scale) quant_scales take a 16-bit input; a float8_e4m3fn input "
                    "goes with the per-tensor four [fc1_dequant, fc2_act_quant, fc2_dequant, "
                    "fc1_input_dequant]"
                )
        elif len(scales) == 4 and not use_deepseek_fp8_block_scale:
            if not fp8_input:
                raise ValueError(
                    f"{api}: the per-tensor fp8 quant_scales need the input quantised to float8_e4m3fn (as "
                    f"FlashInfer's), got {input.dtype}"
                )
            fc1_dequant, fc2_quant, fc2_dequant, fc1_input_dequant = scales
            fc1_scale = _scalar_scale(api, "fc1_dequant", fc1_dequant, e, device, True)
            fc2_scale = _scalar_scale(api, "fc2_dequant", fc2_dequant, e, device, True)
            fc2_scale = fc2_scale * _scalar_scale(api, "fc2_act_quant", fc2_quant, e, device, False)
            _scalar_scale(api, "fc1_input_dequant", fc1_input_dequant, e, device, False)
        else:
            raise ValueError(
                f"{api}: quant_scales must be None or [] (16-bit weights), (fc1_scale, fc2_scale) (fp8 "
                "weights, per expert or 128 x 128 blocks) or the per-tensor four [fc1_dequant, "
                f"fc2_act_quant, fc2_dequant, fc1_input_dequant], got {len(scales)} entries"
            )
    elif fp8_input:
        raise ValueError(
            f"{api}: a float8_e4m3fn input needs the per-tensor quant_scales [fc1_dequant, fc2_act_quant, "
            "fc2_dequant, fc1_input_dequant]"
        )
    if use_deepseek_fp8_block_scale:
        ok = (
            fc1_expert_weights.dtype == torch.float8_e4m3fn
            and fc2_expert_weights.dtype == torch.float8_e4m3fn
            and fc1_scale is not None
            and fc1_scale.dim() == 3
            and fc2_scale.dim() == 3
        )
        if not ok:
            raise ValueError(
                f"{api}: use_deepseek_fp8_block_scale takes float8_e4m3fn weights and quant_scales "
                "(fc1_scale, "
                "fc2_scale) of 128 x 128 blocks, [E, ceil(rows/128), ceil(cols/128)] float32"
            )
    for name, b in (("fc1_expert_biases", fc1_expert_biases), ("fc2_expert_biases", fc2_expert_biases)):
        if b is not None:
            _tensor(api, name, b, 2)
            if b.device != device or not b.is_floating_point():
                raise ValueError(
                    f"{api}: {name} must be a float tensor on {device}, got {b.dtype} on {b.device}"
                )
    i = fc2_expert_weights.shape[-1]
    if fc1_expert_biases is not None and tuple(fc1_expert_biases.shape) != (e, fc1_expert_weights.shape[1]):
        raise ValueError(
            f"{api}: fc1_expert_biases must be [E = {e}, {fc1_expert_weights.shape[1]}] (fc1's rows), got "
            f"{list(fc1_expert_biases.shape)}"
        )
    if fc2_expert_biases is not None and tuple(fc2_expert_biases.shape) != (e, fc2_expert_weights.shape[1]):
        raise ValueError(
            f"{api}: fc2_expert_biases must be [E = {e}, H = {fc2_expert_weights.shape[1]}], got "
            f"{list(fc2_expert_biases.shape)}"
        )
    if act is None and (fc1_expert_biases is not None or fc2_expert_biases is not None):
        kind, _, defaults = _ACT_KERNELS[a]
        act = _Act(kind, True, (None, None, None), defaults)
    if not a.is_gated and fc1_expert_weights.shape[1] != i:
        raise ValueError(
            f"{api}: ActivationType.{a.name} is not gated: fc1_expert_weights must be [E, I = {i}, H], got "
            f"{list(fc1_expert_weights.shape)}"
        )
    t, h = input.shape[0], fc2_expert_weights.shape[1]
    if output is None:
        output = torch.empty((t, h), dtype=output_dtype, device=device)
    else:
        _tensor(api, "output", output, 2)
        if tuple(output.shape) != (t, h) or output.dtype != output_dtype or output.device != device:
            raise ValueError(
                f"{api}: output must be {output_dtype} [{t}, {h}] on {device}, got {output.dtype} "
                f"{list(output.shape)} on {output.device}"
            )
    if workspace_buffer is not None:
        _check_workspace(api, workspace_buffer, device)
    if e * ep_size >= 2**31:
        raise ValueError(f"{api}: E * ep_size = {e * ep_size} experts do not fit int32 ids")
    _layer(
        api,
        input,
        fc1_expert_weights,
        fc2_expert_weights,
        token_final_scales,
        token_selected_experts,
        "gelu" if a == ActivationType.GegluTanh else "silu",
        fc1_scale,
        fc2_scale,
        output,
        up_first=True,
        backend=layer_backend,
        act=act,
        bias13=fc1_expert_biases,
        bias2=fc2_expert_biases,
        experts=(ep_rank * e, ep_size * e),
        workspace=workspace_buffer,
        x_copy=fp8_input,
    )
    return [output]


@logged_api
def cutlass_fused_moe_workspace_size(
    max_num_tokens: int,
    hidden_size: int,
    intermediate_size: int,
    num_experts_total: int,
    top_k: int,
    *,
    x_dtype: torch.dtype,
    weight_dtype: torch.dtype,
    output_dtype: torch.dtype = torch.bfloat16,
    activation_type: ActivationType = ActivationType.Swiglu,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    min_latency_mode: bool = False,
    use_deepseek_fp8_block_scale: bool = False,
    use_w4_group_scaling: bool = False,
    use_mxfp8_act_scaling: bool = False,
    use_fused_finalize: bool = True,
    use_packed_weights: bool = False,
    use_wfp4afp8_humming: bool = False,
    device: torch.device | str | None = None,
    backend: str = "cutlass",
) -> int:
    """Bytes of the workspace_buffer :func:`cutlass_fused_moe` needs for any call of up to
    ``max_num_tokens`` tokens with these shapes (FlashInfer 0.7.2's signature and meaning): kiln's
    real scratch for the largest such call, the larger of its decode-size and grouped paths (each
    grows with the tokens), each buffer 256-byte aligned. Allocate it once (``torch.empty(n,
    dtype=torch.uint8, device=...)``) and pass it on every call; one buffer per stream.

    Args:
        max_num_tokens, hidden_size, top_k: the call's T bound, H and k (positive).
        intermediate_size: the logical intermediate size; each rank holds intermediate_size / tp_size.
        num_experts_total: experts across the EP ranks (divisible by ep_size; each holds E / ep_size).
        x_dtype, weight_dtype, output_dtype: the input's, the weights' and the output's dtypes.
        activation_type: its fc1 rows (2I gated, I plain) and whether the generic path runs.
        use_deepseek_fp8_block_scale: fp8 weights with 128 x 128 block scales.
        device: the device the buffer is for (default: the current CUDA device, else the CPU);
            kiln's need does not depend on it. The other flags are accepted as FlashInfer's;
            the fp4 / mxfp8 / w4a8 ones are refused as cutlass_fused_moe refuses them.

    Not counted, as they are not scratch: the output (when cutlass_fused_moe allocates it) and,
    with fp8 weights on the grouped path, the per-1 x 128 quantised activations that
    kiln.per_token_group_quant_fp8 allocates.
    """
    api = "kiln.cutlass_fused_moe_workspace_size"
    if backend == "cake":
        raise _not_claimed(api, 'backend="cake"', "FlashInfer's prepared TP8 SiTU NVFP4 path")
    if backend not in _CUTLASS_BACKENDS:
        raise ValueError(f"{api}: backend must be one of {', '.join(_CUTLASS_BACKENDS)}, got {backend!r}")
    for name, v in (
        ("max_num_tokens", max_num_tokens),
        ("hidden_size", hidden_size),
        ("intermediate_size", intermediate_size),
        ("num_experts_total", num_experts_total),
        ("top_k", top_k),
        ("tp_size", tp_size),
        ("ep_size", ep_size),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{api}: {name} must be positive, got {v!r}")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"{api}: tp_rank must be in [0, {tp_size}), got {tp_rank}")
    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"{api}: ep_rank must be in [0, {ep_size}), got {ep_rank}")
    if num_experts_total % ep_size:
        raise ValueError(
            f"{api}: num_experts_total ({num_experts_total}) must be divisible by ep_size ({ep_size})"
        )
    for name, value in (
        ("use_w4_group_scaling", use_w4_group_scaling),
        ("use_mxfp8_act_scaling", use_mxfp8_act_scaling),
        ("use_packed_weights", use_packed_weights),
        ("use_wfp4afp8_humming", use_wfp4afp8_humming),
    ):
        if value:
            raise _not_claimed(
                api, name, "nvfp4, mxfp8, mxfp4, w4a8 and humming formats are FlashInfer's alone"
            )
    if min_latency_mode:
        raise _not_claimed(api, "min_latency_mode", "FlashInfer 0.7.2 raises NotImplementedError for it too")
    if device is not None:
        torch.device(device)  # a bad device string is an error here too
    a = _activation_type(api, activation_type)
    fp8_input = x_dtype == torch.float8_e4m3fn
    dtype = output_dtype if fp8_input else x_dtype
    if dtype not in _16BIT:
        raise TypeError(f"{api}: x_dtype must be bfloat16, float16 or float8_e4m3fn, got {x_dtype}")
    fp8 = weight_dtype == torch.float8_e4m3fn
    if not fp8 and weight_dtype != dtype:
        raise TypeError(f"{api}: weight_dtype must be {dtype} or float8_e4m3fn, got {weight_dtype}")
    e, i, h, k = num_experts_total // ep_size, -(-intermediate_size // tp_size), hidden_size, top_k
    rows13 = 2 * i if a.is_gated else i
    # The generic path runs for every activation but plain SwiGLU and GeGLU-tanh, and for those too
    # with a bias or activation parameters (which this signature does not tell): count both paths.
    generics = (
        (False, True)
        if a in (ActivationType.Swiglu, ActivationType.SwigluBias, ActivationType.GegluTanh)
        else (True,)
    )
    need = 0
    small_t = min(max_num_tokens, SMALL_BATCH_TOKENS, (SMALL_BATCH_ROWS_PER_EXPERT * e) // k)
    for t in {small_t, max_num_tokens}:  # the largest decode-size call and the largest call
        for generic in generics:
            if t < 1:
                continue
            small, gemm13, gemm2 = _decide(
                t, k, e, h, i, fp8, fp8, use_deepseek_fp8_block_scale, True, generic, "auto"
            )
            deq13, deq2 = not small and fp8 and not gemm13, not small and fp8 and not gemm2
            plan = _layer_plan(t, k, e, h, i, rows13, dtype, small, deq13, deq2, fp8_input)
            need = max(need, _plan_bytes(plan))
    return need
