"""Trace templates of kiln.moe's APIs and the family's one reference implementation.

Routing: `moe_topk`; data movement: `moe_align_block_size`, `moe_permute`, `moe_unpermute`; the
layer: `fused_moe` (w13 gate rows first, vLLM's order) and `cutlass_fused_moe` (fc1 up rows first,
FlashInfer's). Axes: `tokens` (var) x the model's constants (`num_experts`, `top_k`, `hidden`,
`intermediate`). The references compute in float32 from the definitions (moe.h, docs/moe.md):
ties go to the lower expert id (a stable descending sort), grouped routing ranks groups by the sum
of their two largest biased scores. The layer's reference loops over the experts (one float32 GEMM
each, index_add of the weighted rows): the per-token loop of the tests is the same sum, too slow
for the benchmark's 16k-token workloads.

Tolerances of the layer: kiln rounds the up projection (the grouped path; at decode sizes the
activation takes its float32 dot products), the activation product and the down projection to the
activation dtype (up to three roundings of half an ulp, 2^-9 bf16 / 2^-12 fp16,
mostly averaging out in the sums), then adds the k weighted rows in float32: 2e-2 bf16, 4e-3 fp16
relative on outputs of order 1, with atol for the elements near zero.
"""

from __future__ import annotations

import math

import torch

from .gemm import QWEN3_30B_A3B
from .quantization import group_quant_reference_fp8
from .template import Example, Scalar, Tensor, TraceTemplate, const, var

MIXTRAL_8X7B = (
    "mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336, "
    "num_local_experts 8, num_experts_per_tok 2"
)
DEEPSEEK_V3 = (
    "deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048, "
    "n_routed_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4, scoring sigmoid, "
    "routed_scaling_factor 2.5 (the routed experts only; the shared expert is a dense MLP)"
)
# (model, experts, top_k, hidden, intermediate, routing scalars, source). The DeepSeek-V3 layer
# keeps 128 of its 256 experts (LAYER_EXPERTS): 256 bf16 experts are 22.5 GiB of weights, and the
# benchmark harness holds three copies (its inputs, a rotating set, the checked backend's), past
# the ~60 GiB a case may use on the H200; routing keeps all 256.
MOE_MODELS = (
    ("mixtral-8x7b", 8, 2, 4096, 14336, {}, MIXTRAL_8X7B),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, {}, QWEN3_30B_A3B),
    (
        "deepseek-v3",
        256,
        8,
        7168,
        2048,
        {"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5},
        DEEPSEEK_V3,
    ),
)
LAYER_EXPERTS = {"deepseek-v3": 128}
DECODE_TOKENS = (1, 16, 64, 256)
PREFILL_TOKENS = (512, 4096, 8192, 16384)
ROUTING_TOLERANCE = {"float32": (1e-5, 1e-6), "bfloat16": (1e-5, 1e-6), "float16": (1e-5, 1e-6)}
EXACT = {"bfloat16": (0.0, 0.0), "float16": (0.0, 0.0), "float32": (0.0, 0.0)}
LAYER_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3)}
ALIGN_BLOCK = 64  # the examples' block_size (vLLM's fused_moe picks 16-128 by batch)


def _examples(layer: bool, routing_scalars: bool = False):
    """Each model's decode and prefill workloads. The layer's templates take every size as a var
    axis (its CPU-sized `small` workloads set them), so their workloads name them all."""
    out = []
    for model, e, k, h, i, scalars, source in MOE_MODELS:
        consts = {"num_experts": e, "top_k": k}
        sizes = {}
        if layer:
            consts = {}
            sizes = {"num_experts": LAYER_EXPERTS.get(model, e), "top_k": k, "hidden": h, "intermediate": i}
        for phase, tokens in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
            out.append(
                Example(
                    name=f"{model}-{phase}",
                    model=model,
                    phase=phase,
                    consts=consts,
                    workloads=tuple({"tokens": t} | sizes for t in tokens),
                    scalars=scalars if routing_scalars else {},
                    source=source,
                )
            )
    return tuple(out)


# --- routing ------------------------------------------------------------------------------------


def moe_topk_float(
    router_logits,
    top_k,
    renormalize=True,
    scoring="softmax",
    num_expert_group=None,
    topk_group=None,
    correction_bias=None,
    routed_scaling_factor=1.0,
):
    """(weights float32 [T, k], ids int32 [T, k]) from the definition, in float32."""
    x = router_logits.float()
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    keys = scores if correction_bias is None else scores + correction_bias.float()
    if num_expert_group:
        t, e = keys.shape
        grouped = keys.view(t, num_expert_group, e // num_expert_group)
        top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
        order = torch.sort(top2, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        keep = torch.zeros_like(top2, dtype=torch.bool).scatter_(1, order, True)
        keep = keep.repeat_interleave(e // num_expert_group, dim=1)
        keys = keys.masked_fill(~keep, -math.inf)
    ids = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return (weights * routed_scaling_factor).float(), ids.to(torch.int32)


def moe_topk_reference(
    router_logits,
    top_k,
    renormalize,
    scoring,
    num_expert_group,
    topk_group,
    correction_bias,
    routed_scaling_factor,
):
    w, i = moe_topk_float(
        router_logits,
        top_k,
        renormalize,
        scoring,
        num_expert_group,
        topk_group,
        correction_bias,
        routed_scaling_factor,
    )
    return {"topk_weights": w, "topk_ids": i}


def _topk_inputs(t, axes, dtype, device, gen):
    e = axes["num_experts"]
    logits = torch.randn((axes["tokens"], e), generator=gen)
    return {"router_logits": logits.to(device=device, dtype=getattr(torch, dtype)), "correction_bias": None}


TOKENS = var("tokens routed in one call: decode batch size or prefill tokens")
ROUTING_AXES = {
    "tokens": TOKENS,
    "num_experts": const(doc="routed experts"),
    "top_k": const(doc="experts per token"),
}

MOE_TOPK = TraceTemplate(
    name="moe_topk",
    target="//ops:moe",
    description="routing: softmax or sigmoid scores, plain or grouped (DeepSeek-V3) top-k, "
    "renormalised weights times routed_scaling_factor",
    axes=ROUTING_AXES,
    inputs={
        "router_logits": Tensor(("tokens", "num_experts")),
        "top_k": Scalar("int64", axis="top_k"),
        "renormalize": Scalar("bool", True, "divide the k weights by their sum"),
        "scoring": Scalar("str", "softmax", "softmax or sigmoid"),
        "num_expert_group": Scalar("int64", None, "grouped routing: groups (None: plain top-k)"),
        "topk_group": Scalar("int64", None, "grouped routing: groups kept"),
        "correction_bias": Tensor(("num_experts",), "float32", "added to the scores for selection only"),
        "routed_scaling_factor": Scalar("float32", 1.0, "multiplies the weights last"),
    },
    outputs={
        "topk_weights": Tensor(("tokens", "top_k"), "float32"),
        "topk_ids": Tensor(("tokens", "top_k"), "int32"),
    },
    make_inputs=_topk_inputs,
    reference=moe_topk_reference,
    tolerance=ROUTING_TOLERANCE,
    examples=_examples(False, routing_scalars=True),
    small=({"tokens": 1}, {"tokens": 33}),
)

# --- data movement -------------------------------------------------------------------------------


def random_ids(tokens, experts, top_k, gen, device="cpu"):
    """Distinct experts per token, uniformly (int32 [tokens, top_k])."""
    ids = torch.rand((tokens, experts), generator=gen).argsort(dim=1)[:, :top_k]
    return ids.to(device=device, dtype=torch.int32)


def moe_align_float(topk_ids, block_size, num_experts):
    """vLLM's moe_align_block_size, with flat ids in ascending order within an expert."""
    flat = topk_ids.reshape(-1).long().cpu()
    n = flat.numel()
    length = n + num_experts * (block_size - 1)
    sorted_ids = torch.full((length,), n, dtype=torch.int32)
    blocks = -(-length // block_size)
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32)
    slot = 0
    for e in range(num_experts):
        mine = torch.nonzero(flat == e).flatten()
        sorted_ids[slot : slot + mine.numel()] = mine.to(torch.int32)
        padded = -(-mine.numel() // block_size) * block_size
        expert_ids[slot // block_size : (slot + padded) // block_size] = e
        slot += padded
    dev = topk_ids.device
    return sorted_ids.to(dev), expert_ids.to(dev), torch.tensor([slot], dtype=torch.int32, device=dev)


def moe_align_reference(topk_ids, block_size, num_experts):
    s, e, n = moe_align_float(topk_ids, block_size, num_experts)
    return {"sorted_token_ids": s, "expert_ids": e, "num_tokens_post_padded": n}


def _ids_inputs(t, axes, dtype, device, gen):
    return {"topk_ids": random_ids(axes["tokens"], axes["num_experts"], axes["top_k"], gen, device)}


MOE_ALIGN_BLOCK_SIZE = TraceTemplate(
    name="moe_align_block_size",
    target="//ops:moe",
    description="vLLM's align: flat slot ids grouped by expert, each expert's run padded to "
    "block_size with T*k; one expert id per block; the padded count",
    axes=ROUTING_AXES | {"block_size": const(ALIGN_BLOCK, "rows per GEMM block")},
    inputs={
        "topk_ids": Tensor(("tokens", "top_k"), "int32"),
        "block_size": Scalar("int64", axis="block_size"),
        "num_experts": Scalar("int64", axis="num_experts"),
    },
    outputs={
        "sorted_token_ids": Tensor(("tokens * top_k + num_experts * (block_size - 1)",), "int32"),
        "expert_ids": Tensor(
            ("(tokens * top_k + num_experts * (block_size - 1) + block_size - 1) // block_size",), "int32"
        ),
        "num_tokens_post_padded": Tensor(("1",), "int32"),
    },
    make_inputs=_ids_inputs,
    reference=moe_align_reference,
    tolerance=EXACT,
    examples=_examples(False),
    small=({"tokens": 1}, {"tokens": 33}),
)


def moe_permute_float(hidden_states, topk_ids, num_experts):
    """(permuted [T*k, H], offs int32 [E], src_idx int32 [T*k]); rows past offs[-1]: 0 / -1."""
    flat = topk_ids.reshape(-1).long()
    n, k = flat.numel(), topk_ids.shape[1]
    order = torch.sort(torch.where(flat < 0, num_experts, flat), stable=True).indices
    routed = int((flat >= 0).sum())
    src = torch.full((n,), -1, dtype=torch.int64, device=flat.device)
    src[:routed] = order[:routed]
    permuted = torch.zeros(
        (n, hidden_states.shape[1]), dtype=hidden_states.dtype, device=hidden_states.device
    )
    permuted[:routed] = hidden_states[src[:routed] // k]
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    return permuted, counts.cumsum(0).to(torch.int32), src.to(torch.int32)


def moe_permute_reference(hidden_states, topk_ids, num_experts):
    p, o, s = moe_permute_float(hidden_states, topk_ids, num_experts)
    return {"permuted": p, "offs": o, "src_idx": s}


LAYER_AXES = {
    "tokens": TOKENS,
    "num_experts": var("routed experts"),
    "top_k": var("experts per token"),
    "hidden": var("hidden size H"),
    "intermediate": var("each expert's intermediate size I"),
}
# CPU-sized layers for the template checks (a model's real layer is gigabytes of weights).
LAYER_SMALL = (
    {"tokens": 1, "num_experts": 4, "top_k": 2, "hidden": 64, "intermediate": 32},
    {"tokens": 33, "num_experts": 6, "top_k": 2, "hidden": 40, "intermediate": 24},
)

MOE_PERMUTE = TraceTemplate(
    name="moe_permute",
    target="//ops:moe",
    description="rows of hidden_states per routed slot, grouped by ascending expert (stable), with "
    "torch._grouped_mm's offs and each row's flat slot index",
    axes=ROUTING_AXES | {"hidden": const(doc="hidden size H")},
    inputs={
        "hidden_states": Tensor(("tokens", "hidden")),
        "topk_ids": Tensor(("tokens", "top_k"), "int32"),
        "num_experts": Scalar("int64", axis="num_experts"),
    },
    outputs={
        "permuted": Tensor(("tokens * top_k", "hidden")),
        "offs": Tensor(("num_experts",), "int32"),
        "src_idx": Tensor(("tokens * top_k",), "int32"),
    },
    make_inputs=_ids_inputs,
    reference=moe_permute_reference,
    tolerance=EXACT,
    examples=tuple(
        Example(ex.name, ex.model, ex.phase, ex.consts | {"hidden": h}, ex.workloads, source=ex.source)
        for ex, h in zip(_examples(False), [m[3] for m in MOE_MODELS for _ in (0, 1)], strict=True)
    ),
    small=({"tokens": 1}, {"tokens": 33}),
)


def moe_unpermute_float(permuted_rows, topk_weights, src_idx):
    """out[t] = sum over rows r with src_idx[r] = t*k+j of topk_weights[t, j] * permuted_rows[r]."""
    t, k = topk_weights.shape
    out = torch.zeros((t, permuted_rows.shape[1]), dtype=torch.float32, device=permuted_rows.device)
    src = src_idx.long()
    used = src >= 0
    rows = permuted_rows[used].float() * topk_weights.reshape(-1)[src[used]].float()[:, None]
    out.index_add_(0, src[used] // k, rows)
    return out


def moe_unpermute_reference(permuted_rows, topk_weights, src_idx):
    return {"out": moe_unpermute_float(permuted_rows, topk_weights, src_idx)}


def _unpermute_inputs(t, axes, dtype, device, gen):
    tokens, k = axes["tokens"], axes["top_k"]
    ids = random_ids(tokens, axes["num_experts"], k, gen)
    _, _, src = moe_permute_float(torch.zeros(tokens, 1), ids, axes["num_experts"])
    weights = torch.rand((tokens, k), generator=gen)
    return {"topk_weights": (weights / weights.sum(-1, keepdim=True)).to(device), "src_idx": src.to(device)}


MOE_UNPERMUTE = TraceTemplate(
    name="moe_unpermute",
    target="//ops:moe",
    description="the weighted scatter-add of the expert rows back to their tokens",
    axes=ROUTING_AXES | {"hidden": const(doc="hidden size H")},
    inputs={
        "permuted_rows": Tensor(("tokens * top_k", "hidden")),
        "topk_weights": Tensor(("tokens", "top_k"), "float32"),
        "src_idx": Tensor(("tokens * top_k",), "int32"),
    },
    outputs={"out": Tensor(("tokens", "hidden"))},
    options={"out": "a new tensor"},
    make_inputs=_unpermute_inputs,
    reference=moe_unpermute_reference,
    tolerance={"bfloat16": (8e-3, 1e-5), "float16": (1e-3, 1e-5), "float32": (1e-5, 1e-6)},
    examples=MOE_PERMUTE.examples,
    small=({"tokens": 1}, {"tokens": 33}),
)

# --- the layer -------------------------------------------------------------------------------------


def act_float(x, activation):
    if activation == "silu":
        return torch.nn.functional.silu(x)
    return torch.nn.functional.gelu(x, approximate="tanh")


def expert_act_float(kind, g, u=None, p0=1.0, p1=0.0, p2=math.inf):
    """cutlass_fused_moe's activations (ops/moe/moe.h's expert_act table), float32 (float64 for
    float64 g and u): g the gate (or the plain activation's input), u the up projection; p0..p2 the
    activation's parameters (floats, or tensors that broadcast against g)."""
    dt = torch.float64 if g.dtype == torch.float64 else torch.float32
    g = g.to(dt)
    u = None if u is None else u.to(dt)
    silu = torch.nn.functional.silu
    if kind == "swiglu":  # SwiGLU with bias: alpha p0, beta p1, limit p2
        g = torch.minimum(g, torch.as_tensor(p2, dtype=dt, device=g.device))
        lim = torch.as_tensor(p2, dtype=dt, device=g.device)
        return g * torch.sigmoid(p0 * g) * (torch.maximum(torch.minimum(u, lim), -lim) + p1)
    if kind == "swiglu_step":
        lim = torch.as_tensor(p2, dtype=dt, device=g.device)
        return torch.minimum(silu(g), lim) * torch.maximum(torch.minimum(u, lim), -lim)
    if kind == "geglu":
        return torch.nn.functional.gelu(g) * u
    if kind == "geglu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    if kind == "situ":  # beta p0, linear beta p1, limit p2
        lim = torch.as_tensor(p2, dtype=dt, device=g.device)
        g = torch.minimum(g, lim)
        u = torch.maximum(torch.minimum(u, lim), -lim)
        return p0 * torch.tanh(g / p0) * torch.sigmoid(g) * (p1 * torch.tanh(u / p1))
    plain = {
        "gelu": torch.nn.functional.gelu,
        "relu": torch.relu,
        "silu": silu,
        "relu2": lambda x: torch.relu(x) ** 2,
        "identity": lambda x: x,
        "clamped_relu2": lambda x: (p2 * torch.tanh(torch.relu(x) / p2)) ** 2,
    }
    return plain[kind](g)


def dequantize(w, scale):
    """fp8 weights [E, R, C] times per-expert [E] or 128 x 128 block [E, ceil(R/128), ceil(C/128)]
    scales, in float32 (None: w as float32)."""
    w = w.float()
    if scale is None:
        return w
    scale = scale.float()
    if scale.dim() == 1:
        return w * scale[:, None, None]
    full = scale.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    return w * full[:, : w.shape[1], : w.shape[2]]


def fused_moe_float(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    w13_scale=None,
    w2_scale=None,
    up_first=False,
):
    """sum_j topk_weights[t, j] * w2[e] (act(gate) * up) over the k experts e = topk_ids[t, j]
    (-1: none), float32, one expert at a time. w13 [E, 2I, H] gate rows first (up first when
    up_first, FlashInfer's fc1)."""
    t, _ = hidden_states.shape
    e_count, two_i, _ = w13.shape
    i = two_i // 2
    x = hidden_states.float()
    out = torch.zeros((t, w2.shape[1]), dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for e in range(e_count):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        w1e = dequantize(w13[e : e + 1], None if w13_scale is None else w13_scale[e : e + 1])[0]
        w2e = dequantize(w2[e : e + 1], None if w2_scale is None else w2_scale[e : e + 1])[0]
        h = x[tok] @ w1e.t()
        gate, up = (h[:, i:], h[:, :i]) if up_first else (h[:, :i], h[:, i:])
        y = (act_float(gate, activation) * up) @ w2e.t()
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out


def group_dequantized(x):
    """x through per-token-group (1 x 128) e4m3 quantisation and back, float32: what the fp8 grouped
    path feeds its GEMMs (kiln.per_token_group_quant_fp8's formula, kiln.trace.quantization)."""
    q, s = group_quant_reference_fp8(x.float(), 128)
    return (q.float().unflatten(-1, (-1, 128)) * s[..., None]).flatten(-2)


def fused_moe_fp8_activations_float(hidden_states, w13, w2, topk_weights, topk_ids, up_first=False):
    """The layer with the fp8 grouped path's own roundings (docs/moe.md), one expert at a time on
    the inputs' device: x quantised per 1 x 128, the up projection rounded to bf16, the activation
    product (silu) rounded to bf16 then quantised per 1 x 128, float32 otherwise; w13, w2 the
    dequantised (float) weights. What kiln's fp8 grouped path computes up to summation order: the
    check of that path's arithmetic, where fused_moe_float measures what the quantisation costs."""
    i = w13.shape[1] // 2
    xq = group_dequantized(hidden_states)
    out = torch.zeros((xq.shape[0], w2.shape[1]), dtype=torch.float32, device=xq.device)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(topk_ids.long() == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = (xq[tok] @ w13[e].float().t()).bfloat16().float()
        gate, up = (h[:, i:], h[:, :i]) if up_first else (h[:, :i], h[:, i:])
        act = (torch.nn.functional.silu(gate) * up).bfloat16().float()
        y = group_dequantized(act) @ w2[e].float().t()
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out


def fused_moe_reference(hidden_states, w13, w2, topk_weights, topk_ids):
    return {"out": fused_moe_float(hidden_states, w13, w2, topk_weights, topk_ids)}


def cutlass_fused_moe_reference(
    input, token_selected_experts, token_final_scales, fc1_expert_weights, fc2_expert_weights, output_dtype
):
    return {
        "out": fused_moe_float(
            input,
            fc1_expert_weights,
            fc2_expert_weights,
            token_final_scales,
            token_selected_experts,
            up_first=True,
        )
    }


def layer_weights(e, h, i, dtype, device, gen):
    """w13 [E, 2I, H] ~ N(0, 1/H) and w2 [E, H, I] ~ N(0, 1/I): gate, up and the output ~N(0, 1)."""
    device = torch.device(device)
    local = gen
    if device.type == "cuda":
        local = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
    w13 = torch.randn((e, 2 * i, h), generator=local, device=device) / math.sqrt(h)
    w2 = torch.randn((e, h, i), generator=local, device=device) / math.sqrt(i)
    return w13.to(dtype), w2.to(dtype)


def _layer_inputs(names):
    x_name, ids_name, w_name, w13_name, w2_name = names

    def make(t, axes, dtype, device, gen):
        tokens, e, k = axes["tokens"], axes["num_experts"], axes["top_k"]
        dt = getattr(torch, dtype)
        w13, w2 = layer_weights(e, axes["hidden"], axes["intermediate"], dt, device, gen)
        weights = torch.rand((tokens, k), generator=gen)
        return {
            x_name: torch.randn((tokens, axes["hidden"]), generator=gen).to(device=device, dtype=dt),
            ids_name: random_ids(tokens, e, k, gen, device),
            w_name: (weights / weights.sum(-1, keepdim=True)).to(device),
            w13_name: w13,
            w2_name: w2,
        }

    return make


FUSED_MOE = TraceTemplate(
    name="fused_moe",
    target="//ops:moe",
    description="the MoE layer: sum_j w_j * w2[e_j] (act(gate) * up), w13 gate rows first (vLLM)",
    axes=LAYER_AXES,
    inputs={
        "hidden_states": Tensor(("tokens", "hidden")),
        "w13": Tensor(("num_experts", "intermediate * 2", "hidden")),
        "w2": Tensor(("num_experts", "hidden", "intermediate")),
        "topk_weights": Tensor(("tokens", "top_k"), "float32"),
        "topk_ids": Tensor(("tokens", "top_k"), "int32"),
    },
    outputs={"out": Tensor(("tokens", "hidden"))},
    options={
        "activation": "silu (the workloads' models)",
        "w13_scale": "fp8 weights only",
        "w2_scale": "fp8 weights only",
        "out": "a new tensor",
        "backend": "which GEMMs run (auto: the CUDA ones; triton), not the workload",
    },
    make_inputs=_layer_inputs(("hidden_states", "topk_ids", "topk_weights", "w13", "w2")),
    reference=fused_moe_reference,
    tolerance=LAYER_TOLERANCE,
    examples=_examples(True),
    small=LAYER_SMALL,
)

CUTLASS_FUSED_MOE = TraceTemplate(
    name="cutlass_fused_moe",
    target="//ops:moe",
    description="FlashInfer's cutlass_fused_moe: the MoE layer with fc1 up rows first (w31)",
    axes=LAYER_AXES,
    inputs={
        "input": Tensor(("tokens", "hidden")),
        "token_selected_experts": Tensor(("tokens", "top_k"), "int32"),
        "token_final_scales": Tensor(("tokens", "top_k"), "float32"),
        "fc1_expert_weights": Tensor(("num_experts", "intermediate * 2", "hidden")),
        "fc2_expert_weights": Tensor(("num_experts", "hidden", "intermediate")),
        "output_dtype": Scalar("dtype", None, "the input's dtype"),
    },
    outputs={"out": Tensor(("tokens", "hidden"))},
    options={
        "quant_scales": "fp8 weights only",
        "fc1_expert_biases": "the workloads' models have none",
        "fc2_expert_biases": "the workloads' models have none",
        "input_sf": "fp4 / mxfp8 input scales: not supported",
        "swiglu_alpha": "SwiGLU-with-bias parameters: the workloads' models use plain SwiGLU",
        "swiglu_beta": "as swiglu_alpha",
        "swiglu_limit": "as swiglu_alpha",
        "tp_size": "tensor parallelism: the weights are the rank's slice, the workload the same layer",
        "tp_rank": "as tp_size",
        "ep_size": "expert parallelism: the workloads hold every expert (ep_size 1)",
        "ep_rank": "as ep_size",
        "cluster_size": "1 only",
        "cluster_rank": "0 only",
        "output": "a new tensor",
        "enable_alltoall": "False only (no communication)",
        "use_deepseek_fp8_block_scale": "fp8 weights only",
        "use_w4_group_scaling": "w4 formats: not supported",
        "use_mxfp8_act_scaling": "mxfp8: not supported",
        "min_latency_mode": "False only",
        "use_packed_weights": "packed int4/fp4 weights: not supported",
        "use_wfp4afp8_humming": "mxfp4 humming: not supported",
        "tune_max_num_tokens": "a tuning hint, no effect on the result",
        "enable_pdl": "launch attribute, not the workload",
        "activation_type": "Swiglu (the workloads' models)",
        "swizzled_input_sf": "describes input_sf only",
        "use_fused_finalize": "a performance hint, the same result",
        "profile_ids": "FlashInfer's tactic indices, not the workload",
        "workspace_buffer": "where scratch lives, not the workload",
        "clamped_relu2_limit": "ClampedRelu2 only",
        "situ_beta": "Situ only",
        "situ_linear_beta": "Situ only",
        "backend": "which GEMMs run (auto: the CUDA ones; triton), not the workload",
    },
    make_inputs=_layer_inputs(
        ("input", "token_selected_experts", "token_final_scales", "fc1_expert_weights", "fc2_expert_weights")
    ),
    reference=cutlass_fused_moe_reference,
    tolerance=LAYER_TOLERANCE,
    examples=_examples(True),
    small=LAYER_SMALL,
)
