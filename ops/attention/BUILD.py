# //ops/attention -- attention over paged KV caches, one target per op; //ops:attention builds
# them all. Modules: attention_decode_dtype_bf16_kv_dtype_bf16_head_dim_128_soft_cap_false_rope_false_cuda,
# ...
# Each target compiles only its own kernels: the wgmma/TMA (sm90a) code is in :prefill alone.
HEADS = {"dtype": ["f16", "bf16"], "head_dim": [64, 128, 256]}
GPUS = ["sm80", "sm90", "sm100", "sm120"]
# The cache's element type beside the query's: the same 16-bit type, or fp8 E4M3 (with per-tensor
# k_scale / v_scale). A 16-bit cache of the other 16-bit type is refused.
KV_DTYPES = {"kv_dtype": ["f16", "bf16", "e4m3"]}
MIXED_16_BIT = [
    unsupported({"dtype": "f16", "kv_dtype": "bf16"}, "a 16-bit cache has the query's dtype"),
    unsupported({"dtype": "bf16", "kv_dtype": "f16"}, "a 16-bit cache has the query's dtype"),
]

op_library(
    name="decode",
    doc="paged decode attention (split-KV and its merge; 16-bit or fp8 E4M3 caches; one or several "
        "queries a request; ROPE_LLAMA inside the kernel where rope is true): "
        "BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper, "
        "single_decode_with_kv_cache",
    srcs=["decode_cuda.cu"],
    host_srcs=["decode_host.cc"],
    binding="bindings/attention/decode.cc",
    dispatch={"dtype": HEADS["dtype"], **KV_DTYPES, "head_dim": HEADS["head_dim"], "soft_cap": [False, True],
              "rope": [False, True]},
    exclude=MIXED_16_BIT,
    archs=GPUS,
    release="all",
)

op_library(
    name="prefill",
    doc="prefill attention, an mma.sync kernel (sm80+) and a wgmma + TMA kernel (sm90a): "
        "single_prefill_with_kv_cache, BatchPrefillWith{Paged,Ragged}KVCacheWrapper",
    srcs=["prefill_cuda.cu"],
    host_srcs=["prefill_host.cc"],
    binding="bindings/attention/prefill.cc",
    # custom_mask and pos_encoding select the FA2 kernel's variants (FlashInfer's custom_mask /
    # packed_custom_mask and pos_encoding_mode ROPE_LLAMA / ALIBI); their modules hold no sm90a
    # kernel, and are compiled on first use rather than shipped.
    dispatch={**HEADS, "soft_cap": [False, True], "custom_mask": [False, True],
              "pos_encoding": ["none", "rope", "alibi"]},
    # sm90a: on a 9.0 GPU this target is built as 9.0a (its wgmma kernel); the rest as declared.
    archs=["sm80", "sm90a", "sm100", "sm120"],
    release={"custom_mask": [False], "pos_encoding": ["none"]},
)

op_library(
    name="cascade",
    doc="merging attention states: merge_state, merge_state_in_place, merge_states",
    srcs=["cascade_cuda.cu"],
    host_srcs=["cascade_host.cc"],
    binding="bindings/attention/cascade.cc",
    dispatch=HEADS,
    archs=GPUS,
    release="all",
)

op_library(
    name="page",
    doc="writing new tokens into a paged KV cache (fp8 E4M3 caches quantised with k_scale / v_scale): "
        "append_paged_kv_cache",
    srcs=["page_cuda.cu"],
    host_srcs=["page_host.cc"],
    binding="bindings/attention/page.cc",
    dispatch={"dtype": HEADS["dtype"], **KV_DTYPES, "head_dim": HEADS["head_dim"]},
    exclude=MIXED_16_BIT,
    archs=GPUS,
    release="all",
)

op_library(
    name="positions",
    doc="where appended tokens go (request and position): get_batch_indices_positions",
    srcs=["positions_cuda.cu"],
    host_srcs=["positions_host.cc"],
    binding="bindings/attention/positions.cc",
    archs=GPUS,
    release="all",
)

op_group(
    name="attention",
    doc="every attention op: decode, prefill, cascade, page, positions",
    targets=[":decode", ":prefill", ":cascade", ":page", ":positions"],
)
