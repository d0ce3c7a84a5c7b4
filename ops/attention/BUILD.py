# //ops/attention -- attention over paged KV caches, one target per op; //ops:attention builds
# them all. Modules: attention_decode_dtype_bf16_head_dim_128_soft_cap_false_cuda, ...
# Each target compiles only its own kernels: the wgmma/TMA (sm90a) code is in :prefill alone.
HEADS = {"dtype": ["f16", "bf16"], "head_dim": [64, 128, 256]}
GPUS = ["sm80", "sm90", "sm100", "sm120"]

op_library(
    name="decode",
    doc="paged decode attention (split-KV and its merge): BatchDecodeWithPagedKVCacheWrapper, "
        "single_decode_with_kv_cache",
    srcs=["decode_cuda.cu"],
    host_srcs=["decode_host.cc"],
    binding="bindings/attention/decode.cc",
    dispatch={**HEADS, "soft_cap": [False, True]},
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
    dispatch={**HEADS, "soft_cap": [False, True]},
    # sm90a: on a 9.0 GPU this target is built as 9.0a (its wgmma kernel); the rest as declared.
    archs=["sm80", "sm90a", "sm100", "sm120"],
    release="all",
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
    doc="writing new tokens into a paged KV cache: append_paged_kv_cache",
    srcs=["page_cuda.cu"],
    host_srcs=["page_host.cc"],
    binding="bindings/attention/page.cc",
    dispatch=HEADS,
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
