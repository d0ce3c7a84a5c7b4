"""Realistic shapes for trace examples: the models kiln is tuned for, and the token,
batch and sequence-length values seen in decode and prefill.

Numbers come from each model's published config.json (named in `source`). Templates turn them
into Examples for their own axes: norm binds `hidden` and runs `tokens`; paged decode attention
binds heads, head_dim and page size and runs batch size and KV length.
"""

from __future__ import annotations

from kiln.runtime.record import Record


class Model(Record):
    """A model's shapes, with where they come from (a Record, not a dataclass: imported by every
    family module's trace templates, kiln/runtime/record.py)."""

    __slots__ = ("name", "hidden", "num_q_heads", "num_kv_heads", "head_dim", "rms_eps", "source")

    def __init__(self, name: str, hidden: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 rms_eps: float, source: str):
        self._init(name, hidden, num_q_heads, num_kv_heads, head_dim, rms_eps, source)


LLAMA_3_1_8B = Model("llama-3.1-8b", 4096, 32, 8, 128, 1e-5, "meta-llama/Llama-3.1-8B config.json")
LLAMA_3_1_70B = Model("llama-3.1-70b", 8192, 64, 8, 128, 1e-5, "meta-llama/Llama-3.1-70B config.json")
# Qwen-style GQA: 64 query heads over 8 KV heads at hidden 5120 (Qwen3-8B matches Llama-3.1-8B).
QWEN3_32B = Model("qwen3-32b", 5120, 64, 8, 128, 1e-6, "Qwen/Qwen3-32B config.json")
# Gemma's norms scale by (1 + weight): the gemma_* APIs' examples.
GEMMA_2_9B = Model("gemma-2-9b", 3584, 16, 8, 256, 1e-6, "google/gemma-2-9b config.json")
GEMMA_3_27B = Model("gemma-3-27b", 5376, 32, 16, 128, 1e-6, "google/gemma-3-27b-it config.json")

LLM_MODELS = (LLAMA_3_1_8B, LLAMA_3_1_70B, QWEN3_32B)
GEMMA_MODELS = (GEMMA_2_9B, GEMMA_3_27B)

PAGE_SIZE = 16  # tokens per KV-cache page
# Sequences in one decode step (one new token each): single-user latency up to a full batch.
DECODE_BATCHES = (1, 16, 64, 128, 256)
# KV length per sequence in decode (context already in the cache).
DECODE_KV_LENS = (1024, 4096, 8192)
# Tokens in one prefill step (the sum of the prompts' lengths), 1k-8k.
PREFILL_TOKENS = (1024, 2048, 4096, 8192)
