# //ops:rope -- rotary positional embedding of q and k: positions from indptr/offsets, from position
# ids, or a cos/sin cache; NeoX and interleaved (GPT-J) styles, partial rotary, Llama 3.1 scaling;
# and RoPE from a cos/sin cache fused with fp8 quantisation (rope_quantize_fp8, both fp8 formats in
# each module). One module per dtype and toolchain (rope_dtype_bf16_cuda, ...); the style is a
# template argument of the kernel, everything else a run-time parameter.
op_library(
    name="rope",
    doc="rotary positional embedding of q and k (NeoX / interleaved, partial rotary, Llama 3.1, cos/sin cache), "
        "and RoPE fused with fp8 quantisation (rope_quantize_fp8, mla_rope_quantize_fp8)",
    srcs=["rope_cuda.cu"],
    host_srcs=["rope_host.cc"],
    binding="bindings/rope.cc",
    dispatch={"dtype": ["f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
