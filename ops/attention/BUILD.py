# //ops:attention -- paged decode attention (single and batch, split-KV), attention-state merges,
# and appending to a paged KV cache. One module per dtype x head_dim x soft-cap and toolchain:
# attention_dtype_bf16_head_dim_128_soft_cap_false_cuda, ...
op_library(
    name="attention",
    doc="paged decode attention (split-KV), merge_state(s), append_paged_kv_cache",
    srcs=["attention_cuda.cu"],
    host_srcs=["attention_host.cc"],
    binding="bindings/attention.cc",
    dispatch={
        "dtype": ["f16", "bf16"],
        "head_dim": [64, 128, 256],
        "soft_cap": [False, True],
    },
    archs=["sm80", "sm90a", "sm100", "sm120"],
)
