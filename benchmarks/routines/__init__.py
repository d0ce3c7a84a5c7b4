"""Every benchmark routine, registered here and nowhere else. Adding an op to the harness is
adding its Routine (and its API's trace template), never a new script."""

from __future__ import annotations

from ..routine import Routine
from . import attention, norm

ROUTINES: dict[str, Routine] = {
    r.name: r
    for r in (
        norm.RMSNORM,
        norm.FUSED_ADD_RMSNORM,
        norm.GEMMA_RMSNORM,
        norm.GEMMA_FUSED_ADD_RMSNORM,
        attention.BATCH_DECODE,
        attention.SINGLE_DECODE,
        attention.MERGE_STATE,
        attention.MERGE_STATE_IN_PLACE,
        attention.MERGE_STATES,
        attention.APPEND_PAGED_KV_CACHE,
        attention.GET_BATCH_INDICES_POSITIONS,
        attention.BATCH_PREFILL,
        attention.BATCH_PREFILL_RAGGED,
        attention.SINGLE_PREFILL,
    )
}


def routine(name: str) -> Routine:
    if name not in ROUTINES:
        raise KeyError(f"no routine named {name!r}; routines: {', '.join(ROUTINES)} (or 'all')")
    return ROUTINES[name]
