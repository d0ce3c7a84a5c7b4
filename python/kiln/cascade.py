"""Merging attention states (//ops:attention), FlashInfer's names: the building block of split-KV
and cascade attention.

An attention state of a query head over a set of keys is (v, s): v [head_dim] the softmax-weighted
sum of the values, s = log2(sum exp(logits)) (base 2, as the attention APIs return it). Two
states over disjoint key sets merge into the state over their union:

    s = log2(2^s_a + 2^s_b),   v = (2^(s_a - s) * v_a + 2^(s_b - s) * v_b)

    merge_state(v_a, s_a, v_b, s_b) -> (v, s)       v_* [seq, heads, head_dim], s_* [seq, heads]
    merge_state_in_place(v, s, v_other, s_other, mask=None)    in place; rows with mask False kept
    merge_states(v, s) -> (v, s)                     v [seq, states, heads, head_dim], s [seq, states, heads]

v is float16 or bfloat16, s float32; arithmetic in float32. An empty state has s = -inf.
"""

from __future__ import annotations

import torch

from . import _attention, _jit
from ._ops import custom_op
from .api_logging import logged_api
from .trace import attention as attention_traces
from .trace import traced


def _check_states(v: torch.Tensor, api: str) -> None:
    if not isinstance(v, torch.Tensor) or v.dim() < 3:
        raise ValueError(f"{api}: v must be a tensor [..., num_heads, head_dim]")


def _module(v: torch.Tensor, api: str):
    return _jit.module(_attention.CASCADE, v.device, api, dtype=v.dtype, head_dim=v.shape[-1])


@custom_op("merge_state", mutates=("out", "out_lse"))
def _merge_two_op(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                  out: torch.Tensor, out_lse: torch.Tensor) -> None:
    dl = _jit.dl
    _module(v_a, "kiln.merge_state").merge_two(
        v_a=dl(v_a), s_a=dl(s_a), v_b=dl(v_b), s_b=dl(s_b), mask=None, out=dl(out), out_lse=dl(out_lse),
        stream=_jit.stream_of(v_a.device))


@custom_op("merge_state_in_place", mutates=("v", "s"))
def _merge_in_place_op(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                       mask: torch.Tensor | None) -> None:
    dl = _jit.dl
    _module(v, "kiln.merge_state_in_place").merge_two(
        v_a=dl(v), s_a=dl(s), v_b=dl(v_other), s_b=dl(s_other), mask=None if mask is None else dl(mask),
        out=dl(v), out_lse=dl(s), stream=_jit.stream_of(v.device))


@custom_op("merge_states", mutates=("out", "out_lse"))
def _merge_states_op(v: torch.Tensor, s: torch.Tensor, out: torch.Tensor, out_lse: torch.Tensor) -> None:
    dl = _jit.dl
    _module(v, "kiln.merge_states").merge_states(v=dl(v), s=dl(s), out=dl(out), out_lse=dl(out_lse),
                                                 stream=_jit.stream_of(v.device))


@logged_api
@traced(attention_traces.MERGE_STATE)
def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """The state over the union of two disjoint key sets. Returns (v, s)."""
    _check_states(v_a, "kiln.merge_state")
    out = torch.empty_like(v_a)
    out_lse = torch.empty_like(s_a)
    _merge_two_op(v_a, s_a, v_b, s_b, out, out_lse)
    return out, out_lse


@logged_api(mutates=("v", "s"))
@traced(attention_traces.MERGE_STATE_IN_PLACE)
def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                         mask: torch.Tensor | None = None) -> None:
    """v, s <- merge of (v, s) and (v_other, s_other), for the rows where mask is True (all rows
    when mask is None)."""
    _check_states(v, "kiln.merge_state_in_place")
    _merge_in_place_op(v, s, v_other, s_other, mask)


@logged_api
@traced(attention_traces.MERGE_STATES)
def merge_states(v: torch.Tensor, s: torch.Tensor):
    """Merge `states` states per row: v [seq, states, heads, head_dim], s [seq, states, heads].
    Returns (v [seq, heads, head_dim], s [seq, heads])."""
    _check_states(v, "kiln.merge_states")
    if v.dim() != 4:
        raise ValueError(f"kiln.merge_states: v must be [seq, num_states, num_heads, head_dim], "
                         f"got {list(v.shape)}")
    out = torch.empty((v.shape[0], v.shape[2], v.shape[3]), dtype=v.dtype, device=v.device)
    out_lse = torch.empty((v.shape[0], v.shape[2]), dtype=torch.float32, device=v.device)
    _merge_states_op(v, s, out, out_lse)
    return out, out_lse
