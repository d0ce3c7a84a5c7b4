"""Trace template of kiln.comm's fused_allreduce_add_rmsnorm (//ops:comm).

Axes: `tokens` (var: decode batch size; the issue's 1-128) x `hidden` (const: the model's hidden
size). A trace describes one rank's call; the single-process harness runs it in a world of one
rank (a one-rank gloo group, benchmarks/routines/comm.py), where all_reduce(x) is x and the
reference is fused_add_rmsnorm's. The multi-rank sums are tested in tests/ops/comm against
torch.distributed.all_reduce. Tolerances: norm's (trace/norm.py): one rounding at the output after
float32 accumulation, plus the accumulation-order error.
"""

from __future__ import annotations

from .examples import DECODE_BATCHES, LLM_MODELS, PREFILL_TOKENS
from .norm import AXES, EPS, ROWS, SMALL, TOLERANCE, WEIGHT, fused_add_rmsnorm_reference
from .template import Example, TraceTemplate

# Decode (1-256 tokens: the target range, under max_size) and prefill (1024-8192 tokens:
# over the default max_size at hidden 8192, so those calls take the torch.distributed fallback).
EXAMPLES = tuple(
    Example(
        name=f"{m.name}-{phase}",
        model=m.name,
        phase=phase,
        consts={"hidden": m.hidden},
        workloads=tuple({"tokens": t} for t in tokens),
        scalars={"eps": m.rms_eps},
        source=m.source,
    )
    for m in LLM_MODELS
    for phase, tokens in (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS))
)


def fused_allreduce_add_rmsnorm_reference(x, residual, weight, eps):
    """A world of one rank: residual += x; x = rmsnorm(residual) (the sum rounded to the dtype)."""
    out = fused_add_rmsnorm_reference(x, residual, weight, eps)
    return {"x": out["input"], "residual": out["residual"]}


FUSED_ALLREDUCE_ADD_RMSNORM = TraceTemplate(
    name="fused_allreduce_add_rmsnorm",
    target="//ops:comm",
    description="in place: residual += all_reduce(x); x = rmsnorm(residual, weight, eps)",
    axes=AXES,
    inputs={"x": ROWS, "residual": ROWS, "weight": WEIGHT, "eps": EPS},
    outputs={"x": ROWS, "residual": ROWS},
    options={"comm": "the communicator (its group and buffers), no part of the workload"},
    reference=fused_allreduce_add_rmsnorm_reference,
    tolerance=TOLERANCE,
    examples=EXAMPLES,
    small=SMALL,
)
