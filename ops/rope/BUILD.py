# //ops:rope -- rotary positional embedding of q and k: positions from indptr/offsets, from position
# ids, or a cos/sin cache; NeoX and interleaved (GPT-J) styles, partial rotary, Llama 3.1 scaling;
# and RoPE from a cos/sin cache fused with fp8 quantisation (rope_quantize_fp8, both fp8 formats in
# each module). One module per dtype and toolchain (rope_dtype_bf16_cuda, ...); the style is a
# template argument of the kernel, everything else a run-time parameter.
#
# The launcher is generated from the entries below. q [nnz, q_heads, head_dim], k [nnz, k_heads,
# head_dim] of the module's dtype, contiguous in the last dimension (token and head strides free:
# views of a fused qkv tensor work, bands=True proves its q and k heads apart). q_out/k_out: q/k
# themselves (in place: the *_inplace custom ops, entry_op's alias=) or separate tensors of their
# shapes. indptr [batch + 1], offsets [batch], pos_ids / positions [nnz]: int32 or int64 each;
# cos_sin_cache [max_pos, rotary_dim] float32. rope_quantize: q_rope [nnz, q_heads, rope_dim], q_nope
# [nnz, q_heads, nope_dim], k_rope / k_nope [nnz, k_heads, *] or (MLA) [nnz, *]; the outputs uint8
# views of fp8 tensors of the inputs' shapes (e5m2: float8_e5m2, else float8_e4m3fn), apart from
# every input and from each other.

INDEX = {"int32": "false", "int64": "true"}  # the index tensors' dtypes: the value is "64-bit"


def qk_args():
    """The outputs, then q and k, of the three RoPE entries."""
    return [tensor("q_out", access="w", may_alias="q", like="q"),
            tensor("k_out", access="w", may_alias="k", like="k"),
            tensor("q", shape=["nnz", "q_heads", "head_dim"]),
            tensor("k", shape=["nnz", "k_heads", "head_dim"])]


QK_WORDS = {"nnz": "q.shape[0] (nnz)", "head_dim": "q.shape[2] (head_dim)"}
QK_REQUIRES = [
    require("dim_head_dim % 2 == 0", "head_dim must be even, got q.shape {q}"),
    # An empty tensor is the same view as any other empty one of its shape: it does not decide.
    require("q.numel() == 0 || k.numel() == 0 || kb::same_view(q_out, q) == kb::same_view(k_out, k)",
            "q_out and k_out must both be the inputs (in place) or both separate tensors"),
]
ANGLES = [
    require("rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= dim_head_dim",
            "rotary_dim must be even and in [2, head_dim = {head_dim}], got {rotary_dim}"),
    require("rotary_dim <= kiln::rope::kMaxRotaryDim",
            "rotary_dim must be <= {kiln::rope::kMaxRotaryDim}, got {rotary_dim}"),
    require("std::isfinite(rope_scale) && rope_scale > 0",
            "rope_scale must be finite and > 0, got {rope_scale}"),
    require("std::isfinite(rope_theta) && rope_theta > 0",
            "rope_theta must be finite and > 0, got {rope_theta}"),
    require("std::isfinite(smooth_a) && std::isfinite(smooth_b)",
            "the Llama 3.1 smoothing factors must be finite"),
]
FREQUENCY_ARGS = [scalar("rotary_dim", "int"), scalar("interleave", "bool"), scalar("rope_scale", "float"),
                  scalar("rope_theta", "float"), scalar("smooth_a", "float"), scalar("smooth_b", "float")]


def rope_params(rotary_dim, **at):
    """RopeParams of q, k and their outputs; `at`: the Positions (at.<field>)."""
    fields = {"q_out": "q_out.data", "k_out": "k_out.data", "q": "q.data", "k": "k.data", "nnz": "dim_nnz",
              "q_heads": "dim_q_heads", "k_heads": "dim_k_heads", "head_dim": "dim_head_dim",
              "rotary_dim": rotary_dim, "q_stride_n": "q.stride(0)", "q_stride_h": "q.stride(1)",
              "k_stride_n": "k.stride(0)", "k_stride_h": "k.stride(1)", "qo_stride_n": "q_out.stride(0)",
              "qo_stride_h": "q_out.stride(1)", "ko_stride_n": "k_out.stride(0)",
              "ko_stride_h": "k_out.stride(1)", "interleave": "interleave",
              # separate outputs: copy the dims past rotary_dim (in place they are the input's)
              "copy_tail": "!(q.numel() > 0 ? kb::same_view(q_out, q) : kb::same_view(k_out, k))",
              "errors": "reinterpret_cast<int64_t*>(errors)"}
    fields.update({f"at.{k}": v for k, v in at.items()})
    return params("kiln::rope::RopeParams", **fields)


def computed_angles(mode, **at):
    return rope_params("rotary_dim", mode=f"kiln::rope::PosMode::{mode}",
                       rope_theta="static_cast<float>(rope_theta)",
                       rope_rcp_scale="static_cast<float>(1.0 / rope_scale)",
                       smooth_a="static_cast<float>(smooth_a)", smooth_b="static_cast<float>(smooth_b)", **at)


# rope_quantize's four parts: in[i] and out[i] (rope.h's kQRope, kKRope, kQNope, kKNope); an empty
# part (nope_dim 0) is never read or written: no pointer, no stride.
PARTS = ("q_rope", "k_rope", "q_nope", "k_nope")
QUANT_FIELDS = {}
for i, part in enumerate(PARTS):
    used, out = f"{part}.numel() > 0", f"{part}_out"
    QUANT_FIELDS.update({
        f"in[{i}]": f"{used} ? {part}.data : nullptr", f"out[{i}]": f"{used} ? {out}.data : nullptr",
        f"stride_n[{i}]": f"{used} ? {part}.stride(0) : 0",
        f"stride_h[{i}]": f"{used} && {part}.ndim == 3 ? {part}.stride(1) : 0",  # MLA's 2-D key: one head
        f"stride_n[{4 + i}]": f"{used} ? {out}.stride(0) : 0",
        f"stride_h[{4 + i}]": f"{used} && {out}.ndim == 3 ? {out}.stride(1) : 0"})

op_library(
    name="rope",
    doc="rotary positional embedding of q and k (NeoX / interleaved, partial rotary, Llama 3.1, cos/sin cache), "
        "and RoPE fused with fp8 quantisation (rope_quantize_fp8, mla_rope_quantize_fp8)",
    srcs=["rope_cuda.cu"],
    host_srcs=["rope_host.cc"],
    headers=["ops/rope/rope.h"],
    entries=[
        entry("rope_indptr", doc="RoPE of q and k, positions offsets[b] + t - indptr[b]",
              args=[*qk_args(), tensor("indptr", shape=["batch+1"], dtype=INDEX),
                    tensor("offsets", shape=["batch"], dtype=INDEX), *FREQUENCY_ARGS],
              errors=True, bands=True, dispatch={"dtype": "q.dtype"}, api="kiln.apply_rope",
              size_words={**QK_WORDS, "batch": "indptr.shape[0] - 1 (batch)"},
              requires=[*QK_REQUIRES, *ANGLES],
              params=computed_angles("kIndptr", indptr="indptr.data", indptr64="indptr_dtype",
                                     offsets="offsets.data", offsets64="offsets_dtype", batch="dim_batch"),
              call="kiln::rope::apply_rope"),
        entry("rope_pos_ids", doc="RoPE of q and k at pos_ids",
              args=[*qk_args(), tensor("pos_ids", shape=["nnz"], dtype=INDEX), *FREQUENCY_ARGS],
              errors=True, bands=True, dispatch={"dtype": "q.dtype"}, api="kiln.apply_rope_pos_ids",
              size_words=QK_WORDS, requires=[*QK_REQUIRES, *ANGLES],
              params=computed_angles("kPosIds", pos="pos_ids.data", pos64="pos_ids_dtype"),
              call="kiln::rope::apply_rope"),
        entry("rope_cos_sin_cache", doc="RoPE of q and k with cos/sin read from cos_sin_cache rows",
              args=[*qk_args(), tensor("positions", shape=["nnz"], dtype=INDEX),
                    tensor("cos_sin_cache", shape=["max_pos", "rotary_dim"], dtype="float32",
                           why="cos and sin are float32"),
                    scalar("interleave", "bool")],
              errors=True, bands=True, dispatch={"dtype": "q.dtype"},
              api="kiln.apply_rope_with_cos_sin_cache",
              size_words=QK_WORDS,
              requires=[*QK_REQUIRES,
                        require("dim_rotary_dim > 0 && dim_rotary_dim % 2 == 0 && "
                                "dim_rotary_dim <= dim_head_dim",
                                "cos_sin_cache.shape[1] (rotary_dim) must be even and in [2, head_size = "
                                "{head_dim}], got {rotary_dim}"),
                        require("dim_rotary_dim <= kiln::rope::kMaxRotaryDim",
                                "rotary_dim must be <= {kiln::rope::kMaxRotaryDim}, got {rotary_dim}")],
              params=rope_params("dim_rotary_dim", mode="kiln::rope::PosMode::kCosSin", pos="positions.data",
                                 pos64="positions_dtype", rope_theta="1.0f", rope_rcp_scale="1.0f",
                                 cos_sin="static_cast<const float*>(cos_sin_cache.data)",
                                 max_pos="dim_max_pos",
                                 cos_sin_stride="cos_sin_cache.stride(0)"),
              call="kiln::rope::apply_rope"),
        entry("rope_quantize",
              doc="RoPE of the rotary parts (cos_sin_cache rows), both parts scaled and rounded to fp8",
              args=[*(tensor(f"{part}_out", dtype="uint8", access="w", like=part, as_bytes=True,
                             why="an fp8 output's bytes") for part in PARTS),
                    tensor("q_rope", shape=["nnz", "q_heads", "rope_dim"]),
                    tensor("k_rope", shape=["*k_rope_rows", "rope_dim"], ndim=(2, 3)),  # 2-D: MLA's one head
                    tensor("q_nope", shape=["nnz", "q_heads", "nope_dim"]),
                    tensor("k_nope", shape=["*k_nope_rows", "nope_dim"], ndim=(2, 3)),
                    tensor("cos_sin_cache", shape=["max_pos", "rope_dim"], dtype="float32",
                           why="cos and sin are float32"),
                    tensor("pos_ids", shape=["nnz"], dtype=INDEX),
                    scalar("quant_scale_q", "float"), scalar("quant_scale_kv", "float"),
                    scalar("interleave", "bool"),
                    scalar("e5m2", "bool", value="q_rope_out.dtype == torch.float8_e5m2")],
              pdl=True, errors=True, bands=True, dispatch={"dtype": "q_rope.dtype"},
              api="kiln.rope_quantize_fp8",
              size_words={"nnz": "q_rope.shape[0] (nnz)", "q_heads": "q_rope.shape[1] (num_qo_heads)",
                          "rope_dim": "q_rope.shape[-1] (rope_dim)",
                          "nope_dim": "q_nope.shape[-1] (no_rope_dim)"},
              requires=[
                  require("k_rope.size(0) == dim_nnz", "k_rope.shape[0] must equal q_rope.shape[0] (nnz) "
                          "({nnz}), got {k_rope.size(0)} (shape {k_rope})"),
                  require("k_nope.ndim == k_rope.ndim",
                          "k_nope must have {k_rope.ndim} dimensions, got shape {k_nope}"),
                  require("k_nope.size(0) == dim_nnz", "k_nope.shape[0] must equal q_rope.shape[0] (nnz) "
                          "({nnz}), got {k_nope.size(0)} (shape {k_nope})"),
                  require("k_rope.ndim == 2 || k_nope.size(1) == k_rope.size(1)",
                          "k_nope.shape[1] must equal k_rope.shape[1] (num_kv_heads) ({k_rope.size(1)}), got "
                          "{k_nope.size(1)} (shape {k_nope})"),
                  require("dim_rope_dim > 0 && dim_rope_dim % 2 == 0 && "
                          "dim_rope_dim <= kiln::rope::kMaxRotaryDim",
                          "q_rope.shape[-1] (rope_dim) must be even and in [2, {kiln::rope::kMaxRotaryDim}], "
                          "got {rope_dim}"),
                  require("std::isfinite(quant_scale_q) && std::isfinite(quant_scale_kv)",
                          "quant_scale_q and quant_scale_kv must be finite, got {quant_scale_q} and "
                          "{quant_scale_kv}")],
              params=params("kiln::rope::RopeQuantParams", **QUANT_FIELDS, nnz="dim_nnz",
                            q_heads="dim_q_heads", k_heads="k_rope.ndim == 3 ? k_rope.size(1) : 1",
                            rope_dim="dim_rope_dim", nope_dim="dim_nope_dim", interleave="interleave",
                            e5m2="e5m2", scale_q="static_cast<float>(quant_scale_q)",
                            scale_kv="static_cast<float>(quant_scale_kv)",
                            at__mode="kiln::rope::PosMode::kCosSin", at__pos="pos_ids.data",
                            at__pos64="pos_ids_dtype",
                            at__cos_sin="static_cast<const float*>(cos_sin_cache.data)",
                            at__max_pos="dim_max_pos", at__cos_sin_stride="cos_sin_cache.stride(0)",
                            errors="reinterpret_cast<int64_t*>(errors)"),
              call="kiln::rope::rope_quantize"),
    ],
    dispatch={"dtype": ["f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
