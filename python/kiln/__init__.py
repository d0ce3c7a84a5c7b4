"""kiln: JIT-compiled GPU kernels for LLM inference, with a CPU backend for every op.

    import kiln
    y = kiln.rmsnorm(x, w)          # compiled for x's device on first use, cached afterwards

The public API follows FlashInfer's names where an op exists there. The build graph, the JIT
runtime and the kernel sources ship inside the package as kiln.codegen, kiln.runtime, kiln/_src.

Importing kiln loads nothing but this file: each public name is imported from its module the first
time it is used (module __getattr__), so `import kiln.runtime` and `import kiln.codegen` (the JIT
and the build graph, which know no framework) never load torch or the public API.
"""

import importlib as _importlib  # (a private name: dir(kiln) lists the API, not this module's imports)

# The public API: module (python/kiln/<module>.py) -> the names it exports. A new op family adds
# one line here.
_API = {
    "norm": ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm",
             "rmsnorm_quant", "fused_add_rmsnorm_quant", "layernorm_quant"),
    "activation": ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
    "rope": ("apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
             "apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
             "apply_llama31_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
             "apply_rope_with_cos_sin_cache_inplace", "rope_quantize_fp8", "mla_rope_quantize_fp8"),
    "quantization": ("per_token_group_quant_fp8", "scaled_fp8_quant", "packbits", "segment_packbits"),
    "sampling": ("softmax", "sampling_from_probs", "sampling_from_logits", "top_k_sampling_from_probs",
                 "top_p_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
                 "top_k_top_p_sampling_from_logits", "top_k_renorm_probs", "top_p_renorm_probs",
                 "top_k_mask_logits", "chain_speculative_sampling"),
    "decode": ("BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
               "single_decode_with_kv_cache", "fast_decode_plan"),
    "prefill": ("BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
                "single_prefill_with_kv_cache"),
    "cascade": ("merge_state", "merge_state_in_place", "merge_states", "MultiLevelCascadeAttentionWrapper",
                "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"),
    "page": ("append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"),
    "moe": ("moe_topk", "moe_align_block_size", "moe_permute", "moe_unpermute", "fused_moe",
            "cutlass_fused_moe", "cutlass_fused_moe_workspace_size", "ActivationType"),
    "gemm": ("mm_bf16", "bmm_bf16", "bmm_fp8", "gemm_fp8_nt_groupwise", "gemm_fp8_nt_blockscaled",
             "SegmentGEMMWrapper", "grouped_mm", "group_gemm_fp8_nt_groupwise"),
    "comm": ("CustomAllReduce", "fused_allreduce_add_rmsnorm"),
    "errors": ("check_errors", "DeviceIndexError"),
    "autotuner": ("autotune",),
}
# Public names that are tools, not ops: no kernel of their own, so no trace template, benchmark
# routine or custom op (tests/trace/test_trace_templates.py skips them). The cascade wrapper runs
# the traced decode, prefill and merge APIs, level by level (benchmarks/cascade.py times it).
# CustomAllReduce is a communicator (a group's buffers), not a plan/run wrapper: its all_reduce
# is tested across processes (tests/ops/comm) and the traced op of //ops:comm is
# fused_allreduce_add_rmsnorm. cutlass_fused_moe_workspace_size (a byte count) and ActivationType
# (an enum) are cutlass_fused_moe's companions.
_TOOLS = frozenset({"check_errors", "DeviceIndexError", "autotune", "MultiLevelCascadeAttentionWrapper",
                    "CustomAllReduce", "cutlass_fused_moe_workspace_size", "ActivationType",
                    # decode/page/cascade: a subclass whose run() is the traced parent's, a re-plan
                    # helper, torch arithmetic on the page table, and two wrappers composed of traced
                    # prefill, decode and merge APIs
                    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "fast_decode_plan", "get_seq_lens",
                    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"})
_OWNER = {name: module for module, names in _API.items() for name in names}
# Submodules that are part of the API as modules.
_SUBMODULES = ("utils",)

__all__ = ["__version__", *_OWNER, *_SUBMODULES]


def __getattr__(name: str):
    module = _OWNER.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(f"kiln.{module}"), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    if name in _SUBMODULES or name in _API:  # kiln.decode.BatchDecode..., as FlashInfer's users write
        return _importlib.import_module(f"kiln.{name}")
    if name == "__version__":  # version.txt, read on first access
        from kiln.runtime.sources import kiln_version

        return kiln_version()
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_api() -> None:
    """Import every public API module now (their torch custom ops, trace templates and logged APIs
    register on import); kiln does this lazily otherwise."""
    for module in _API:
        _importlib.import_module(f"kiln.{module}")
