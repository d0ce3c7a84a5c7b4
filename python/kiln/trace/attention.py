"""Trace templates of the attention APIs: paged decode (batch and single), attention-state merges,
and the paged-KV append.

Decode axes: `batch_size` and `kv_len` vary per call; heads, head_dim and the page size are a
model's. The references compute in float32 from the inputs, per request (so memory stays bounded
at the largest workloads), and return log-sum-exps in base 2 as the APIs do. Tolerances: the
output is rounded once to the dtype (half an ulp: 2^-11, 2^-8 relative) after float32
accumulation in another order, and P is rounded to the dtype for the P V product on tensor cores.
"""

from __future__ import annotations

import math

import torch

from .examples import LLAMA_3_1_8B, LLAMA_3_1_70B, PAGE_SIZE
from .template import Example, Scalar, Tensor, TraceTemplate, const, var

TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3)}
# (batch_size, kv_len) of decode steps: single-user latency with a short and a 32k context, and
# server batches; exactly the shapes the decode performance targets name.
DECODE_WORKLOADS = (
    {"batch_size": 1, "kv_len": 4096},
    {"batch_size": 1, "kv_len": 32768},
    {"batch_size": 16, "kv_len": 8192},
    {"batch_size": 64, "kv_len": 4096},
    {"batch_size": 256, "kv_len": 2048},
)
# Llama-3.1-8B is 32/8 heads, Llama-3.1-70B and Qwen3-32B both 64/8: two distinct attention shapes.
DECODE_MODELS = (LLAMA_3_1_8B, LLAMA_3_1_70B)
HEAD_AXES = {
    "num_qo_heads": const(doc="query heads"),
    "num_kv_heads": const(doc="key/value heads"),
    "head_dim": const(doc="dimension of one head"),
}


def decode_examples(workloads) -> tuple[Example, ...]:
    return tuple(
        Example(
            f"{m.name}-decode",
            m.name,
            "decode",
            {"num_qo_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim},
            tuple(workloads),
            source=m.source,
        )
        for m in DECODE_MODELS
    )


def attention(q, k, v, causal=False, window_left=-1, soft_cap=None, sm_scale=None, mask=None, bias=None):
    """The reference of every attention API (decode is qo_len 1), in float32, written from the
    definition and never from a kernel:

    q [qo_len, Hq, D], k/v [kv_len, Hk, D] (query head h reads kv head h // (Hq // Hk)) ->
    (out [qo_len, Hq, D], lse [qo_len, Hq] base 2). Query i sits at key position
    i + kv_len - qo_len: `causal` shows it keys j <= that position, `window_left` >= 0 only keys
    j >= position - window_left, `mask` (booleans [qo_len, kv_len]) only the keys it holds True;
    logits are q.k * sm_scale (default 1/sqrt(D)) plus `bias` ([Hq, qo_len, kv_len], ALiBi's),
    soft-capped as cap * tanh(logit / cap). A query that sees no key: out 0, lse -inf."""
    qo, hq, d = q.shape
    kv, hk = k.shape[0], k.shape[1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    kf = k.float().repeat_interleave(hq // hk, 1)
    vf = v.float().repeat_interleave(hq // hk, 1)
    logits = torch.einsum("ihd,jhd->hij", q.float(), kf) * sm_scale
    if bias is not None:
        logits = logits + bias.float()
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    pos = torch.arange(qo, device=q.device)[:, None] + kv - qo
    key = torch.arange(kv, device=q.device)[None, :]
    visible = torch.ones(qo, kv, dtype=torch.bool, device=q.device)
    if causal:
        visible &= key <= pos
    if window_left >= 0:
        visible &= key >= pos - window_left
    if mask is not None:
        visible &= mask.to(q.device, torch.bool).reshape(qo, kv)
    logits = logits.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1).nan_to_num(0.0)
    out = torch.einsum("hij,jhd->ihd", p, vf)
    return out, (lse / math.log(2)).transpose(0, 1)


def attend(q, k, v, sm_scale=None, soft_cap=None, window_left=-1):
    """Decode: q [Hq, D] over k/v [L, Hk, D] -> (out [Hq, D], lse [Hq]): attention() at qo_len 1."""
    out, lse = attention(q.unsqueeze(0), k, v, window_left=window_left, soft_cap=soft_cap, sm_scale=sm_scale)
    return out[0], lse[0]


# --- BatchDecodeWithPagedKVCacheWrapper.run ---------------------------------------------------


def paged_decode_inputs(t, axes, dtype, device, gen):
    """Every request kv_len long, its pages handed out in random order from the pool."""
    b, page = axes["batch_size"], axes["page_size"]
    pages = -(-axes["kv_len"] // page)
    return {
        "indptr": (torch.arange(b + 1, dtype=torch.int32) * pages).to(device),
        "indices": torch.randperm(b * pages, generator=gen).to(device=device, dtype=torch.int32),
        "last_page_len": torch.full(
            (b,), axes["kv_len"] - (pages - 1) * page, dtype=torch.int32, device=device
        ),
    }


def request_kv(paged_kv_cache, indptr, indices, last_page_len, b, page_size, num_kv_heads, head_dim):
    """Request b's keys and values, [kv_len, num_kv_heads, head_dim] each, from an NHD
    [pages, 2, page_size, heads, head_dim] cache."""
    pages = indices[indptr[b] : indptr[b + 1]].long()
    kv_len = (len(pages) - 1) * page_size + int(last_page_len[b]) if len(pages) else 0
    return tuple(paged_kv_cache[pages, i].reshape(-1, num_kv_heads, head_dim)[:kv_len] for i in (0, 1))


def batch_decode_reference(
    q, paged_kv_cache, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size
):
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        k, v = request_kv(
            paged_kv_cache, indptr, indices, last_page_len, b, page_size, num_kv_heads, head_dim
        )
        out[b] = attend(q[b], k, v)[0]
    return {"out": out}


BATCH_DECODE = TraceTemplate(
    name="batch_decode",
    target="//ops/attention:decode",
    description="one query token per request attends to its paged KV cache (GQA, NHD, plan/run)",
    axes={
        "batch_size": var("requests decoding one token"),
        "kv_len": var("tokens in each request's cache"),
        **HEAD_AXES,
        "page_size": const(PAGE_SIZE, "tokens per page"),
        "kv": const(2, "K and V"),
    },
    inputs={
        "q": Tensor(("batch_size", "num_qo_heads", "head_dim")),
        "paged_kv_cache": Tensor(
            ("batch_size * cdiv(kv_len, page_size)", "kv", "page_size", "num_kv_heads", "head_dim")
        ),
        "indptr": Tensor(("batch_size + 1",), "int32"),
        "indices": Tensor(("batch_size * cdiv(kv_len, page_size)",), "int32"),
        "last_page_len": Tensor(("batch_size",), "int32"),
        "num_qo_heads": Scalar("int32", axis="num_qo_heads"),
        "num_kv_heads": Scalar("int32", axis="num_kv_heads"),
        "head_dim": Scalar("int32", axis="head_dim"),
        "page_size": Scalar("int32", axis="page_size"),
    },
    outputs={"out": Tensor(("batch_size", "num_qo_heads", "head_dim"))},
    plan_inputs=(
        "indptr",
        "indices",
        "last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
    ),
    options={
        "args": "FlashInfer's extra positional arguments; not supported",
        "q_scale": "a scale folded into sm_scale: 1",
        "k_scale": "the cache's scale: 1 (these workloads' caches are 16-bit; fp8: decode_fp8.py)",
        "v_scale": "as k_scale",
        "lse": "second output, not benchmarked",
        "return_lse": "as lse",
        "enable_pdl": "launch detail",
        "window_left": "no sliding window",
        "sinks": "attention sinks; not supported",
        "q_len_per_req": "one query a request (multi-token decode: tests); run()'s is a deprecated check",
        "skip_softmax_threshold_scale_factor": "skip-softmax sparsity; not supported",
        "kv_cache_sf": "NVFP4 caches; not supported",
        "pos_encoding_mode": "NONE: RoPE is applied before attention (ROPE_LLAMA: tests only)",
        "logits_soft_cap": "none for these models",
        "q_data_type": "the workload dtype",
        "kv_data_type": "the workload dtype",
        "o_data_type": "q's dtype",
        "data_type": "deprecated alias of q_data_type / kv_data_type",
        "sm_scale": "the default 1/sqrt(head_dim)",
        "rope_scale": "no RoPE",
        "rope_theta": "no RoPE",
        "non_blocking": "host-to-device copies in plan",
        "block_tables": "FlashInfer's dense page table for other backends; unused",
        "seq_lens": "a check of the page table's lengths",
        "fixed_split_size": "the split heuristic (None)",
        "disable_split_kv": "the split heuristic (False)",
        "window_right": "0, the only value",
        "is_causal": "derived from q_len_per_req",
    },
    make_inputs=paged_decode_inputs,
    reference=batch_decode_reference,
    tolerance=TOLERANCE,
    examples=decode_examples(DECODE_WORKLOADS),
    small=({"batch_size": 1, "kv_len": 17}, {"batch_size": 3, "kv_len": 300}),
)

# --- single_decode_with_kv_cache ------------------------------------------------------------------


def single_decode_reference(q, k, v):
    return {"out": attend(q, k, v, 1.0 / math.sqrt(q.shape[-1]))[0]}


SINGLE_DECODE = TraceTemplate(
    name="single_decode",
    target="//ops/attention:decode",
    description="one query token attends to one contiguous KV cache (NHD)",
    axes={"kv_len": var("tokens in the cache"), **HEAD_AXES},
    inputs={
        "q": Tensor(("num_qo_heads", "head_dim")),
        "k": Tensor(("kv_len", "num_kv_heads", "head_dim")),
        "v": Tensor(("kv_len", "num_kv_heads", "head_dim")),
    },
    outputs={"out": Tensor(("num_qo_heads", "head_dim"))},
    options={
        "kv_layout": "NHD",
        "pos_encoding_mode": "NONE: RoPE is applied before attention",
        "use_tensor_cores": "accepted, ignored",
        "q_scale": "a scale folded into sm_scale: 1",
        "k_scale": "the cache's scale: 1 (16-bit caches)",
        "v_scale": "as k_scale",
        "window_left": "no sliding window",
        "logits_soft_cap": "none",
        "sm_scale": "the default 1/sqrt(head_dim)",
        "rope_scale": "no RoPE",
        "rope_theta": "no RoPE",
        "return_lse": "lse not benchmarked",
    },
    reference=single_decode_reference,
    tolerance=TOLERANCE,
    examples=decode_examples(tuple({"kv_len": n} for n in (1024, 4096, 32768))),
    small=({"kv_len": 1}, {"kv_len": 300}),
)

# --- merge_state / merge_state_in_place / merge_states --------------------------------------------

STATE_AXES = {
    "seq_len": var("rows (query tokens)"),
    "num_heads": const(doc="heads"),
    "head_dim": const(doc="dimension of one head"),
}
V = Tensor(("seq_len", "num_heads", "head_dim"))
S = Tensor(("seq_len", "num_heads"), "float32", "log-sum-exp, base 2")
STATE_EXAMPLES = tuple(
    Example(
        f"{m.name}-{phase}",
        m.name,
        phase,
        {"num_heads": m.num_q_heads, "head_dim": m.head_dim},
        tuple({"seq_len": n} for n in seqs),
        source=m.source,
    )
    for m in DECODE_MODELS
    for phase, seqs in (("decode", (1, 64, 256)), ("prefill", (2048, 8192)))
)
STATE_SMALL = ({"seq_len": 1}, {"seq_len": 37})


def merge_float(v, s, compute=torch.float64):
    """The reference of the merges: states along dim 1, v [n, S, H, D], s [n, S, H] (base 2) ->
    float32 (v, s), computed in `compute` (float64; the benchmarks' torch backend, what a user
    writes without a kernel, runs it in float32). An empty state (s = -inf) contributes nothing."""
    s_nat = s.to(compute) * math.log(2)
    lse = torch.logsumexp(s_nat, dim=1)
    w = torch.exp(s_nat - lse[:, None]).nan_to_num(0.0)
    return torch.einsum("nsh,nshd->nhd", w, v.to(compute)).float(), (lse / math.log(2)).float()


def merge_state_reference(v_a, s_a, v_b, s_b):
    v, s = merge_float(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))
    return {"v": v, "s": s}


def merge_state_in_place_reference(v, s, v_other, s_other):
    merged, lse = merge_float(torch.stack([v, v_other], 1), torch.stack([s, s_other], 1))
    return {"v": merged, "s": lse}


def merge_states_reference(v, s):
    merged, lse = merge_float(v, s)
    return {"v_merged": merged, "s_merged": lse}


MERGE_STATE = TraceTemplate(
    name="merge_state",
    target="//ops/attention:cascade",
    description="the attention state over the union of two disjoint key sets",
    axes=STATE_AXES,
    inputs={"v_a": V, "s_a": S, "v_b": V, "s_b": S},
    outputs={"v": V, "s": S},
    reference=merge_state_reference,
    tolerance=TOLERANCE,
    examples=STATE_EXAMPLES,
    small=STATE_SMALL,
)

MERGE_STATE_IN_PLACE = TraceTemplate(
    name="merge_state_in_place",
    target="//ops/attention:cascade",
    description="in place: (v, s) <- merge of (v, s) and (v_other, s_other)",
    axes=STATE_AXES,
    inputs={"v": V, "s": S, "v_other": V, "s_other": S},
    outputs={"v": V, "s": S},
    options={"mask": "every row merged"},
    reference=merge_state_in_place_reference,
    tolerance=TOLERANCE,
    examples=STATE_EXAMPLES,
    small=STATE_SMALL,
)

MERGE_STATES = TraceTemplate(
    name="merge_states",
    target="//ops/attention:cascade",
    description="merge num_states attention states per row into one",
    axes={**STATE_AXES, "num_states": var("states per row (KV splits, cascade levels)")},
    inputs={
        "v": Tensor(("seq_len", "num_states", "num_heads", "head_dim")),
        "s": Tensor(("seq_len", "num_states", "num_heads"), "float32"),
    },
    outputs={"v_merged": V, "s_merged": S},
    reference=merge_states_reference,
    tolerance=TOLERANCE,
    examples=tuple(
        Example(
            f"{m.name}-{phase}",
            m.name,
            phase,
            {"num_heads": m.num_q_heads, "head_dim": m.head_dim},
            loads,
            source=m.source,
        )
        for m in DECODE_MODELS
        for phase, loads in (
            ("decode", tuple({"seq_len": n, "num_states": k} for n in (1, 64, 256) for k in (2, 16))),
            ("prefill", tuple({"seq_len": n, "num_states": 2} for n in (2048, 8192))),
        )
    ),
    small=({"seq_len": 1, "num_states": 2}, {"seq_len": 9, "num_states": 5}),
)

# --- get_batch_indices_positions / append_paged_kv_cache -------------------------------------------


def append_layout(axes, device):
    """Every request appends append_len tokens and ends kv_len long."""
    b, n = axes["batch_size"], axes["append_len"]
    append_indptr = (torch.arange(b + 1, dtype=torch.int32) * n).to(device)
    seq_lens = torch.full((b,), axes["kv_len"], dtype=torch.int32, device=device)
    return append_indptr, seq_lens


def batch_indices_positions_inputs(t, axes, dtype, device, gen):
    append_indptr, seq_lens = append_layout(axes, device)
    return {"append_indptr": append_indptr, "seq_lens": seq_lens}


def batch_indices_positions_reference(append_indptr, seq_lens, nnz):
    """Token i of request b (append_indptr[b] <= i < append_indptr[b + 1]) sits at position
    seq_lens[b] - count_b + (i - append_indptr[b]); tokens past append_indptr[-1] (up to nnz) are
    padding: batch index -1, position 0 (FlashInfer's zero-filled allocation)."""
    counts = (append_indptr[1:] - append_indptr[:-1]).long()
    real = int(append_indptr[-1])
    batch = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    offset = torch.arange(real, device=counts.device) - append_indptr[:-1].long()[batch]
    positions = seq_lens.long()[batch] - counts[batch] + offset
    pad = torch.full((nnz - real,), -1, dtype=torch.int64, device=counts.device)
    return {"batch_indices": torch.cat([batch, pad]).int(),
            "positions": torch.cat([positions, pad + 1]).int()}


APPEND_AXES = {
    "batch_size": var("requests appending"),
    "append_len": var("tokens each request appends"),
    "kv_len": var("each request's length after the append"),
    "num_kv_heads": const(doc="key/value heads"),
    "head_dim": const(doc="dimension of one head"),
    "page_size": const(PAGE_SIZE, "tokens per page"),
    "kv": const(2, "K and V"),
}
APPEND_EXAMPLES = tuple(
    Example(
        f"{m.name}-{phase}",
        m.name,
        phase,
        {"num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim},
        tuple(loads),
        source=m.source,
    )
    for m in DECODE_MODELS
    for phase, loads in (
        ("decode", [{"batch_size": b, "append_len": 1, "kv_len": 4096} for b in (1, 64, 256)]),
        ("prefill", [{"batch_size": 1, "append_len": n, "kv_len": n} for n in (2048, 8192)]),
    )
)
APPEND_SMALL = (
    {"batch_size": 1, "append_len": 1, "kv_len": 5},
    {"batch_size": 3, "append_len": 7, "kv_len": 40},
)

GET_BATCH_INDICES_POSITIONS = TraceTemplate(
    name="get_batch_indices_positions",
    target="//ops/attention:positions",
    description="request index and position of every appended token",
    axes={
        **{k: APPEND_AXES[k] for k in ("batch_size", "append_len", "kv_len")},
        "nnz": var("appended tokens in all (batch_size x append_len)"),
    },
    inputs={
        "append_indptr": Tensor(("batch_size + 1",), "int32"),
        "seq_lens": Tensor(("batch_size",), "int32"),
        "nnz": Scalar("int64", axis="nnz"),
    },
    outputs={"batch_indices": Tensor(("nnz",), "int32"), "positions": Tensor(("nnz",), "int32")},
    make_inputs=batch_indices_positions_inputs,
    reference=batch_indices_positions_reference,
    tolerance={"int32": (0.0, 0.0)},
    examples=(
        Example(
            "serving-decode",
            LLAMA_3_1_8B.name,
            "decode",
            {},
            tuple({"batch_size": b, "append_len": 1, "kv_len": 4096, "nnz": b} for b in (1, 64, 256)),
            source="one token per request per decode step",
        ),
        Example(
            "serving-prefill",
            LLAMA_3_1_8B.name,
            "prefill",
            {},
            (
                {"batch_size": 1, "append_len": 8192, "kv_len": 8192, "nnz": 8192},
                {"batch_size": 4, "append_len": 2048, "kv_len": 2048, "nnz": 8192},
            ),
            source="prompts of 2k-8k tokens",
        ),
    ),
    small=({"batch_size": 3, "append_len": 7, "kv_len": 40, "nnz": 21},),
)


def append_inputs(t, axes, dtype, device, gen):
    append_indptr, seq_lens = append_layout(axes, device)
    b, pages = axes["batch_size"], -(-axes["kv_len"] // axes["page_size"])
    found = batch_indices_positions_reference(append_indptr, seq_lens, b * axes["append_len"])
    return {
        "batch_indices": found["batch_indices"],
        "positions": found["positions"],
        "kv_indptr": (torch.arange(b + 1, dtype=torch.int32) * pages).to(device),
        "kv_indices": torch.randperm(b * pages, generator=gen).to(device=device, dtype=torch.int32),
        "kv_last_page_len": torch.full(
            (b,), axes["kv_len"] - (pages - 1) * axes["page_size"], dtype=torch.int32, device=device
        ),
    }


def append_reference(
    append_key,
    append_value,
    batch_indices,
    positions,
    paged_kv_cache,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
):
    cache = paged_kv_cache.clone()
    append_into(cache, append_key, append_value, batch_indices, positions, kv_indices, kv_indptr)
    return {"paged_kv_cache": cache}


def append_into(paged_kv_cache, append_key, append_value, batch_indices, positions, kv_indices, kv_indptr):
    """The append in torch indexing (the reference, and the benchmarks' torch backend): token i
    into page kv_indices[kv_indptr[b] + pos // page_size], slot pos % page_size, of an NHD
    [pages, 2, page_size, heads, head_dim] cache."""
    page_size = paged_kv_cache.shape[2]
    pos = positions.long()
    page = kv_indices.long()[kv_indptr.long()[batch_indices.long()] + pos // page_size]
    paged_kv_cache[page, 0, pos % page_size] = append_key
    paged_kv_cache[page, 1, pos % page_size] = append_value


APPEND_PAGED_KV_CACHE = TraceTemplate(
    name="append_paged_kv_cache",
    target="//ops/attention:page",
    description="in place: write appended keys and values into their page slots (NHD)",
    axes=APPEND_AXES,
    inputs={
        "append_key": Tensor(("batch_size * append_len", "num_kv_heads", "head_dim")),
        "append_value": Tensor(("batch_size * append_len", "num_kv_heads", "head_dim")),
        "batch_indices": Tensor(("batch_size * append_len",), "int32"),
        "positions": Tensor(("batch_size * append_len",), "int32"),
        "paged_kv_cache": Tensor(
            ("batch_size * cdiv(kv_len, page_size)", "kv", "page_size", "num_kv_heads", "head_dim")
        ),
        "kv_indices": Tensor(("batch_size * cdiv(kv_len, page_size)",), "int32"),
        "kv_indptr": Tensor(("batch_size + 1",), "int32"),
        "kv_last_page_len": Tensor(("batch_size",), "int32"),
    },
    outputs={
        "paged_kv_cache": Tensor(
            ("batch_size * cdiv(kv_len, page_size)", "kv", "page_size", "num_kv_heads", "head_dim")
        )
    },
    options={"kv_layout": "NHD", "k_scale": "fp8 caches only", "v_scale": "fp8 caches only"},
    make_inputs=append_inputs,
    reference=append_reference,
    tolerance={"bfloat16": (0.0, 0.0), "float16": (0.0, 0.0)},
    examples=APPEND_EXAMPLES,
    small=APPEND_SMALL,
)

# --- prefill: single, batch paged, batch ragged ---------------------------------------------------------

PREFILL_WORKLOADS = (
    {"batch_size": 1, "qo_len": 8192},
    {"batch_size": 4, "qo_len": 2048},
    {"batch_size": 16, "qo_len": 1024},
    {"batch_size": 8, "qo_len": 1024},
)


def prefill_inputs(t, axes, dtype, device, gen):
    """batch_size requests of qo_len queries over qo_len keys (a fresh prompt); pages shuffled."""
    b, n = axes["batch_size"], axes["qo_len"]
    made = {"qo_indptr": (torch.arange(b + 1, dtype=torch.int32) * n).to(device)}
    if "page_size" in axes:
        pages = -(-n // axes["page_size"])
        made.update(
            {
                "paged_kv_indptr": (torch.arange(b + 1, dtype=torch.int32) * pages).to(device),
                "paged_kv_indices": torch.randperm(b * pages, generator=gen).to(
                    device=device, dtype=torch.int32
                ),
                "paged_kv_last_page_len": torch.full(
                    (b,), n - (pages - 1) * axes["page_size"], dtype=torch.int32, device=device
                ),
            }
        )
    else:
        made["kv_indptr"] = made["qo_indptr"].clone()
    return made


def batch_prefill_reference(
    q,
    paged_kv_cache,
    qo_indptr,
    paged_kv_indptr,
    paged_kv_indices,
    paged_kv_last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    page_size,
    causal,
):
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.numel() - 1):
        k, v = request_kv(
            paged_kv_cache,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            b,
            page_size,
            num_kv_heads,
            head_dim_qk,
        )
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        out[lo:hi] = attention(q[lo:hi], k, v, causal)[0]
    return {"out": out}


def ragged_prefill_reference(q, k, v, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal):
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.numel() - 1):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        klo, khi = int(kv_indptr[b]), int(kv_indptr[b + 1])
        out[lo:hi] = attention(q[lo:hi], k[klo:khi], v[klo:khi], causal)[0]
    return {"out": out}


def single_prefill_reference(q, k, v, causal):
    return {"out": attention(q, k, v, causal)[0]}


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's slope per head (float64): with n the largest power of two <= num_heads,
    2^(-8 (h + 1) / n) for h < n, then 2^(-4 (2 (h - n) + 1) / n) (Press et al., section 3)."""
    n = 2 ** math.floor(math.log2(num_heads))
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.where(h < n, 2.0 ** (-8.0 * (h + 1) / n), 2.0 ** (-4.0 * (2 * (h - n) + 1) / n))


def rope_llama(x, positions, rope_scale=1.0, rope_theta=1e4):
    """x [n, heads, d] rotated NeoX/Llama style in float64: the pair (i, i + d/2) turns by
    positions[t] * theta^(-2i/d) / rope_scale; rounded back to x's dtype (as the kernels keep it)."""
    d = x.shape[-1]
    freq = rope_theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d) / rope_scale
    angle = positions.to(torch.float64)[:, None, None] * freq.to(x.device)
    c, s = torch.cos(angle), torch.sin(angle)
    a, b = x.double()[..., : d // 2], x.double()[..., d // 2:]
    return torch.cat([a * c - b * s, b * c + a * s], -1).to(x.dtype)


def prefill_attention(q, k, v, causal=False, window_left=-1, soft_cap=None, sm_scale=None, mask=None,
                      pos_encoding_mode="NONE", rope_scale=None, rope_theta=None):
    """One request's prefill with FlashInfer's variants, from their definitions (docs/attention.md):
    `mask` (booleans [qo_len, kv_len]) replaces causal; ROPE_LLAMA rotates q at positions
    i + kv_len - qo_len and k at j first; ALIBI adds slope(h) * (j - i) to the scaled logits."""
    qo, kv = q.shape[0], k.shape[0]
    bias = None
    if pos_encoding_mode == "ROPE_LLAMA":
        scale, theta = rope_scale or 1.0, rope_theta or 1e4
        q = rope_llama(q, torch.arange(qo, device=q.device) + kv - qo, scale, theta)
        k = rope_llama(k, torch.arange(kv, device=k.device), scale, theta)
    elif pos_encoding_mode == "ALIBI":
        dist = (torch.arange(kv)[None, :] - torch.arange(qo)[:, None]).to(torch.float64)
        bias = (alibi_slopes(q.shape[1])[:, None, None] * dist).to(q.device)
    return attention(q, k, v, causal and mask is None, window_left, soft_cap, sm_scale, mask, bias)


PREFILL_OPTIONS = {
    "head_dim_vo": "equal to head_dim_qk",
    "custom_mask": "no custom mask (a variant: the fa2 kernel with the mask's bits)",
    "packed_custom_mask": "no custom mask (as custom_mask, packed)",
    "prefix_len_ptr": "no multi-item scoring (a custom mask built at plan)",
    "token_pos_in_items_ptr": "no multi-item scoring",
    "token_pos_in_items_len": "no multi-item scoring",
    "max_item_len_ptr": "no multi-item scoring",
    "pos_encoding_mode": "NONE (ROPE_LLAMA, ALIBI: variants of the fa2 kernel)",
    "use_fp16_qk_reduction": "accepted, ignored",
    "sm_scale": "the default 1/sqrt(head_dim)",
    "window_left": "no sliding window",
    "logits_soft_cap": "none",
    "rope_scale": "no RoPE",
    "rope_theta": "no RoPE",
    "q_data_type": "the workload dtype",
    "kv_data_type": "the workload dtype",
    "o_data_type": "the workload dtype (the only one accepted)",
    "non_blocking": "host-to-device copies in plan",
    "args": "fp8 scale arguments; not supported",
    "q_scale": "fp8 only",
    "k_scale": "fp8 only",
    "v_scale": "fp8 only",
    "lse": "second output, not benchmarked",
    "return_lse": "as lse",
    "enable_pdl": "launch detail",
    "backend": "kernel choice (auto: fa3 on compute capability 9.0, else fa2); same results",
}
CAUSAL = Scalar("bool", False, "mask keys after each query's position (aligned to the end)")


def prefill_examples(workloads, paged: bool) -> tuple[Example, ...]:
    consts = lambda m: {
        "num_qo_heads": m.num_q_heads,
        "num_kv_heads": m.num_kv_heads,  # noqa: E731
        "head_dim": m.head_dim,
    }
    return tuple(
        Example(
            f"{m.name}-prefill",
            m.name,
            "prefill",
            consts(m),
            tuple(workloads),
            scalars={"causal": True},
            source=m.source,
        )
        for m in DECODE_MODELS
    )


BATCH_PREFILL = TraceTemplate(
    name="batch_prefill",
    target="//ops/attention:prefill",
    description="prompts of qo_len tokens attend causally to their paged KV caches (GQA, NHD, plan/run)",
    axes={
        "batch_size": var("requests"),
        "qo_len": var("query tokens per request (= kv_len)"),
        **HEAD_AXES,
        "page_size": const(PAGE_SIZE, "tokens per page"),
        "kv": const(2, "K and V"),
    },
    inputs={
        "q": Tensor(("batch_size * qo_len", "num_qo_heads", "head_dim")),
        "paged_kv_cache": Tensor(
            ("batch_size * cdiv(qo_len, page_size)", "kv", "page_size", "num_kv_heads", "head_dim")
        ),
        "qo_indptr": Tensor(("batch_size + 1",), "int32"),
        "paged_kv_indptr": Tensor(("batch_size + 1",), "int32"),
        "paged_kv_indices": Tensor(("batch_size * cdiv(qo_len, page_size)",), "int32"),
        "paged_kv_last_page_len": Tensor(("batch_size",), "int32"),
        "num_qo_heads": Scalar("int32", axis="num_qo_heads"),
        "num_kv_heads": Scalar("int32", axis="num_kv_heads"),
        "head_dim_qk": Scalar("int32", axis="head_dim"),
        "page_size": Scalar("int32", axis="page_size"),
        "causal": CAUSAL,
    },
    outputs={"out": Tensor(("batch_size * qo_len", "num_qo_heads", "head_dim"))},
    plan_inputs=(
        "qo_indptr",
        "paged_kv_indptr",
        "paged_kv_indices",
        "paged_kv_last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "page_size",
        "causal",
    ),
    options=PREFILL_OPTIONS,
    make_inputs=prefill_inputs,
    reference=batch_prefill_reference,
    tolerance=TOLERANCE,
    examples=prefill_examples(PREFILL_WORKLOADS, True),
    small=({"batch_size": 1, "qo_len": 17}, {"batch_size": 3, "qo_len": 70}),
)

BATCH_PREFILL_RAGGED = TraceTemplate(
    name="batch_prefill_ragged",
    target="//ops/attention:prefill",
    description="prompts of qo_len tokens attend causally to their contiguous K/V (GQA, plan/run)",
    axes={"batch_size": var("requests"), "qo_len": var("query tokens per request (= kv_len)"), **HEAD_AXES},
    inputs={
        "q": Tensor(("batch_size * qo_len", "num_qo_heads", "head_dim")),
        "k": Tensor(("batch_size * qo_len", "num_kv_heads", "head_dim")),
        "v": Tensor(("batch_size * qo_len", "num_kv_heads", "head_dim")),
        "qo_indptr": Tensor(("batch_size + 1",), "int32"),
        "kv_indptr": Tensor(("batch_size + 1",), "int32"),
        "num_qo_heads": Scalar("int32", axis="num_qo_heads"),
        "num_kv_heads": Scalar("int32", axis="num_kv_heads"),
        "head_dim_qk": Scalar("int32", axis="head_dim"),
        "causal": CAUSAL,
    },
    outputs={"out": Tensor(("batch_size * qo_len", "num_qo_heads", "head_dim"))},
    plan_inputs=("qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk", "causal"),
    options=PREFILL_OPTIONS,
    make_inputs=prefill_inputs,
    reference=ragged_prefill_reference,
    tolerance=TOLERANCE,
    examples=prefill_examples(PREFILL_WORKLOADS, False),
    small=({"batch_size": 1, "qo_len": 17}, {"batch_size": 3, "qo_len": 70}),
)

SINGLE_PREFILL = TraceTemplate(
    name="single_prefill",
    target="//ops/attention:prefill",
    description="one prompt of qo_len tokens attends causally to its contiguous K/V (NHD)",
    axes={"qo_len": var("query tokens (= kv_len)"), **HEAD_AXES},
    inputs={
        "q": Tensor(("qo_len", "num_qo_heads", "head_dim")),
        "k": Tensor(("qo_len", "num_kv_heads", "head_dim")),
        "v": Tensor(("qo_len", "num_kv_heads", "head_dim")),
        "causal": CAUSAL,
    },
    outputs={"out": Tensor(("qo_len", "num_qo_heads", "head_dim"))},
    options={
        **{
            k: PREFILL_OPTIONS[k]
            for k in (
                "custom_mask",
                "packed_custom_mask",
                "pos_encoding_mode",
                "k_scale",
                "v_scale",
                "use_fp16_qk_reduction",
                "sm_scale",
                "window_left",
                "logits_soft_cap",
                "rope_scale",
                "rope_theta",
                "return_lse",
                "backend",
            )
        },
        "kv_layout": "NHD",
        "scale_q": "fp8 queries only; not supported (None)",
        "scale_k": "fp8 queries only; not supported (None)",
        "scale_v": "fp8 queries only; not supported (None)",
        "o_dtype": "the workload dtype (the only one accepted)",
        "kv_cache_sf": "a 16-bit cache (NVFP4 caches are dequantised to it first)",
    },
    reference=single_prefill_reference,
    tolerance=TOLERANCE,
    examples=tuple(
        Example(
            f"{m.name}-prefill",
            m.name,
            "prefill",
            {"num_qo_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim},
            tuple({"qo_len": n} for n in (1024, 4096, 8192)),
            scalars={"causal": True},
            source=m.source,
        )
        for m in DECODE_MODELS
    ),
    small=({"qo_len": 1}, {"qo_len": 77}),
)
