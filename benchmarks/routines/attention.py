"""Routines of the attention APIs: paged decode (batch and single), attention-state merges and the
paged-KV append, each against the torch equivalent a user has without kiln and FlashInfer 0.7
(when importable, CUDA only).

Decode: torch runs scaled_dot_product_attention(enable_gqa=True) on the same K/V gathered into a
contiguous [batch, kv_heads, kv_len, head_dim] layout outside timing (the fastest thing torch
offers); FlashInfer runs its BatchDecodeWithPagedKVCacheWrapper with and without tensor cores on
the same paged cache. Bytes counted: K and V of every request once, plus q and out.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import kiln
from kiln.trace import attention as attention_traces
from kiln.trace import torch_dtype

from ..routine import Backend, Routine, cuda_only
from .norm import _flashinfer, flashinfer_version, kiln_version, torch_version

WORKSPACE_BYTES = 128 << 20


def flashinfer_available(device: torch.device, dtype: str) -> str | None:
    if dtype not in ("float16", "bfloat16"):
        return f"FlashInfer's attention kernels take float16 and bfloat16, not {dtype}"
    return cuda_only(device) or _flashinfer()[1]


def _workspace(ctx):
    """One float workspace per (workload, backend), shared by its rotating input sets."""
    if "workspace" not in ctx.shared:
        ctx.shared["workspace"] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)
    return ctx.shared["workspace"]


def _plan_args(inp):
    return (
        inp["indptr"],
        inp["indices"],
        inp["last_page_len"],
        inp["num_qo_heads"],
        inp["num_kv_heads"],
        inp["head_dim"],
        inp["page_size"],
    )


# --- batch decode --------------------------------------------------------------------------------


def kiln_batch_decode(inp, ctx):
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(_workspace(ctx), "NHD")
    w.plan(*_plan_args(inp), q_data_type=inp["q"].dtype)
    q, cache, out = inp["q"], inp["paged_kv_cache"], torch.full_like(inp["q"], float("nan"))
    return lambda: w.run(q, cache, out=out)


def flashinfer_batch_decode(tensor_cores: bool):
    def setup(inp, ctx):
        fi = _flashinfer()[0]
        w = fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(ctx), "NHD", use_tensor_cores=tensor_cores)
        w.plan(*_plan_args(inp), q_data_type=inp["q"].dtype, kv_data_type=inp["q"].dtype)
        q, cache = inp["q"], inp["paged_kv_cache"]
        return lambda: w.run(q, cache)

    return setup


def dense_kv(inp):
    """Each request's K and V gathered from its pages into [batch, kv_heads, kv_len, head_dim]."""
    cache, indptr, indices, last = (inp[k] for k in ("paged_kv_cache", "indptr", "indices", "last_page_len"))
    b, page = inp["q"].shape[0], inp["page_size"]
    pages = int(indptr[1] - indptr[0]) if b else 0
    kv_len = (pages - 1) * page + int(last[0]) if pages else 0
    if not bool((indptr.diff() == pages).all()) or not bool((last == last[0]).all()):
        raise ValueError("torch_sdpa: the dense layout needs equal request lengths")
    gathered = cache[indices.long().view(b, pages)]  # [b, pages, 2, page, kv_heads, head_dim]
    k = gathered[:, :, 0].flatten(1, 2)[:, :kv_len].transpose(1, 2).contiguous()
    v = gathered[:, :, 1].flatten(1, 2)[:, :kv_len].transpose(1, 2).contiguous()
    return k, v


def torch_sdpa_batch_decode(inp, ctx):
    k, v = dense_kv(inp)
    q = inp["q"].unsqueeze(2)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).squeeze(2)


def batch_decode_bytes(axes, dtype):
    e = torch_dtype(dtype).itemsize
    kv = axes["batch_size"] * axes["kv_len"] * axes["num_kv_heads"] * axes["head_dim"] * 2 * e
    return kv + 2 * axes["batch_size"] * axes["num_qo_heads"] * axes["head_dim"] * e


def decode_flops(batch_axis: str | None):
    """QK and PV: 4 x query heads x kv_len x head_dim per request."""

    def count(axes, dtype):
        b = axes[batch_axis] if batch_axis else 1
        return 4 * b * axes["num_qo_heads"] * axes["kv_len"] * axes["head_dim"]

    return count


BATCH_DECODE = Routine(
    api=kiln.BatchDecodeWithPagedKVCacheWrapper.run,
    backends=(
        Backend("kiln", kiln_batch_decode, version=kiln_version),
        Backend("torch_sdpa", torch_sdpa_batch_decode, version=torch_version),
        Backend(
            "flashinfer",
            flashinfer_batch_decode(False),
            available=flashinfer_available,
            version=flashinfer_version,
        ),
        Backend(
            "flashinfer_tc",
            flashinfer_batch_decode(True),
            available=flashinfer_available,
            version=flashinfer_version,
        ),
    ),
    bytes_per_call=batch_decode_bytes,
    flops_per_call=decode_flops("batch_size"),
    max_sets=8,
)

# --- single decode -------------------------------------------------------------------------------


def kiln_single_decode(inp, ctx):
    q, k, v = inp["q"], inp["k"], inp["v"]
    return lambda: kiln.single_decode_with_kv_cache(q, k, v)


def torch_sdpa_single_decode(inp, ctx):
    q = inp["q"].unsqueeze(1)  # [heads, 1, head_dim]
    k, v = inp["k"].transpose(0, 1).contiguous(), inp["v"].transpose(0, 1).contiguous()
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).squeeze(1)


def flashinfer_single_decode(inp, ctx):
    fi = _flashinfer()[0]
    q, k, v = inp["q"], inp["k"], inp["v"]
    return lambda: fi.single_decode_with_kv_cache(q, k, v)


SINGLE_DECODE = Routine(
    api=kiln.single_decode_with_kv_cache,
    backends=(
        Backend("kiln", kiln_single_decode, version=kiln_version),
        Backend("torch_sdpa", torch_sdpa_single_decode, version=torch_version),
        Backend(
            "flashinfer", flashinfer_single_decode, available=flashinfer_available, version=flashinfer_version
        ),
    ),
    bytes_per_call=lambda axes, dtype: (
        torch_dtype(dtype).itemsize
        * axes["head_dim"]
        * (2 * axes["kv_len"] * axes["num_kv_heads"] + 2 * axes["num_qo_heads"])
    ),
    flops_per_call=decode_flops(None),
)

# --- merges --------------------------------------------------------------------------------------


def torch_merge(v, s):
    """The merge in plain torch, what a user writes without a kernel: the reference's own math
    (kiln.trace.attention.merge_float) in float32, rounded to the states' dtype."""
    merged, lse = attention_traces.merge_float(v, s, compute=torch.float32)
    return merged.to(v.dtype), lse


def kiln_merge_state(inp, ctx):
    args = (inp["v_a"], inp["s_a"], inp["v_b"], inp["s_b"])
    return lambda: kiln.merge_state(*args)


def torch_merge_state(inp, ctx):
    v_a, s_a, v_b, s_b = inp["v_a"], inp["s_a"], inp["v_b"], inp["s_b"]
    return lambda: torch_merge(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))


def flashinfer_merge_state(inp, ctx):
    fi = _flashinfer()[0]
    args = (inp["v_a"], inp["s_a"], inp["v_b"], inp["s_b"])
    return lambda: fi.merge_state(*args)


def kiln_merge_in_place(inp, ctx):
    v, s, vo, so = inp["v"], inp["s"], inp["v_other"], inp["s_other"]

    def run():
        kiln.merge_state_in_place(v, s, vo, so)
        return v, s

    return run


def flashinfer_merge_in_place(inp, ctx):
    fi = _flashinfer()[0]
    v, s, vo, so = inp["v"], inp["s"], inp["v_other"], inp["s_other"]

    def run():
        fi.merge_state_in_place(v, s, vo, so)
        return v, s

    return run


def kiln_merge_states(inp, ctx):
    v, s = inp["v"], inp["s"]
    return lambda: kiln.merge_states(v, s)


def torch_merge_states(inp, ctx):
    v, s = inp["v"], inp["s"]
    return lambda: torch_merge(v, s)


def flashinfer_merge_states(inp, ctx):
    fi = _flashinfer()[0]
    v, s = inp["v"], inp["s"]
    return lambda: fi.merge_states(v, s)


def state_bytes(states: int | str):
    def count(axes, dtype):
        n = axes[states] if isinstance(states, str) else states
        rows = axes["seq_len"] * axes["num_heads"]
        return rows * ((n + 1) * (axes["head_dim"] * torch_dtype(dtype).itemsize + 4))

    return count


MERGE_STATE = Routine(
    api=kiln.merge_state,
    backends=(
        Backend("kiln", kiln_merge_state, version=kiln_version),
        Backend("torch", torch_merge_state, version=torch_version),
        Backend(
            "flashinfer", flashinfer_merge_state, available=flashinfer_available, version=flashinfer_version
        ),
    ),
    bytes_per_call=state_bytes(2),
)
MERGE_STATE_IN_PLACE = Routine(
    api=kiln.merge_state_in_place,
    backends=(
        Backend("kiln", kiln_merge_in_place, version=kiln_version),
        Backend(
            "flashinfer",
            flashinfer_merge_in_place,
            available=flashinfer_available,
            version=flashinfer_version,
        ),
    ),
    bytes_per_call=state_bytes(2),
)
MERGE_STATES = Routine(
    api=kiln.merge_states,
    backends=(
        Backend("kiln", kiln_merge_states, version=kiln_version),
        Backend("torch", torch_merge_states, version=torch_version),
        Backend(
            "flashinfer", flashinfer_merge_states, available=flashinfer_available, version=flashinfer_version
        ),
    ),
    bytes_per_call=state_bytes("num_states"),
)

# --- append / batch indices ------------------------------------------------------------------------


# FlashInfer's argument order, which kiln's append_paged_kv_cache shares.
APPEND_ARGS = (
    "append_key",
    "append_value",
    "batch_indices",
    "positions",
    "paged_kv_cache",
    "kv_indices",
    "kv_indptr",
    "kv_last_page_len",
)


def _append_run(append, inp):
    args = [inp[n] for n in APPEND_ARGS]

    def run():
        append(*args)
        return inp["paged_kv_cache"]

    return run


def kiln_append(inp, ctx):
    return _append_run(kiln.append_paged_kv_cache, inp)


def torch_append(inp, ctx):
    """torch indexing, the reference's own (kiln.trace.attention.append_into)."""
    cache = inp["paged_kv_cache"]
    args = [inp[n] for n in ("append_key", "append_value", "batch_indices", "positions", "kv_indices",
                             "kv_indptr")]

    def run():
        attention_traces.append_into(cache, *args)
        return cache

    return run


def flashinfer_append(inp, ctx):
    return _append_run(_flashinfer()[0].append_paged_kv_cache, inp)


def append_bytes(axes, dtype):
    """The appended keys and values, read once and written once."""
    n = axes["batch_size"] * axes["append_len"] * axes["num_kv_heads"] * axes["head_dim"]
    return 4 * n * torch_dtype(dtype).itemsize


APPEND_PAGED_KV_CACHE = Routine(
    api=kiln.append_paged_kv_cache,
    backends=(
        Backend("kiln", kiln_append, version=kiln_version),
        Backend("torch", torch_append, version=torch_version),
        Backend("flashinfer", flashinfer_append, available=flashinfer_available, version=flashinfer_version),
    ),
    bytes_per_call=append_bytes,
    max_sets=4,
)


def kiln_batch_indices_positions(inp, ctx):
    args = (inp["append_indptr"], inp["seq_lens"], inp["nnz"])
    return lambda: kiln.get_batch_indices_positions(*args)


def flashinfer_batch_indices_positions(inp, ctx):
    fi = _flashinfer()[0]
    args = (inp["append_indptr"], inp["seq_lens"], inp["nnz"])
    return lambda: fi.get_batch_indices_positions(*args)


GET_BATCH_INDICES_POSITIONS = Routine(
    api=kiln.get_batch_indices_positions,
    backends=(
        Backend("kiln", kiln_batch_indices_positions, version=kiln_version),
        Backend(
            "flashinfer",
            flashinfer_batch_indices_positions,
            available=lambda device, dtype: cuda_only(device) or _flashinfer()[1],
            version=flashinfer_version,
        ),
    ),
    bytes_per_call=lambda axes, dtype: 4 * (2 * axes["batch_size"] + 1 + 2 * axes["nnz"]),
)

# --- prefill -----------------------------------------------------------------------------------------


def prefill_flops(axes, dtype):
    """4 x queries x keys x heads x head_dim, halved for the causal square (qo_len = kv_len)."""
    b = axes.get("batch_size", 1)
    n = axes["qo_len"]
    return 4 * b * n * n * axes["num_qo_heads"] * axes["head_dim"] // 2


def kiln_fa3_available(device: torch.device, dtype: str) -> str | None:
    """kiln's sm90a prefill kernel runs on compute capability 9.0 only."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return "the fa3 kernel needs a compute capability 9.0 GPU"
    return None


def _batch_prefill(lib, inp, ctx, **wrapper_kw):
    """kiln's and FlashInfer's paged batch prefill share one API: the same plan and run."""
    w = lib.BatchPrefillWithPagedKVCacheWrapper(_workspace(ctx), "NHD", **wrapper_kw)
    w.plan(
        inp["qo_indptr"],
        inp["paged_kv_indptr"],
        inp["paged_kv_indices"],
        inp["paged_kv_last_page_len"],
        inp["num_qo_heads"],
        inp["num_kv_heads"],
        inp["head_dim_qk"],
        inp["page_size"],
        causal=inp["causal"],
        q_data_type=inp["q"].dtype,
        kv_data_type=inp["q"].dtype,
    )
    q, cache = inp["q"], inp["paged_kv_cache"]
    return lambda: w.run(q, cache)


def kiln_batch_prefill(inp, ctx, backend="auto"):
    return _batch_prefill(kiln, inp, ctx, backend=backend)


def flashinfer_batch_prefill(inp, ctx):
    return _batch_prefill(_flashinfer()[0], inp, ctx)


def torch_sdpa_batch_prefill(inp, ctx):
    """Equal-length requests as one [batch, heads, len, head_dim] SDPA call on contiguous K/V."""
    qo = inp["qo_indptr"]
    b, n = qo.numel() - 1, int(qo[1] - qo[0]) if qo.numel() > 1 else 0
    cache, pages = inp["paged_kv_cache"], inp["paged_kv_indices"].long().view(b, -1)
    k = cache[pages, 0].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    v = cache[pages, 1].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    q = inp["q"].view(b, n, *inp["q"].shape[1:]).transpose(1, 2).contiguous()
    causal = inp["causal"]
    return lambda: (
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        .transpose(1, 2)
        .reshape(inp["q"].shape)
    )


BATCH_PREFILL = Routine(
    api=kiln.BatchPrefillWithPagedKVCacheWrapper.run,
    backends=(
        Backend("kiln", kiln_batch_prefill, version=kiln_version),  # backend="auto"
        Backend("kiln_fa2", functools.partial(kiln_batch_prefill, backend="fa2"), version=kiln_version),
        Backend(
            "kiln_fa3",
            functools.partial(kiln_batch_prefill, backend="fa3"),
            kiln_fa3_available,
            version=kiln_version,
        ),
        Backend("torch_sdpa", torch_sdpa_batch_prefill, version=torch_version),
        Backend(
            "flashinfer", flashinfer_batch_prefill, available=flashinfer_available, version=flashinfer_version
        ),
    ),
    flops_per_call=prefill_flops,
    max_sets=4,
)


def _ragged_prefill(lib, inp, ctx, **wrapper_kw):
    """kiln's and FlashInfer's ragged batch prefill share one API: the same plan and run."""
    w = lib.BatchPrefillWithRaggedKVCacheWrapper(_workspace(ctx), "NHD", **wrapper_kw)
    w.plan(
        inp["qo_indptr"],
        inp["kv_indptr"],
        inp["num_qo_heads"],
        inp["num_kv_heads"],
        inp["head_dim_qk"],
        causal=inp["causal"],
        q_data_type=inp["q"].dtype,
        kv_data_type=inp["q"].dtype,
    )
    q, k, v = inp["q"], inp["k"], inp["v"]
    return lambda: w.run(q, k, v)


def kiln_ragged_prefill(inp, ctx, backend="auto"):
    return _ragged_prefill(kiln, inp, ctx, backend=backend)


def flashinfer_ragged_prefill(inp, ctx):
    return _ragged_prefill(_flashinfer()[0], inp, ctx)


BATCH_PREFILL_RAGGED = Routine(
    api=kiln.BatchPrefillWithRaggedKVCacheWrapper.run,
    backends=(
        Backend("kiln", kiln_ragged_prefill, version=kiln_version),  # backend="auto"
        Backend("kiln_fa2", functools.partial(kiln_ragged_prefill, backend="fa2"), version=kiln_version),
        Backend(
            "kiln_fa3",
            functools.partial(kiln_ragged_prefill, backend="fa3"),
            kiln_fa3_available,
            version=kiln_version,
        ),
        Backend(
            "flashinfer",
            flashinfer_ragged_prefill,
            available=flashinfer_available,
            version=flashinfer_version,
        ),
    ),
    flops_per_call=prefill_flops,
    max_sets=4,
)


def kiln_single_prefill(inp, ctx, backend="auto"):
    q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
    return lambda: kiln.single_prefill_with_kv_cache(q, k, v, causal=causal, backend=backend)


def torch_sdpa_single_prefill(inp, ctx):
    q = inp["q"].transpose(0, 1).unsqueeze(0).contiguous()
    k = inp["k"].transpose(0, 1).unsqueeze(0).contiguous()
    v = inp["v"].transpose(0, 1).unsqueeze(0).contiguous()
    causal = inp["causal"]
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)[0].transpose(
        0, 1
    )


def flashinfer_single_prefill(backend: str):
    def setup(inp, ctx):
        fi = _flashinfer()[0]
        q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
        return lambda: fi.single_prefill_with_kv_cache(q, k, v, causal=causal, backend=backend)

    return setup


def fa3_available(device, dtype):
    reason = flashinfer_available(device, dtype)
    if reason is None and torch.cuda.get_device_capability(device)[0] != 9:
        return "FlashInfer's fa3 backend needs sm90"
    return reason


SINGLE_PREFILL = Routine(
    api=kiln.single_prefill_with_kv_cache,
    backends=(
        Backend("kiln", kiln_single_prefill, version=kiln_version),  # backend="auto"
        Backend("kiln_fa2", functools.partial(kiln_single_prefill, backend="fa2"), version=kiln_version),
        Backend(
            "kiln_fa3",
            functools.partial(kiln_single_prefill, backend="fa3"),
            kiln_fa3_available,
            version=kiln_version,
        ),
        Backend("torch_sdpa", torch_sdpa_single_prefill, version=torch_version),
        Backend(
            "flashinfer_fa2",
            flashinfer_single_prefill("fa2"),
            available=flashinfer_available,
            version=flashinfer_version,
        ),
        Backend(
            "flashinfer_fa3",
            flashinfer_single_prefill("fa3"),
            available=fa3_available,
            version=flashinfer_version,
        ),
    ),
    flops_per_call=prefill_flops,
    max_sets=4,
)

ROUTINES = (BATCH_DECODE, SINGLE_DECODE, MERGE_STATE, MERGE_STATE_IN_PLACE, MERGE_STATES,
            APPEND_PAGED_KV_CACHE, GET_BATCH_INDICES_POSITIONS, BATCH_PREFILL, BATCH_PREFILL_RAGGED,
            SINGLE_PREFILL)
