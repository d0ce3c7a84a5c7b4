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

import functools
from dataclasses import dataclass

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


# --- MultiLevelCascadeAttentionWrapper ------------------------------------------------------------

_HOST_SMS = 132  # the CPU backend plans as an H200 would, so CPU tests run the GPU's schedule


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _HOST_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def key_splits(qo_len: torch.Tensor, pages: torch.Tensor, num_qo_heads: int, sms: int,
               queries_per_item: int) -> int:
    """Into how many key ranges each request of a non-causal prefill level is cut: as many as
    still fit the level in one wave of `sms` SMs (one CTA per work item of the prefill module's
    `queries_per_item` queries and query head, one CTA an SM), at most the fewest pages any
    request has (every range keeps a page). 1 leaves the level whole."""
    ctas = int(((qo_len + queries_per_item - 1) // queries_per_item).sum()) * num_qo_heads
    if ctas == 0 or pages.numel() == 0:
        return 1
    return max(1, min(sms // ctas, int(pages.min())))


class MultiLevelCascadeAttentionWrapper:
    """Cascade attention over a KV cache shared at several levels (FlashInfer's class, plan/run):
    level 0 typically holds a prefix every request shares, the last level each request's own
    pages. Each level is planned as its own batch over the same paged cache, and run() merges the
    levels' attention states (merge_state_in_place) into the attention over all of them:

        out[i] = softmax(q_i K^T / sqrt(d)) V over the keys of every level query i belongs to

    plan(qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len, ...):
    one tensor per level each; level l's qo_indptr groups the queries into that level's requests
    (the shared level: [0, batch], one request of all queries; the unique level: arange(batch + 1)).
    `causal` applies to the last level only (a shared prefix lies before every query). run(q,
    paged_kv_cache) -> out [total_q, num_qo_heads, head_dim].

    How each level runs: one query per request -> paged decode (split-KV, GQA heads packed);
    otherwise paged prefill, and a non-causal level with fewer CTAs than SMs (a shared prefix
    seen by a decode batch: one request of 64 queries is 32 CTAs of 32 heads) has each request's
    pages cut into key ranges run side by side, their states merged (merge_states). A CUDA graph
    of the whole run is not supported yet (use_cuda_graph=True is refused)."""

    API = "MultiLevelCascadeAttentionWrapper"

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr=None,
        paged_kv_indptr_buf_arr=None,
        paged_kv_indices_buf_arr=None,
        paged_kv_last_page_len_buf_arr=None,
        backend: str = "auto",
    ) -> None:
        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"{self.API}: num_levels must be a positive int, got {num_levels!r}")
        if use_cuda_graph:
            raise ValueError(f"{self.API}: use_cuda_graph=True is not supported yet (run the levels eagerly)")
        self._device = _attention.workspace_bytes(float_workspace_buffer, self.API).device
        self._workspace = float_workspace_buffer
        self._kv_layout = _attention.check_layout(kv_layout, self.API)
        self._backend = backend
        self._num_levels = num_levels
        self._levels = None

    def plan(
        self,
        qo_indptr_arr,
        paged_kv_indptr_arr,
        paged_kv_indices_arr,
        paged_kv_last_page_len,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
    ) -> None:
        api = self.API + ".plan"
        arrays = {"qo_indptr_arr": qo_indptr_arr, "paged_kv_indptr_arr": paged_kv_indptr_arr,
                  "paged_kv_indices_arr": paged_kv_indices_arr,
                  "paged_kv_last_page_len": paged_kv_last_page_len}
        for name, arr in arrays.items():
            if not isinstance(arr, (list, tuple)) or len(arr) != self._num_levels:
                got = len(arr) if isinstance(arr, (list, tuple)) else type(arr).__name__
                raise ValueError(f"{api}: {name} must be a list of {self._num_levels} tensors (one per "
                                 f"level), got {got}")
        if window_left >= 0 and self._num_levels > 1:
            raise ValueError(f"{api}: window_left={window_left} is not supported across levels (a window "
                             "counts back from each query over all levels' keys)")
        if pos_encoding_mode != "NONE":  # the levels' kernels would rotate each level's keys from 0
            raise ValueError(f"{api}: pos_encoding_mode {pos_encoding_mode!r} is not supported; apply RoPE "
                             "to q and k first")
        common = dict(sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                      kv_data_type=kv_data_type, pos_encoding_mode=pos_encoding_mode)
        levels, total = [], None
        for i in range(self._num_levels):
            qo_h = _attention.index_tensor(qo_indptr_arr[i], f"qo_indptr_arr[{i}]", api)
            qo_h = qo_h.to("cpu", torch.int64)
            if qo_h.numel() < 1 or int(qo_h[0]) != 0 or bool((qo_h[1:] < qo_h[:-1]).any()):
                raise ValueError(f"{api}: qo_indptr_arr[{i}] must start at 0 and be non-decreasing")
            if total is None:
                total = int(qo_h[-1])
            elif int(qo_h[-1]) != total:
                raise ValueError(f"{api}: qo_indptr_arr[{i}] covers {int(qo_h[-1])} queries, level 0 "
                                 f"covers {total}: every level holds every query")
            level = _Level.plan(self, i == self._num_levels - 1 and causal, qo_h, paged_kv_indptr_arr[i],
                                paged_kv_indices_arr[i], paged_kv_last_page_len[i], num_qo_heads,
                                num_kv_heads, head_dim, page_size, window_left, common, f"{api} level {i}")
            levels.append(level)
        self._levels = levels
        self._total_q = total

    begin_forward = plan

    @logged_api
    def run(self, q: torch.Tensor, paged_kv_cache) -> torch.Tensor:
        """out [total_q, num_qo_heads, head_dim]: the last level's attention state merged with
        every other level's, in level order after it."""
        if self._levels is None:
            raise RuntimeError(f"{self.API}.run called before plan()")
        if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[0] != self._total_q:
            shape = list(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise ValueError(f"{self.API}.run: q must be [{self._total_q}, num_qo_heads, head_dim] (the "
                             f"planned queries), got {shape}")
        out, lse = self._levels[-1].run(q, paged_kv_cache)
        for level in self._levels[:-1]:
            out_i, lse_i = level.run(q, paged_kv_cache)
            merge_state_in_place(out, lse, out_i, lse_i)
        return out

    forward = run


@dataclass
class _Level:
    """One level of a cascade: the wrapper that runs it, and for a prefill level cut along its
    keys, the query rows its cut requests read (gather) and where each state lands (order)."""

    wrapper: object
    splits: int
    gather: torch.Tensor | None  # rows of q, request by request and key range by key range
    order: torch.Tensor | None  # rows of the result, query by query then key range

    @staticmethod
    def plan(owner, causal, qo_h, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads,
             head_dim, page_size, window_left, common, api):
        from .decode import BatchDecodeWithPagedKVCacheWrapper
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        qo_len = qo_h[1:] - qo_h[:-1]
        num_indices = _attention.index_tensor(kv_indices, "indices", api).numel()
        indptr_h, _ = _attention.paged_kv_lengths(kv_indptr, last_page_len, page_size, num_indices, api)
        if indptr_h.numel() != qo_h.numel():
            raise ValueError(f"{api}: {qo_h.numel() - 1} requests in qo_indptr but "
                             f"{indptr_h.numel() - 1} in paged_kv_indptr")
        device = owner._device
        if qo_len.numel() and bool((qo_len == 1).all()):
            w = BatchDecodeWithPagedKVCacheWrapper(owner._workspace, owner._kv_layout)
            w.plan(kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                   window_left=window_left, **common)
            return _Level(w, 1, None, None)
        pages = indptr_h[1:] - indptr_h[:-1]
        if causal:
            splits = 1
        else:  # the prefill module's work item, as its plan will cut the level
            module = _jit.module(_attention.PREFILL, device, api, head_dim=head_dim,
                                 dtype=_attention.as_dtype(common["q_data_type"], torch.float16),
                                 soft_cap=common["logits_soft_cap"] is not None, custom_mask=False,
                                 pos_encoding="none")
            splits = key_splits(qo_len, pages, num_qo_heads, _sm_count(device), module.queries_per_item)
        w = BatchPrefillWithPagedKVCacheWrapper(owner._workspace, owner._kv_layout, backend=owner._backend)
        if splits == 1:
            w.plan(qo_h.to(torch.int32), kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads,
                   head_dim, page_size, causal=causal, window_left=window_left, **common)
            return _Level(w, 1, None, None)
        # Request r's pages [p0, p1) cut into `splits` ranges of near-equal page counts, each a
        # request of its own over r's queries: ranges (r, 0), (r, 1), ... follow each other.
        last_h = _attention.index_tensor(last_page_len, "last_page_len", api).to("cpu", torch.int64)
        j = torch.arange(splits + 1)
        cut = indptr_h[:-1, None] + (pages[:, None] * j[None, :]) // splits  # [batch, splits + 1]
        new_indptr = torch.cat([cut[:, :-1].reshape(-1) - cut[0, 0], (cut[-1, -1] - cut[0, 0]).view(1)])
        new_last = torch.full((qo_len.numel(), splits), page_size, dtype=torch.int64)
        new_last[:, -1] = last_h
        base = torch.repeat_interleave(qo_h[:-1], qo_len)  # first row of each query's request
        within = torch.arange(int(qo_h[-1])) - base  # the query's row within its request
        req = torch.repeat_interleave(torch.arange(qo_len.numel()), qo_len)
        rows_before = (qo_h[:-1] * splits)[req]  # expanded rows of the requests before it
        order = rows_before[:, None] + torch.arange(splits)[None, :] * qo_len[req][:, None] + within[:, None]
        gather = torch.cat([torch.arange(int(qo_h[r]), int(qo_h[r + 1])).repeat(splits)
                            for r in range(qo_len.numel())])
        new_qo = torch.cat([torch.zeros(1, dtype=torch.int64),
                            torch.cumsum(qo_len.repeat_interleave(splits), 0)])
        indices_h = kv_indices.to("cpu", torch.int64)[int(cut[0, 0]):int(cut[-1, -1])]
        w.plan(new_qo.to(torch.int32), new_indptr.to(torch.int32), indices_h.to(torch.int32),
               new_last.reshape(-1).to(torch.int32), num_qo_heads, num_kv_heads, head_dim, page_size,
               causal=False, window_left=window_left, **common)
        return _Level(w, splits, gather.to(device), order.reshape(-1).to(device))

    def run(self, q, paged_kv_cache):
        if self.splits == 1:
            return self.wrapper.run(q, paged_kv_cache, return_lse=True)
        out, lse = self.wrapper.run(q.index_select(0, self.gather), paged_kv_cache, return_lse=True)
        n, s = q.shape[0], self.splits
        return merge_states(out.index_select(0, self.order).view(n, s, *out.shape[1:]),
                            lse.index_select(0, self.order).view(n, s, lse.shape[-1]))


# --- The shared-prefix wrappers (FlashInfer's older cascade API) ------------------------------------


def _shared_as_page(k_shared: torch.Tensor, v_shared: torch.Tensor, kv_layout: str, api: str):
    """k_shared, v_shared [shared_len, kv_heads, head_dim] (NHD) or [kv_heads, shared_len, head_dim]
    (HND) as one page of a paged cache: ([1, ...] views, shared_len)."""
    for name, t in (("k_shared", k_shared), ("v_shared", v_shared)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{api}: {name} must be a 3-D tensor ([shared_len, num_kv_heads, head_dim] for "
                             f"NHD, [num_kv_heads, shared_len, head_dim] for HND), got {shape}")
    if k_shared.shape != v_shared.shape:
        raise ValueError(f"{api}: k_shared {list(k_shared.shape)} and v_shared {list(v_shared.shape)} differ")
    shared_len = k_shared.shape[0] if kv_layout == "NHD" else k_shared.shape[1]
    return k_shared.unsqueeze(0), v_shared.unsqueeze(0), int(shared_len)


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """Decode attention of a batch whose requests share a prefix held in contiguous k_shared /
    v_shared tensors, each request's own tokens in a paged cache (FlashInfer's class, which it
    suggests replacing by MultiLevelCascadeAttentionWrapper):

        out[b] = attention of q[b] over the shared prefix's keys followed by request b's own

    begin_forward(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
    num_kv_heads, head_dim, page_size, data_type="float16") plans the unique part;
    forward(q, k_shared, v_shared, unique_kv_cache) -> out [batch, num_qo_heads, head_dim].

    Composed of kiln's own APIs, as the multi-level wrapper: the prefix runs as paged decode with
    every request's page table naming one page, the whole prefix (its K/V read through L2 by the
    batch's CTAs, split-KV where the batch is small), the unique part as the planned paged decode,
    and merge_state_in_place joins the two states. The prefix's plan is made on the first forward
    of a prefix length (and redone when it changes)."""

    API = "BatchDecodeWithSharedPrefixPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        from .decode import BatchDecodeWithPagedKVCacheWrapper

        self._kv_layout = _attention.check_layout(kv_layout, self.API)
        self._workspace = float_workspace_buffer
        self._unique = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._shared = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._args = None  # (batch, num_qo_heads, num_kv_heads, head_dim, dtype) of begin_forward
        self._shared_key = None  # (shared_len, dtype of k_shared) the prefix plan is for

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer=None) -> None:
        """Use another float workspace (FlashInfer's method; the int workspace is unused)."""
        self._unique.reset_workspace_buffer(float_workspace_buffer)
        self._shared.reset_workspace_buffer(float_workspace_buffer)
        self._shared_key = None

    def begin_forward(self, unique_kv_indptr: torch.Tensor, unique_kv_indices: torch.Tensor,
                      unique_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
                      head_dim: int, page_size: int, data_type="float16") -> None:
        """Plan the requests' own pages (BatchDecodeWithPagedKVCacheWrapper.plan, with
        data_type the dtype of q and of both caches)."""
        dtype = _attention.as_dtype(data_type, torch.float16)
        self._unique.plan(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
                          num_kv_heads, head_dim, page_size, pos_encoding_mode="NONE", q_data_type=dtype,
                          kv_data_type=dtype)
        self._args = (unique_kv_last_page_len.numel(), num_qo_heads, num_kv_heads, head_dim, dtype)
        self._shared_key = None

    plan = begin_forward

    @logged_api
    def forward(self, q: torch.Tensor, k_shared: torch.Tensor, v_shared: torch.Tensor,
                unique_kv_cache) -> torch.Tensor:
        """out [batch, num_qo_heads, head_dim]: the states over the shared prefix and over each
        request's own pages, merged."""
        if self._args is None:
            raise RuntimeError(f"{self.API}.forward called before begin_forward()")
        api = self.API + ".forward"
        k_page, v_page, shared_len = _shared_as_page(k_shared, v_shared, self._kv_layout, api)
        batch, num_qo_heads, num_kv_heads, head_dim, dtype = self._args
        out, lse = self._unique.run(q, unique_kv_cache, return_lse=True)
        if shared_len == 0:
            return out
        key = (shared_len, k_shared.dtype, k_shared.device)
        if key != self._shared_key:
            device = self._unique._device
            self._shared.plan(torch.arange(batch + 1, dtype=torch.int32),
                              torch.zeros(batch, dtype=torch.int32, device=device),
                              torch.full((batch,), shared_len, dtype=torch.int32), num_qo_heads, num_kv_heads,
                              head_dim, shared_len, pos_encoding_mode="NONE", q_data_type=dtype,
                              kv_data_type=k_shared.dtype)
            self._shared_key = key
        out_shared, lse_shared = self._shared.run(q, (k_page, v_page), return_lse=True)
        merge_state_in_place(out_shared, lse_shared, out, lse)
        return out_shared

    run = forward


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """Prefill/append attention of a batch whose requests share a prefix held in contiguous
    k_shared / v_shared tensors, each request's own tokens in a paged cache (FlashInfer's class;
    it suggests MultiLevelCascadeAttentionWrapper instead):

        out[i] = attention of query i over the shared prefix (all of it) and its request's own
                 keys (causal among them when forward's causal=True)

    begin_forward(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
    num_qo_heads, num_kv_heads, head_dim, page_size) records the unique part;
    forward(q, k_shared, v_shared, unique_kv_cache, causal=False, use_fp16_qk_reduction=False,
    sm_scale=None, rope_scale=None, rope_theta=None) -> out [qo_indptr[-1], num_qo_heads, head_dim].

    Composed of kiln's public APIs: single_prefill_with_kv_cache over the prefix (non-causal,
    every query), BatchPrefillWithPagedKVCacheWrapper over the requests' pages (planned on the
    first forward of a (causal, sm_scale, dtype), as FlashInfer's older API fixed them at
    forward), merge_state_in_place. use_fp16_qk_reduction is accepted and ignored; rope_scale /
    rope_theta apply to nothing (no positional encoding inside attention here)."""

    API = "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        self._kv_layout = _attention.check_layout(kv_layout, self.API)
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._args = None
        self._planned = None  # (causal, sm_scale, q dtype, kv dtype) of the unique part's plan

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer=None) -> None:
        """Use another float workspace (FlashInfer's method)."""
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, self._kv_layout)
        self._planned = None

    def begin_forward(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
                      paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int,
                      num_kv_heads: int, head_dim: int, page_size: int) -> None:
        """Record the requests' queries and pages; the plan is made at forward (its causal flag)."""
        api = self.API + ".begin_forward"
        for name, t in (("qo_indptr", qo_indptr), ("paged_kv_indptr", paged_kv_indptr),
                        ("paged_kv_indices", paged_kv_indices),
                        ("paged_kv_last_page_len", paged_kv_last_page_len)):
            _attention.index_tensor(t, name, api)
        self._args = (qo_indptr.to("cpu", torch.int32), paged_kv_indptr.to("cpu", torch.int32),
                      paged_kv_indices.clone(), paged_kv_last_page_len.to("cpu", torch.int32), num_qo_heads,
                      num_kv_heads, head_dim, page_size)
        self._planned = None

    plan = begin_forward

    @logged_api
    def forward(self, q: torch.Tensor, k_shared: torch.Tensor, v_shared: torch.Tensor, unique_kv_cache,
                causal: bool = False, use_fp16_qk_reduction: bool = False, sm_scale: float | None = None,
                rope_scale=None, rope_theta=None) -> torch.Tensor:
        """out [qo_indptr[-1], num_qo_heads, head_dim]."""
        from .prefill import single_prefill_with_kv_cache

        if self._args is None:
            raise RuntimeError(f"{self.API}.forward called before begin_forward()")
        _shared_as_page(k_shared, v_shared, self._kv_layout, self.API + ".forward")  # checks the shapes
        k_cache, _ = _attention.split_cache(unique_kv_cache, self.API + ".forward")
        key = (bool(causal), sm_scale, q.dtype, k_cache.dtype)
        if key != self._planned:
            self._prefill.plan(*self._args, causal=bool(causal), sm_scale=sm_scale, q_data_type=q.dtype,
                               kv_data_type=k_cache.dtype)
            self._planned = key
        out_shared, lse_shared = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                              kv_layout=self._kv_layout, sm_scale=sm_scale,
                                                              return_lse=True)
        out, lse = self._prefill.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(out_shared, lse_shared, out, lse)
        return out_shared

    run = forward
