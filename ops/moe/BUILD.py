# //ops:moe -- mixture of experts: routing (moe_topk), vLLM's moe_align_block_size, moe_permute /
# moe_unpermute; fused_moe and cutlass_fused_moe compose these with //ops/gemm:grouped and
# //ops:activation. One module per dtype and toolchain (moe_dtype_bf16_cuda, ...): the dtype is
# the router logits' for moe_topk and the hidden states' for permute/unpermute (align takes int32
# ids and uses any module).
op_library(
    name="moe",
    doc="MoE routing and data movement: moe_topk, moe_align_block_size, moe_permute, moe_unpermute",
    srcs=["moe_cuda.cu"],
    host_srcs=["moe_host.cc"],
    binding="bindings/moe.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
