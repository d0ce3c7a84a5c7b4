"""kiln: JIT-compiled GPU kernels for LLM inference, with a CPU backend for every op.

    import kiln
    y = kiln.rmsnorm(x, w)          # compiled for x's device on first use, cached afterwards

The public API follows FlashInfer's names where an op exists there. The build graph, the JIT
runtime and the kernel sources ship inside the package as kiln.codegen, kiln.runtime, kiln/_src.
"""

from __future__ import annotations

from . import utils
from .cascade import merge_state, merge_state_in_place, merge_states
from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, rmsnorm
from .page import append_paged_kv_cache, get_batch_indices_positions
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

__all__ = [
    "__version__",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "rmsnorm",
    "utils",
]


def __getattr__(name: str):
    if name == "__version__":  # read from version.txt (R7.15) on first access, not at import
        from kiln.runtime.sources import kiln_version

        return kiln_version()
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
