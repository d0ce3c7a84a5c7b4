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
                      fc2_expert_weights, output_dtype=None, quant_scales=None, output=None, *,
                      backend="auto")                          fc1 [E, 2I, H]: up rows, then gate

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
kiln.check_errors(). docs/moe.md has the layouts, the tie rules and what each refuses.
"""

from __future__ import annotations

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
# otherwise (docs/perf/gemm-triton.md: triton loses by 1.8-2.7x from 16384 rows, wins ~10% only
# around 128 rows).
BACKENDS = ("auto", "cuda", "triton")
BLOCK = 128  # fp8 block scales: 128 x 128 weights share one float32 scale (DeepSeek-V3)
# The small-batch path (ops/moe/moe.cuh's expert kernels) runs for at most this many tokens when
# the routed rows average at most 8 per expert; the grouped GEMMs otherwise (measured on the H200:
# Mixtral-8x7B at T = 64, 16 rows an expert, ran 1.05 ms on the small-batch kernels, 0.77 ms on
# the grouped GEMMs; docs/perf/moe.md). Shapes only: the choice never depends on the routing.
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
) -> None:
    device = hidden_states.device
    mod = _module("kiln.moe_permute", device, hidden_states.dtype, "hidden_states.dtype")
    dl, stream, errs = _jit.dl, _jit.stream_of(device), errors.record_address(device)
    mod.sort(
        ids=dl(topk_ids),
        num_experts=num_experts,
        offs=dl(offs),
        src_idx=dl(src_idx),
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


def _unpermute(api: str, rows, topk_weights, src_idx, out) -> torch.Tensor:
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


def _dequantized(w: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    """fp8 w times its scales in the activation dtype (the grouped path's fallback); 16-bit w as is."""
    if scale is None:
        return w
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
):
    if backend not in BACKENDS:
        raise ValueError(f"{api}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    x = _tensor(api, "hidden_states", hidden_states, 2)
    if x.dtype not in _16BIT:
        raise TypeError(f"{api}: hidden_states.dtype must be bfloat16 or float16, got {x.dtype}")
    _tensor(api, "w13", w13, 3)
    _tensor(api, "w2", w2, 3)
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{api}: activation must be one of {list(ACTIVATIONS)} (gelu: the tanh approximation), "
            f"got {activation!r}"
        )
    t, h = x.shape
    e, two_i, h13 = w13.shape
    if two_i % 2 or h13 != h:
        raise ValueError(
            f"{api}: w13 must be [E, 2I, H = {h}] (hidden_states.shape[1]), got {list(w13.shape)}"
        )
    i = two_i // 2
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
        if out.dtype != x.dtype or tuple(out.shape) != (t, h):
            raise ValueError(f"{api}: out must be {x.dtype} [{t}, {h}], got {out.dtype} {list(out.shape)}")
    fp8_13 = _check_weight(api, "w13", w13, w13_scale, x.dtype)
    fp8_2 = _check_weight(api, "w2", w2, w2_scale, x.dtype)
    permuted, offs, src_idx = moe_permute(x, ids, e)
    n = permuted.shape[0]
    unit = w13.stride(-1) == 1 and w2.stride(-1) == 1  # the small-batch kernels stream weight rows
    if backend != "triton" and unit and t <= SMALL_BATCH_TOKENS and n <= SMALL_BATCH_ROWS_PER_EXPERT * e:
        # Few rows per expert (decode): the small-batch kernels read each selected expert's weights
        # once (fp8 ones as they are, scaled in the kernel), the activation fused into the up
        # projection.
        act = torch.empty((n, i), dtype=x.dtype, device=x.device)
        gate0, up0 = (i, 0) if up_first else (0, i)
        _experts_op(act, permuted, w13, offs, True, activation, gate0, up0, w13_scale if fp8_13 else None)
        down = torch.empty((n, h), dtype=x.dtype, device=x.device)
        _experts_op(down, act, w2, offs, False, "silu", 0, 0, w2_scale if fp8_2 else None)
        return _unpermute(api, down, topk_weights.to(torch.float32), src_idx, out)
    fp8_gemm = FP8_GROUPED_GEMM and backend != "triton"
    # fc1's two halves are separate GEMMs: block scales split at row I need I % 128 == 0.
    split_ok = not up_first or w13_scale is None or w13_scale.dim() == 1 or i % BLOCK == 0
    gemm13 = fp8_gemm and fp8_13 and h % BLOCK == 0 and split_ok and w13.stride(-1) == 1
    gemm2 = fp8_gemm and fp8_2 and i % BLOCK == 0 and w2.stride(-1) == 1
    up = torch.empty((n, two_i), dtype=x.dtype, device=x.device)
    # (weight rows, their block-scale rows, the output columns) of each GEMM: one for w13's gate
    # and up rows together; FlashInfer's fc1 (up_first) holds up rows, then gate, and the
    # activation takes the gate first: two GEMMs writing the halves of up. (No slicing for the
    # one-GEMM form: it stays traceable on fake tensors of any device.)
    if up_first:
        parts = [
            (w13[:, i:], slice(i // BLOCK, -(-two_i // BLOCK)), up[:, :i]),
            (w13[:, :i], slice(0, -(-i // BLOCK)), up[:, i:]),
        ]
    else:
        parts = [(w13, None, up)]
    if gemm13:
        xq, xs = per_token_group_quant_fp8(permuted, BLOCK)
        for rows, blocks, dst in parts:
            if w13_scale.dim() == 3:  # block scales: the blocks of these rows (I % 128 == 0 when split)
                sc = w13_scale if blocks is None else w13_scale[:, blocks]
            else:
                sc = _block_scales(w13_scale, rows.shape)
            _group_fp8(api, xq, rows, xs, sc.to(torch.float32), offs, True, "K", dst)
    else:
        deq = _dequantized(w13, w13_scale if fp8_13 else None, x.dtype)
        if up_first:
            parts = [(deq[:, i:], None, up[:, :i]), (deq[:, :i], None, up[:, i:])]
        else:
            parts = [(deq, None, up)]
        for rows, _, dst in parts:
            grouped_mm(permuted, rows.transpose(1, 2), offs, out=dst, backend=backend)
    act = ACTIVATIONS[activation](up)
    down = torch.empty((n, h), dtype=x.dtype, device=x.device)
    if gemm2:
        aq, as_ = per_token_group_quant_fp8(act, BLOCK)
        _group_fp8(api, aq, w2, as_, _block_scales(w2_scale, w2.shape), offs, True, "K", down)
    else:
        w2 = _dequantized(w2, w2_scale if fp8_2 else None, x.dtype)
        grouped_mm(act, w2.transpose(1, 2), offs, out=down, backend=backend)
    return _unpermute(api, down, topk_weights.to(torch.float32), src_idx, out)


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
            they apply. ``"auto"`` (default): what measurement says, today ``"cuda"`` (on the
            H200 the Triton grouped GEMM loses by 1.8-2.7x from 16384 rows and wins only around
            128 rows, by ~10%: docs/perf/gemm-triton.md). CPU tensors run the host backend
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


@logged_api(mutates=("output",))
@traced(moe_traces.CUTLASS_FUSED_MOE)
def cutlass_fused_moe(
    input: torch.Tensor,
    token_selected_experts: torch.Tensor,
    token_final_scales: torch.Tensor,
    fc1_expert_weights: torch.Tensor,
    fc2_expert_weights: torch.Tensor,
    output_dtype: torch.dtype | None = None,
    quant_scales: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
    output: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """FlashInfer's cutlass_fused_moe (its argument order and weight layout) for the same layer as
    :func:`fused_moe`: ``fc1_expert_weights [E, 2I, H]`` holds the **up** rows first, then the
    gate (FlashInfer's "w31"); ``fc2_expert_weights [E, H, I]`` is w2. SwiGLU.

    Args:
        input: ``[T, H]`` bfloat16 or float16.
        token_selected_experts: ``[T, k]`` int32 expert ids (-1: none).
        token_final_scales: ``[T, k]`` float32 weights.
        output_dtype: must be the input's dtype (None: the input's).
        quant_scales: for fp8 e4m3 weights, ``(fc1_scale, fc2_scale)`` float32, per expert ``[E]`` or
            per 128 x 128 block (FlashInfer's DeepSeek block-scale form); None for 16-bit weights.
            FlashInfer's four-entry per-tensor list (with static activation scales) is not
            accepted: kiln's fp8 grouped path quantises the activations itself, per 1 x 128.
        output: optional ``[T, H]`` output.
        backend: the GEMMs' backend, as for :func:`fused_moe` (kiln's, not a FlashInfer argument):
            ``"auto"`` (default, today ``"cuda"``), ``"cuda"``, or ``"triton"`` (the Triton grouped
            GEMM at every batch size).
    """
    api = "kiln.cutlass_fused_moe"
    _tensor(api, "input", input, 2)
    if output_dtype is not None and output_dtype != input.dtype:
        raise TypeError(f"{api}: output_dtype must be the input's dtype ({input.dtype}), got {output_dtype}")
    fc1_scale = fc2_scale = None
    if quant_scales is not None:
        if not isinstance(quant_scales, (list, tuple)) or len(quant_scales) != 2:
            raise ValueError(
                f"{api}: quant_scales must be (fc1_scale, fc2_scale) for fp8 weights, got "
                f"{quant_scales!r:.80}"
            )
        fc1_scale, fc2_scale = quant_scales
    return _layer(
        api,
        input,
        fc1_expert_weights,
        fc2_expert_weights,
        token_final_scales,
        token_selected_experts,
        "silu",
        fc1_scale,
        fc2_scale,
        output,
        up_first=True,
        backend=backend,
    )
