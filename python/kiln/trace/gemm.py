"""Trace templates of the GEMM APIs (kiln.gemm) and THE reference of each op.

Axes are all variable: a linear layer's n and k are its model's, but one example lists every
linear layer of the model, so each workload names its own (m, n, k); the small CPU workloads are
then small in every dimension. Shapes:

  dense    the linear layers of Llama-3.1-8B / -70B (fused qkv, o, fused gate+up, down) at the
           decode (m = 1, 16, 64 tokens) and prefill (256 ... 16384) row counts
  bmm      DeepSeek-V3's absorbed MLA projections: 128 heads as the batch, q_nope [128, m, 128] x
           W_UK [128, 128, 512] and the attention output [128, m, 512] x W_UV [128, 512, 128]
  grouped  MoE expert GEMMs: 128 experts, top-8 routing, tokens x 8 routed rows split over the
           experts by a multinomial draw (some experts get none): Qwen3-30B-A3B's gate+up and down
           projections, and the 2048 -> 2 x 1536 gate+up shape of docs/perf/gemm.md's targets

Inputs are scaled so every output is ~N(0, 1) whatever k is (each operand by k^-1/4), so one
absolute tolerance per dtype fits every shape. The references compute in float32 (or `compute`)
from the inputs as given (fp8 values decoded and multiplied by their scales, exactly), written
from the definitions and never from a kernel; tests and the benchmarks' torch backends use them.

Tolerances: 16-bit outputs are rounded once after float32 accumulation (2^-8 / 2^-11 relative);
fp8 GEMMs accumulate in the tensor cores' fp8 adder, which keeps ~14 bits without promotion:
||out - ref|| / ||ref|| ~ 3e-3 and single elements up to ~6 % of the output's rms
(docs/perf/gemm.md, v1 measured), hence 0.1 absolute at rms 1.
"""

from __future__ import annotations

import torch

from .examples import LLAMA_3_1_8B, LLAMA_3_1_70B
from .template import Example, Scalar, Tensor, TraceTemplate, var

DENSE_TOLERANCE = {"bfloat16": (1.6e-2, 1e-2), "float16": (2e-3, 2e-3)}
FP8_TOLERANCE = {"bfloat16": (2e-2, 1e-1), "float16": (2e-2, 1e-1)}
DECODE_M = (1, 16, 64)
PREFILL_M = (256, 1024, 4096, 16384)
SCALE_BLOCK = 128  # groupwise scale granularity along k and n (the fp8 binding exports it too)

# (layer, n, k) of each model's linear layers: the shapes the dense targets are measured at.
LINEAR_LAYERS = {
    LLAMA_3_1_8B: (
        ("qkv_proj", 6144, 4096),
        ("o_proj", 4096, 4096),
        ("gate_up_proj", 28672, 4096),
        ("down_proj", 4096, 14336),
    ),
    LLAMA_3_1_70B: (("o_proj", 8192, 8192), ("gate_up_proj", 57344, 8192), ("down_proj", 8192, 28672)),
}
DEEPSEEK_V3 = (
    "deepseek-ai/DeepSeek-V3 config.json (num_attention_heads 128, qk_nope_head_dim 128, "
    "kv_lora_rank 512, v_head_dim 128)"
)
QWEN3_30B_A3B = (
    "Qwen/Qwen3-30B-A3B config.json (hidden_size 2048, moe_intermediate_size 768, "
    "num_experts 128, num_experts_per_tok 8)"
)


# The options every FlashInfer-named GEMM API has besides its workload.
BACKEND_OPTION = "FlashInfer's backend names: each runs kiln's kernels (the tactic is chosen per call)"
SKIP_CHECK_OPTION = "FlashInfer compatibility; kiln always checks"


def operand(shape, k: int, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """Standard normal / k^(1/4), in float32: two of them multiply to outputs ~N(0, 1). On a GPU the
    values are drawn there (a generator seeded from `gen`): the largest workloads hold ~0.6 G
    elements, which the CPU would take seconds to draw."""
    device = torch.device(device)
    if device.type == "cuda":
        seed = int(torch.randint(2**62, (1,), generator=gen))
        local = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(shape, generator=local, device=device) / max(k, 1) ** 0.25
    return torch.randn(shape, generator=gen) / max(k, 1) ** 0.25


def dense_examples() -> tuple[Example, ...]:
    return tuple(
        Example(
            f"{model.name}-{phase}",
            model.name,
            phase,
            {},
            tuple({"m": m, "n": n, "k": k} for _, n, k in layers for m in ms),
            source=f"{model.source} (linear layers: {', '.join(name for name, _, _ in layers)})",
        )
        for model, layers in LINEAR_LAYERS.items()
        for phase, ms in (("decode", DECODE_M), ("prefill", PREFILL_M))
    )


# --- mm_bf16 / bmm_bf16 ---------------------------------------------------------------------------


def mm_reference_float(a, b, compute=torch.float32):
    """out = a @ b in `compute` (float32: the torch backends' "what a user writes without a kernel";
    float64 in the tests). a [.., m, k], b [.., k, n] in any layout."""
    return torch.matmul(a.to(compute), b.to(compute))


def mm_reference(a, b):
    return {"out": mm_reference_float(a, b)}


def mm_inputs(t, axes, dtype, device, gen):
    """a [m, k] row-major; b [k, n] as linear layers hold it: the transpose view of an [n, k]
    weight (column-major)."""
    m, n, k = axes["m"], axes["n"], axes["k"]
    dt = getattr(torch, dtype)
    return {"a": operand((m, k), k, gen, device).to(dt), "b": operand((n, k), k, gen, device).to(dt).t()}


MM_BF16 = TraceTemplate(
    name="mm_bf16",
    target="//ops/gemm:mm",
    description="out = a @ b: a [m, k] activations, b [k, n] the transpose view of an [n, k] weight",
    axes={
        "m": var("rows: tokens in the batch"),
        "n": var("output features of the layer"),
        "k": var("input features of the layer"),
    },
    inputs={"a": Tensor(("m", "k")), "b": Tensor(("k", "n"), doc="column-major: w.t() of an [n, k] w")},
    outputs={"out": Tensor(("m", "n"))},
    options={
        "bias": "an elementwise add after the GEMM, not part of the GEMM workload (None)",
        "pdl": "programmatic dependent launch: how the kernel is launched, not the workload",
        "out_dtype": "the workload dtype",
        "backend": BACKEND_OPTION,
        "skip_check": SKIP_CHECK_OPTION,
    },
    make_inputs=mm_inputs,
    reference=mm_reference,
    tolerance=DENSE_TOLERANCE,
    examples=dense_examples(),
    small=({"m": 1, "n": 72, "k": 64}, {"m": 33, "n": 40, "k": 200}),
)


def bmm_inputs(t, axes, dtype, device, gen):
    b, m, n, k = axes["batch"], axes["m"], axes["n"], axes["k"]
    dt = getattr(torch, dtype)
    return {
        "A": operand((b, m, k), k, gen, device).to(dt),
        "B": operand((b, n, k), k, gen, device).to(dt).transpose(1, 2),
    }


def bmm_reference(A, B):
    return {"out": mm_reference_float(A, B)}


BMM_BF16 = TraceTemplate(
    name="bmm_bf16",
    target="//ops/gemm:mm",
    description="out[i] = A[i] @ B[i]: A [batch, m, k], B [batch, k, n] column-major",
    axes={
        "batch": var("independent products (heads)"),
        "m": var("rows: tokens"),
        "n": var("output features"),
        "k": var("input features"),
    },
    inputs={
        "A": Tensor(("batch", "m", "k")),
        "B": Tensor(("batch", "k", "n"), doc="column-major: the transpose view of [batch, n, k]"),
    },
    outputs={"out": Tensor(("batch", "m", "n"))},
    options={"out_dtype": "the workload dtype", "backend": BACKEND_OPTION, "skip_check": SKIP_CHECK_OPTION},
    make_inputs=bmm_inputs,
    reference=bmm_reference,
    tolerance=DENSE_TOLERANCE,
    examples=tuple(
        Example(
            f"deepseek-v3-mla-{phase}",
            "deepseek-v3",
            phase,
            {},
            tuple({"batch": 128, "m": m, "n": n, "k": k} for n, k in ((512, 128), (128, 512)) for m in ms),
            source=DEEPSEEK_V3 + ": q_nope x W_UK and the output x W_UV",
        )
        for phase, ms in (("decode", (1, 16, 64)), ("prefill", (1024, 4096)))
    ),
    small=({"batch": 1, "m": 1, "n": 24, "k": 40}, {"batch": 3, "m": 17, "n": 40, "k": 72}),
)

# --- bmm_fp8 / gemm_fp8_nt_groupwise -----------------------------------------------------------


def quantize_tensor(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale as fp8, scale) with one float32 scale mapping |x|'s max to the fp8 maximum."""
    scale = (x.abs().max().clamp(min=1e-12) / torch.finfo(dtype).max).float()
    return (x / scale).to(dtype), scale.reshape(1)


def quantize_blocks(x: torch.Tensor, rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [r, k] quantized per block of `rows` x 128 (1 x 128: DeepSeek-V3's per-token groups of
    activations; 128 x 128: its weight blocks): (fp8 [r, k], scales [ceil(r / rows), k / 128])."""
    r, k = x.shape
    pad = -r % rows
    xb = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(-1, rows, k // SCALE_BLOCK, SCALE_BLOCK)
    scale = (xb.abs().amax(dim=(1, 3)).clamp(min=1e-12) / torch.finfo(dtype).max).float()
    q = (xb / scale[:, None, :, None]).to(dtype).reshape(-1, k)[:r]
    return q, scale


def bmm_fp8_reference_float(A, B, A_scale, B_scale, compute=torch.float32):
    """out = A_scale * B_scale * (A @ B) with the fp8 values decoded exactly, in `compute`."""
    return torch.matmul(A.to(compute), B.to(compute)) * (A_scale.to(compute) * B_scale.to(compute)).reshape(
        ()
    )


def bmm_fp8_reference(A, B, A_scale, B_scale):
    return {"out": bmm_fp8_reference_float(A, B, A_scale, B_scale)}


def bmm_fp8_inputs(t, axes, dtype, device, gen):
    """Per-tensor quantized A (e4m3) and B (e4m3, column-major [batch, k, n]) with their scales."""
    b, m, n, k = axes["batch"], axes["m"], axes["n"], axes["k"]
    fp8 = torch.float8_e4m3fn
    a, a_scale = quantize_tensor(operand((b, m, k), k, gen, device), fp8)
    w, b_scale = quantize_tensor(operand((b, n, k), k, gen, device), fp8)
    return {
        "A": a.to(device),
        "B": w.to(device).transpose(1, 2),
        "A_scale": a_scale.to(device),
        "B_scale": b_scale.to(device),
    }


def fp8_examples(batch: bool) -> tuple[Example, ...]:
    extra = {"batch": 1} if batch else {}
    return tuple(
        Example(
            f"{model.name}-{phase}",
            model.name,
            phase,
            {},
            tuple({**extra, "m": m, "n": n, "k": k} for _, n, k in layers for m in ms),
            source=f"{model.source} (linear layers, fp8 weights and activations)",
        )
        for model, layers in LINEAR_LAYERS.items()
        for phase, ms in (("decode", (16,)), ("prefill", (1024, 4096, 16384)))
    )


BMM_FP8 = TraceTemplate(
    name="bmm_fp8",
    target="//ops/gemm:fp8",
    description="out[i] = A_scale * B_scale * A[i] @ B[i]: fp8 e4m3, per-tensor float32 scales, "
    "B column-major; out in the workload dtype",
    axes={
        "batch": var("independent products (1: a linear layer)"),
        "m": var("rows: tokens"),
        "n": var("output features"),
        "k": var("input features"),
    },
    inputs={
        "A": Tensor(("batch", "m", "k"), "float8_e4m3fn"),
        "B": Tensor(
            ("batch", "k", "n"), "float8_e4m3fn", "column-major: the transpose view of [batch, n, k]"
        ),
        "A_scale": Tensor(("1",), "float32"),
        "B_scale": Tensor(("1",), "float32"),
    },
    outputs={"out": Tensor(("batch", "m", "n"))},
    options={"dtype": "the workload dtype", "backend": BACKEND_OPTION, "skip_check": SKIP_CHECK_OPTION},
    make_inputs=bmm_fp8_inputs,
    reference=bmm_fp8_reference,
    tolerance=FP8_TOLERANCE,
    examples=fp8_examples(batch=True),
    small=({"batch": 1, "m": 1, "n": 48, "k": 64}, {"batch": 2, "m": 19, "n": 40, "k": 96}),
)


def expand_scales(scale: torch.Tensor, rows: int, cols: int, rows_per: int) -> torch.Tensor:
    """A [ceil(rows / rows_per), cols / 128] block-scale grid as a [rows, cols] elementwise one."""
    return scale.repeat_interleave(rows_per, 0)[:rows].repeat_interleave(SCALE_BLOCK, 1)[:, :cols]


def groupwise_reference_float(a, b, a_scale, b_scale, scale_major_mode="MN", compute=torch.float32):
    """out = sum over 128-wide k blocks kb of a_scale(i, kb) * b_scale(j // 128, kb) * a(i, kb) . b(j, kb),
    with a [m, k] and b [n, k] fp8 and the scales in FlashInfer's layouts: "MN" a_scale [k/128, m],
    b_scale [k/128, n/128]; "K" a_scale [m, k/128], b_scale [n/128, k/128]. Dequantizing each
    operand by its block's scale and multiplying is the same sum."""
    m, k = a.shape
    n = b.shape[0]
    if scale_major_mode in ("MN", None):  # None: the API's default layout, "MN"
        a_scale, b_scale = a_scale.t(), b_scale.t()
    a_deq = a.to(compute) * expand_scales(a_scale.to(compute), m, k, 1)
    b_deq = b.to(compute) * expand_scales(b_scale.to(compute), n, k, SCALE_BLOCK)
    return a_deq @ b_deq.t()


def groupwise_reference(a, b, a_scale, b_scale, scale_major_mode):
    return {"out": groupwise_reference_float(a, b, a_scale, b_scale, scale_major_mode)}


def groupwise_inputs(t, axes, dtype, device, gen):
    """DeepSeek-V3 quantization: a per 1 x 128 group (per token), b per 128 x 128 block; scales in
    the "MN" layout (FlashInfer's default): a_scale [k/128, m], b_scale [k/128, ceil(n/128)]."""
    m, n, k = axes["m"], axes["n"], axes["k"]
    fp8 = torch.float8_e4m3fn
    a, a_scale = quantize_blocks(operand((m, k), k, gen, device), 1, fp8)
    b, b_scale = quantize_blocks(operand((n, k), k, gen, device), SCALE_BLOCK, fp8)
    return {
        "a": a.to(device),
        "b": b.to(device),
        "a_scale": a_scale.t().contiguous().to(device),
        "b_scale": b_scale.t().contiguous().to(device),
    }


GEMM_FP8_NT_GROUPWISE = TraceTemplate(
    name="gemm_fp8_nt_groupwise",
    target="//ops/gemm:fp8",
    description="DeepSeek-V3 block-scaled fp8: out = a @ b.T with a [m, k] scaled per 1 x 128 and b "
    "[n, k] per 128 x 128 (MN-major scales); out in the workload dtype",
    axes={
        "m": var("rows: tokens"),
        "n": var("output features"),
        "k": var("input features (a multiple of 128)"),
    },
    inputs={
        "a": Tensor(("m", "k"), "float8_e4m3fn"),
        "b": Tensor(("n", "k"), "float8_e4m3fn"),
        "a_scale": Tensor(("k // 128", "m"), "float32"),
        "b_scale": Tensor(("k // 128", "cdiv(n, 128)"), "float32"),
        "scale_major_mode": Scalar("str", None, "layout of the scales: None or 'MN' (the default), 'K'"),
    },
    outputs={"out": Tensor(("m", "n"))},
    options={
        "mma_sm": "accepted, no effect (kiln's cluster shape is a tactic)",
        "scale_granularity_mnk": "(1, 128, 128), the only one supported",
        "out_dtype": "the workload dtype",
        "backend": BACKEND_OPTION,
        "skip_check": SKIP_CHECK_OPTION,
    },
    make_inputs=groupwise_inputs,
    reference=groupwise_reference,
    tolerance=FP8_TOLERANCE,
    examples=fp8_examples(batch=False),
    small=({"m": 1, "n": 72, "k": 128}, {"m": 33, "n": 200, "k": 256}),
)

# --- SegmentGEMMWrapper.run / grouped_mm -------------------------------------------------------------

# (model, layer, n, k, source): the expert GEMMs of 128-expert, top-8 MoE layers.
MOE_LAYERS = (
    ("qwen3-30b-a3b", "moe-gate-up", 2 * 768, 2048, QWEN3_30B_A3B),
    ("qwen3-30b-a3b", "moe-down", 2048, 768, QWEN3_30B_A3B),
    (
        "moe-e128",
        "k2048-n3072",
        2 * 1536,
        2048,
        "128 experts, hidden 2048, gate+up 2 x 1536, top-8: the grouped GEMM target of docs/perf/gemm.md",
    ),
)
MOE_EXPERTS, MOE_TOP_K = 128, 8


def blockscaled_reference_float(a, b, a_scale, b_scale, scale_major_mode="MN", compute=torch.float32):
    """groupwise_reference_float with a scaled per 128 x 128 block too: "MN" a_scale [k/128,
    ceil(m/128)], b_scale [k/128, ceil(n/128)]; "K" a_scale [ceil(m/128), k/128], b_scale
    [ceil(n/128), k/128]."""
    m, k = a.shape
    n = b.shape[0]
    if scale_major_mode in ("MN", None):
        a_scale, b_scale = a_scale.t(), b_scale.t()
    a_deq = a.to(compute) * expand_scales(a_scale.to(compute), m, k, SCALE_BLOCK)
    b_deq = b.to(compute) * expand_scales(b_scale.to(compute), n, k, SCALE_BLOCK)
    return a_deq @ b_deq.t()


def blockscaled_reference(a, b, a_scale, b_scale, scale_major_mode):
    return {"out": blockscaled_reference_float(a, b, a_scale, b_scale, scale_major_mode)}


def blockscaled_inputs(t, axes, dtype, device, gen):
    """Both operands quantized per 128 x 128 block, the scales in the "MN" layout."""
    m, n, k = axes["m"], axes["n"], axes["k"]
    fp8 = torch.float8_e4m3fn
    a, a_scale = quantize_blocks(operand((m, k), k, gen, device), SCALE_BLOCK, fp8)
    b, b_scale = quantize_blocks(operand((n, k), k, gen, device), SCALE_BLOCK, fp8)
    return {
        "a": a.to(device),
        "b": b.to(device),
        "a_scale": a_scale.t().contiguous().to(device),
        "b_scale": b_scale.t().contiguous().to(device),
    }


GEMM_FP8_NT_BLOCKSCALED = TraceTemplate(
    name="gemm_fp8_nt_blockscaled",
    target="//ops/gemm:fp8",
    description="block-scaled fp8: out = a @ b.T with a [m, k] and b [n, k] each scaled per 128 x 128 "
    "block (MN-major scales); out in the workload dtype",
    axes={
        "m": var("rows: tokens"),
        "n": var("output features"),
        "k": var("input features (a multiple of 128)"),
    },
    inputs={
        "a": Tensor(("m", "k"), "float8_e4m3fn"),
        "b": Tensor(("n", "k"), "float8_e4m3fn"),
        "a_scale": Tensor(("k // 128", "cdiv(m, 128)"), "float32"),
        "b_scale": Tensor(("k // 128", "cdiv(n, 128)"), "float32"),
        "scale_major_mode": Scalar("str", "MN", "layout of the scales: 'MN' or 'K'"),
    },
    outputs={"out": Tensor(("m", "n"))},
    options={
        "mma_sm": "accepted, no effect (kiln's cluster shape is a tactic)",
        "out_dtype": "the workload dtype",
        "skip_check": SKIP_CHECK_OPTION,
    },
    make_inputs=blockscaled_inputs,
    reference=blockscaled_reference,
    tolerance=FP8_TOLERANCE,
    examples=fp8_examples(batch=False),
    small=({"m": 1, "n": 72, "k": 128}, {"m": 133, "n": 200, "k": 256}),
)


def segment_lengths(rows: int, segments: int, gen: torch.Generator) -> torch.Tensor:
    """Rows per segment: `rows` routed rows drawn uniformly over the segments (int64)."""
    if rows == 0:
        return torch.zeros(segments, dtype=torch.int64)
    pick = torch.randint(segments, (rows,), generator=gen)
    return torch.bincount(pick, minlength=segments)


def moe_examples() -> tuple[Example, ...]:
    return tuple(
        Example(
            f"{model}-{layer}-{phase}",
            model,
            phase,
            {},
            tuple(
                {"rows": MOE_TOP_K * tokens, "num_experts": MOE_EXPERTS, "n": n, "k": k}
                for tokens in tokens_list
            ),
            source=source,
        )
        for model, layer, n, k, source in MOE_LAYERS
        for phase, tokens_list in (("decode", (1, 16, 64)), ("prefill", (2048, 8192)))
    )


def segment_gemm_reference_float(
    x, weights, seg_indptr, weight_column_major, weight_indices=None, compute=torch.float32
):
    """out[rows of segment s] = x[rows] @ W_s, W_s = weights[weight_indices[s]] (or weights[s]) as
    [k, n] (weights [E, n, k] when weight_column_major, else [E, k, n]); rows in no segment: 0."""
    out = torch.zeros(
        x.shape[0],
        weights.shape[1] if weight_column_major else weights.shape[2],
        dtype=compute,
        device=x.device,
    )
    bounds = seg_indptr.tolist()
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        e = s if weight_indices is None else int(weight_indices[s])
        w = weights[e].to(compute)
        out[lo:hi] = x[lo:hi].to(compute) @ (w.t() if weight_column_major else w)
    return out


def segment_gemm_reference(x, weights, batch_size, weight_column_major, seg_indptr):
    return {"out": segment_gemm_reference_float(x, weights, seg_indptr, weight_column_major)}


def segment_gemm_inputs(t, axes, dtype, device, gen):
    rows, e, n, k = axes["rows"], axes["num_experts"], axes["n"], axes["k"]
    dt = getattr(torch, dtype)
    lens = segment_lengths(rows, e, gen)
    return {
        "x": operand((rows, k), k, gen, device).to(dt),
        "weights": operand((e, n, k), k, gen, device).to(dt),
        "seg_indptr": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(device),
    }


GROUPED_AXES = {
    "rows": var("routed rows: tokens x top-k"),
    "num_experts": var("segments (experts)"),
    "n": var("output features of each expert"),
    "k": var("input features"),
}

SEGMENT_GEMM = TraceTemplate(
    name="segment_gemm",
    target="//ops/gemm:grouped",
    description="segment GEMM: the rows of segment s of x times weights[s] ([E, n, k], column-major), "
    "segments by seg_indptr",
    axes=GROUPED_AXES,
    inputs={
        "x": Tensor(("rows", "k")),
        "weights": Tensor(("num_experts", "n", "k")),
        "batch_size": Scalar("int64", axis="num_experts"),
        "weight_column_major": Scalar("bool", True, "weights are [E, n, k]"),
        "seg_indptr": Tensor(("num_experts + 1",), "int64"),
    },
    outputs={"out": Tensor(("rows", "n"))},
    options={"seg_lens": "seg_indptr given instead", "weight_indices": "segment s uses weights[s]"},
    make_inputs=segment_gemm_inputs,
    reference=segment_gemm_reference,
    tolerance=DENSE_TOLERANCE,
    examples=moe_examples(),
    small=({"rows": 0, "num_experts": 3, "n": 24, "k": 40}, {"rows": 37, "num_experts": 5, "n": 40, "k": 72}),
)


def grouped_mm_reference_float(a, b, offs, compute=torch.float32):
    """torch._grouped_mm for a 2-D a [rows, k] and 3-D b [G, k, n]: rows [offs[g-1], offs[g]) of a
    (offs[-1] = 0) times b[g]; rows past offs[-1]: 0."""
    ends = offs.tolist()
    bounds = torch.tensor([0, *ends], dtype=torch.int64)
    return segment_gemm_reference_float(a, b, bounds, False, compute=compute)


def grouped_mm_reference(a, b, offs):
    return {"out": grouped_mm_reference_float(a, b, offs)}


def grouped_mm_inputs(t, axes, dtype, device, gen):
    rows, e, n, k = axes["rows"], axes["num_experts"], axes["n"], axes["k"]
    dt = getattr(torch, dtype)
    lens = segment_lengths(rows, e, gen)
    return {
        "a": operand((rows, k), k, gen, device).to(dt),
        "b": operand((e, n, k), k, gen, device).to(dt).transpose(1, 2),
        "offs": lens.cumsum(0).to(device=device, dtype=torch.int32),
    }


GROUPED_MM = TraceTemplate(
    name="grouped_mm",
    target="//ops/gemm:grouped",
    description="torch._grouped_mm, 2-D x 3-D: rows of group g of a times b[g] ([G, k, n], the "
    "transpose view of [G, n, k]), groups by the cumulative row ends offs",
    axes=GROUPED_AXES,
    inputs={
        "a": Tensor(("rows", "k")),
        "b": Tensor(("num_experts", "k", "n")),
        "offs": Tensor(("num_experts",), "int32"),
    },
    outputs={"out": Tensor(("rows", "n"))},
    options={
        "bias": "not supported (None), as in torch",
        "out_dtype": "the workload dtype",
        "backend": "which implementation runs (auto: the CUDA backend; triton), not the workload",
    },
    make_inputs=grouped_mm_inputs,
    reference=grouped_mm_reference,
    tolerance={"bfloat16": DENSE_TOLERANCE["bfloat16"]},
    examples=moe_examples(),
    small=({"rows": 1, "num_experts": 2, "n": 24, "k": 40}, {"rows": 37, "num_experts": 5, "n": 40, "k": 72}),
)

# --- group_gemm_fp8_nt_groupwise -----------------------------------------------------------------

DEEPSEEK_V3_MOE = (
    "deepseek-ai/DeepSeek-V3 config.json (hidden_size 7168, moe_intermediate_size 2048, "
    "n_routed_experts 256, num_experts_per_tok 8; fp8 e4m3 weights with 128 x 128 block scales)"
)
# (layer, n, k): DeepSeek-V3's expert GEMMs, gate+up (2 x 2048 from 7168) and down.
FP8_MOE_LAYERS = (("moe-gate-up", 2 * 2048, 7168), ("moe-down", 7168, 2048))
FP8_MOE_EXPERTS = 256


def group_gemm_fp8_reference_float(
    a, b, a_scale, b_scale, m_indptr, scale_major_mode="MN", compute=torch.float32
):
    """out[rows of segment s] = groupwise_reference_float(a[rows], b[s], their scales): a [rows, k]
    and b [E, n, k] fp8, segment s = rows [m_indptr[s], m_indptr[s + 1]); scales "MN": a_scale
    [k/128, rows], b_scale [E, k/128, ceil(n/128)]; "K": a_scale [rows, k/128], b_scale [E,
    ceil(n/128), k/128]. Rows in no segment: 0."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=compute, device=a.device)
    bounds = m_indptr.tolist()
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        if hi == lo:
            continue
        sa = a_scale[:, lo:hi] if scale_major_mode == "MN" else a_scale[lo:hi]
        out[lo:hi] = groupwise_reference_float(a[lo:hi], b[s], sa, b_scale[s], scale_major_mode, compute)
    return out


def group_gemm_fp8_reference(a, b, a_scale, b_scale, m_indptr, scale_major_mode):
    return {"out": group_gemm_fp8_reference_float(a, b, a_scale, b_scale, m_indptr, scale_major_mode)}


def group_gemm_fp8_inputs(t, axes, dtype, device, gen):
    """DeepSeek-V3 quantization per segment: a per 1 x 128 (token) group, each expert's b per
    128 x 128 block; "MN" scales (FlashInfer's default); rows drawn uniformly over the experts."""
    rows, e, n, k = axes["rows"], axes["num_experts"], axes["n"], axes["k"]
    fp8 = torch.float8_e4m3fn
    lens = segment_lengths(rows, e, gen)
    a, a_scale = quantize_blocks(operand((rows, k), k, gen, device), 1, fp8)
    w = operand((e, n, k), k, gen, device)
    qs = [quantize_blocks(w[i], SCALE_BLOCK, fp8) for i in range(e)]
    b = torch.stack([q for q, _ in qs])
    b_scale = torch.stack([s.t() for _, s in qs])  # [E, k/128, ceil(n/128)]
    return {
        "a": a.to(device),
        "b": b.to(device),
        "a_scale": a_scale.t().contiguous().to(device),
        "b_scale": b_scale.contiguous().to(device),
        "m_indptr": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(
            device=device, dtype=torch.int32
        ),
    }


def fp8_moe_examples() -> tuple[Example, ...]:
    return tuple(
        Example(
            f"deepseek-v3-{layer}-{phase}",
            "deepseek-v3",
            phase,
            {},
            tuple(
                {"rows": 8 * tokens, "num_experts": FP8_MOE_EXPERTS, "n": n, "k": k} for tokens in tokens_list
            ),
            source=DEEPSEEK_V3_MOE,
        )
        for layer, n, k in FP8_MOE_LAYERS
        for phase, tokens_list in (("decode", (1, 16, 64)), ("prefill", (512, 4096)))
    )


GROUP_GEMM_FP8_NT_GROUPWISE = TraceTemplate(
    name="group_gemm_fp8_nt_groupwise",
    target="//ops/gemm:fp8_grouped",
    description="grouped DeepSeek-V3 block-scaled fp8 (MoE experts): the rows of segment s of a "
    "[rows, k] times b[s].T ([E, n, k]), a scaled per 1 x 128, b per 128 x 128 (MN-major scales), "
    "segments by m_indptr; out in the workload dtype",
    axes=GROUPED_AXES,
    inputs={
        "a": Tensor(("rows", "k"), "float8_e4m3fn"),
        "b": Tensor(("num_experts", "n", "k"), "float8_e4m3fn"),
        "a_scale": Tensor(("k // 128", "rows"), "float32"),
        "b_scale": Tensor(("num_experts", "k // 128", "cdiv(n, 128)"), "float32"),
        "m_indptr": Tensor(("num_experts + 1",), "int32"),
        "scale_major_mode": Scalar("str", "MN", "layout of the scales"),
    },
    outputs={"out": Tensor(("rows", "n"))},
    options={
        "mma_sm": "accepted, no effect",
        "scale_granularity_mnk": "(1, 128, 128), the only one supported",
        "out_dtype": "the workload dtype",
        "backend": BACKEND_OPTION,
        "segment_alignment": "a promise about the segments FlashInfer's cuTile kernel uses; kiln ignores it",
        "skip_check": SKIP_CHECK_OPTION,
    },
    make_inputs=group_gemm_fp8_inputs,
    reference=group_gemm_fp8_reference,
    tolerance=FP8_TOLERANCE,
    examples=fp8_moe_examples(),
    small=(
        {"rows": 5, "num_experts": 2, "n": 72, "k": 128},
        {"rows": 41, "num_experts": 3, "n": 200, "k": 256},
    ),
)
