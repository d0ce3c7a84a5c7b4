"""Decode attention over a paged KV cache (//ops:attention), with FlashInfer's names and argument
order so its users can switch:

    single_decode_with_kv_cache(q, k, v, kv_layout="NHD", sm_scale=None, logits_soft_cap=None,
                                window_left=-1, return_lse=False)
    BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                                       ...).plan(indptr, indices, last_page_len, num_qo_heads,
                                       num_kv_heads, head_dim, page_size, ...).run(q, paged_kv_cache)

One query token per request (or N with plan(q_len_per_req=N): request b's queries are rows
b * N + j, query j at position L - N + j, causal among themselves). For each query head h (kv head
h // (num_qo_heads // num_kv_heads)) of the query at position P (L - 1 with one query):
    logit[t] = q[h] . k[t] * sm_scale, soft-capped as cap * tanh(logit / cap) when given
    out[h]   = sum_t softmax(logit)[t] * v[t]          over t in [max(0, P - window_left), P]
    lse[h]   = log2(sum_t exp(logit[t]))               (base 2, as FlashInfer returns it)
pos_encoding_mode="ROPE_LLAMA" rotates q (at P) and k[t] (at t) inside the kernel first.

Paged KV cache (per layer): a (k_cache, v_cache) tuple of [max_num_pages, page_size,
num_kv_heads, head_dim] (NHD) or [max_num_pages, num_kv_heads, page_size, head_dim] (HND), or one
[max_num_pages, 2, ...] tensor. Request b owns pages indices[indptr[b]:indptr[b+1]], the last one
filled to last_page_len[b]. indptr/indices/last_page_len are int32.

fp8 caches: the cache may be torch.float8_e4m3fn (plan(kv_data_type=torch.float8_e4m3fn)) holding
k / k_scale and v / v_scale with per-tensor scales, which run(k_scale=, v_scale=) takes as floats
(FlashInfer's arguments): logits use k * k_scale and the output v * v_scale, for any cache dtype.
The kernel reads the fp8 bytes (half the traffic of a 16-bit cache) and runs its products on f16
operands: E4M3 values are exact in f16, and q * sm_scale * k_scale is rounded to f16 once
(11 significant bits: finer than bf16's 8), P to f16 as well.

plan() schedules on the host once per batch (it reads indptr and last_page_len, so it syncs)
and is reused by run() for every layer. With use_cuda_graph=True the wrapper owns fixed buffers
(the page-table buffers passed to the constructor and a fixed-capacity work list), run() does no
host synchronisation, and a captured run() replays correctly after later plan() calls with the
same batch size.
"""

from __future__ import annotations

import collections
import functools
import math
import warnings
from dataclasses import dataclass

import torch

from kiln.runtime import env

from . import _attention, _jit, _persistent
from ._decode_schedule import schedule
from ._ops import custom_op, inference_only
from .api_logging import logged_api
from .diagnostics import hooks
from .trace import attention as attention_traces
from .trace import traced

API = "BatchDecodeWithPagedKVCacheWrapper"
# Resident decode CTAs per SM (4 warps, ~166 registers, 96 KB of shared memory at head_dim 128,
# so two fit in an SM's 228 KB): the split heuristic aims at one wave of SMs x this.
CTAS_PER_SM = 2
HOST_SLOTS = 16  # the CPU backend's nominal width: small batches still exercise split-KV
POS_ENCODINGS = ("NONE", "ROPE_LLAMA")  # FlashInfer's names kiln's decode applies
ROPE_SCALE, ROPE_THETA = 1.0, 1e4  # FlashInfer's defaults when plan() is given None


@dataclass(eq=False)
class _Plan:
    """What plan() decided, kept for run(): shapes to check, the module, and the launcher's
    arguments the plan owns: as DLPack capsules for the eager call (`fixed`), as tensors in the
    custom op's order for a compiled graph (`tensors`)."""

    batch: int
    q_len: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    window_left: int
    soft_cap: float | None
    rope: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    sm_scale: float
    chunk: int
    num_items: int
    slots: int
    module: object
    fixed: dict
    tensors: tuple
    validate: bool  # KILN_VALIDATE_INDICES: check the kernel's index errors after every run
    checked: tuple | None = None


@functools.cache
def _slots(device: torch.device) -> int:
    if device.type != "cuda":
        return HOST_SLOTS
    return torch.cuda.get_device_properties(device).multi_processor_count * CTAS_PER_SM


def _positive_int(value, name: str, api: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{api}: {name} must be a positive int, got {value!r}")
    return value


def _rope_value(value, default: float, name: str, api: str) -> float:
    """rope_scale / rope_theta: None is FlashInfer's default; else finite and > 0 (theta > 1)."""
    if value is None:
        return default
    low = 1.0 if name == "rope_theta" else 0.0
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= low:
        raise ValueError(f"{api}: {name} must be None or a finite number > {low:g}, got {value!r}")
    return float(value)


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode attention over paged KV caches: plan once per batch, run per layer."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None,
                 backend: str = "auto", jit_args=None) -> None:
        """
        Args:
            float_workspace_buffer: scratch for split-KV partial results: a contiguous uint8 or
                int8 tensor of at least 1 MiB (FlashInfer suggests 128 MB) on the device the wrapper
                runs on.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: keep every buffer run() touches fixed, so run() can be captured.
                Needs the three paged_kv_*_buffer arguments (their sizes fix the batch size and
                the page capacity).
            use_tensor_cores, backend: accepted for FlashInfer compatibility; kiln has one decode
                kernel (tensor cores, cp.async pipeline) for every call, multi-token decode
                (plan(q_len_per_req=N)) included, and ignores them.
            jit_args: FlashInfer's custom-kernel generator arguments; kiln builds no user kernels,
                so anything but None is a ValueError.
        """
        _attention.check_layout(kv_layout, API)
        if jit_args is not None:
            raise ValueError(f"{API}: jit_args (FlashInfer's custom attention kernels) is not supported; "
                             "kiln's decode kernel takes its variants as plan() arguments")
        self._workspace = _attention.workspace_bytes(float_workspace_buffer, API)
        self._device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = bool(use_tensor_cores)
        self._plan = None
        self._frozen_q_len = None  # CUDA graphs: q_len_per_req of the first plan (part of the shape)
        self._copy_done = None
        self._merge_counter = None  # int32, zero between launches (the kernel re-zeroes what it counts)
        self._retired_counters = []  # outgrown counters a captured CUDA graph may still launch with
        if use_cuda_graph:
            missing = [n for n, b in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                                      ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                                      ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer))
                       if b is None]
            if missing:
                raise ValueError(f"{API}: use_cuda_graph=True needs fixed page-table buffers; pass "
                                 f"{', '.join(missing)}")
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if _attention.index_tensor(buf, name, API).dtype != torch.int32 or buf.device != self._device:
                    raise ValueError(f"{API}: {name} must be an int32 tensor on {self._device}, got "
                                     f"{buf.dtype} on {buf.device}")
            if paged_kv_indptr_buffer.numel() != paged_kv_last_page_len_buffer.numel() + 1:
                raise ValueError(f"{API}: paged_kv_indptr_buffer has {paged_kv_indptr_buffer.numel()} "
                                 "entries; it must be batch_size + 1 for paged_kv_last_page_len_buffer's "
                                 f"{paged_kv_last_page_len_buffer.numel()}")
            self._indptr_buf = paged_kv_indptr_buffer
            self._indices_buf = paged_kv_indices_buffer
            self._last_page_len_buf = paged_kv_last_page_len_buffer
            self._fixed_batch = paged_kv_indptr_buffer.numel() - 1
            capacity = self._fixed_batch + _slots(self._device)
            self._work_capacity, self._merge_capacity = capacity, self._fixed_batch
            self._work_buf = torch.empty(5 * capacity + 3 * self._fixed_batch + 1, dtype=torch.int32,
                                         device=self._device)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self) -> bool:
        """As given to the constructor (FlashInfer's property); kiln's kernel always uses them."""
        return self._use_tensor_cores

    @property
    def plan_info(self) -> dict:
        """The current plan's schedule: split chunk in tokens (0 = unsplit), work items, and
        float32 partial slots."""
        p = self._plan
        if p is None:
            raise RuntimeError(f"{API}.plan_info: no plan yet")
        return {"chunk": p.chunk, "work_items": p.num_items, "partial_slots": p.slots}

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer=None) -> None:
        """Use another float workspace from the next plan() on (FlashInfer's method; kiln keeps no
        int workspace, so `int_workspace_buffer` is accepted and unused)."""
        self._workspace = _attention.workspace_bytes(float_workspace_buffer, API)

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, data_type=None, sm_scale: float | None = None, rope_scale: float | None = None,
             rope_theta: float | None = None, non_blocking: bool = True, block_tables=None,
             seq_lens: torch.Tensor | None = None, fixed_split_size: int | None = None,
             disable_split_kv: bool = False, q_len_per_req: int = 1, *, window_right: int = 0,
             is_causal: bool | None = None) -> None:
        """Schedule a batch: validate the page table, split long requests when the batch is too
        small to fill the GPU, and copy the work list to the device. Reused by every run(). Raises
        an index error a kernel recorded on this device since the plan before the last one
        (kiln/errors.py), without waiting for the device.

        FlashInfer's arguments, in its order (the optional ones may be given positionally):
            pos_encoding_mode: "NONE", or "ROPE_LLAMA": q (at its position L - q_len_per_req + j)
                and every key (at its token index) rotated inside the kernel, rotate-half over
                dims (i, i + head_dim / 2) by position x rope_theta^(-2i / head_dim) / rope_scale
                (defaults 1e4 and 1). "ALIBI" is refused.
            window_left: -1, or the keys t >= position - window_left only. window_right: 0 only.
            q_data_type / kv_data_type / data_type: FlashInfer's rules (data_type fills whichever
                of the two is None; kv defaults to q); o_data_type: None or q's dtype.
            block_tables: accepted and unused (FlashInfer's trtllm-gen/cudnn backends read it);
                seq_lens: if given, must equal the page table's lengths.
            fixed_split_size: split every request into chunks of this many pages (deterministic,
                batch-invariant results); None or -1: kiln's heuristic. disable_split_kv: no split.
            q_len_per_req: queries per request (multi-token decode, speculative verification):
                q [batch * q_len_per_req, ...], request b's rows b * q_len_per_req + j, causal
                among themselves (query j sees keys t <= L - q_len_per_req + j); every request
                needs L >= q_len_per_req. With use_cuda_graph it is fixed by the first plan.
            is_causal: None, or q_len_per_req > 1 (FlashInfer derives it the same way).
        """
        self._plan_batch(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                         pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
                         o_data_type=o_data_type, data_type=data_type, sm_scale=sm_scale,
                         rope_scale=rope_scale, rope_theta=rope_theta, non_blocking=non_blocking,
                         seq_lens=seq_lens,
                         fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                         q_len_per_req=q_len_per_req, window_right=window_right, is_causal=is_causal)

    begin_forward = plan  # FlashInfer's older name

    def _plan_batch(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                    pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                    kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                    rope_theta=None, non_blocking=True, seq_lens=None, fixed_split_size=None,
                    disable_split_kv=False, q_len_per_req=1, window_right=0, is_causal=None,
                    indptr_host=None, buffers_written=False) -> None:
        """plan() and fast_decode_plan(): `indptr_host` a CPU copy of indptr the caller already has
        (no device read), `buffers_written` the CUDA-graph page-table buffers already hold the
        page table (no copy into them)."""
        api = API + ".plan"
        _attention.errors.poll(self._device)
        if pos_encoding_mode not in POS_ENCODINGS:
            names = ", ".join(map(repr, POS_ENCODINGS))
            raise ValueError(f"{api}: pos_encoding_mode must be one of {names}, got {pos_encoding_mode!r} "
                             "(ALiBi is not supported)")
        for name, value in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            _positive_int(value, name, api)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"{api}: num_qo_heads ({num_qo_heads}) must be a multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        q_len = _positive_int(q_len_per_req, "q_len_per_req", api)
        if is_causal is not None and bool(is_causal) != (q_len > 1):
            raise NotImplementedError(f"{api}: is_causal={is_causal!r} with q_len_per_req={q_len}: the "
                                      "decode mask follows q_len_per_req (causal among a request's queries "
                                      "when it is > 1)")
        if window_right != 0:
            raise NotImplementedError(f"{api}: window_right must be 0 (each query sees no key after its "
                                      f"position), got {window_right!r}")
        if self._use_cuda_graph and self._frozen_q_len is not None and q_len != self._frozen_q_len:
            raise ValueError(f"{api}: q_len_per_req is part of the frozen CUDA-graph shape: this wrapper was "
                             f"planned with {self._frozen_q_len}, got {q_len}; use a wrapper per "
                             "q_len_per_req")
        logits_soft_cap = _attention.soft_cap(logits_soft_cap, api)
        _attention.check_window(window_left, api)
        _attention.check_sm_scale(sm_scale, api)
        rope_scale = _rope_value(rope_scale, ROPE_SCALE, "rope_scale", api)
        rope_theta = _rope_value(rope_theta, ROPE_THETA, "rope_theta", api)
        _attention.index_tensor(indices, "indices", api)
        if data_type is not None:  # FlashInfer's deprecated alias: fills whichever is None
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dtype = _attention.as_dtype(q_data_type, torch.float16)
        kv_dtype = _attention.as_dtype(kv_data_type, q_dtype)
        o_dtype = _attention.as_dtype(o_data_type, q_dtype)
        if q_dtype in (torch.float16, torch.bfloat16):
            _attention.kv_cache_dtype(q_dtype, kv_dtype, api)
        if o_dtype != q_dtype:
            raise TypeError(f"{api}: o_data_type {o_dtype} is not supported; the output has q's dtype "
                            f"({q_dtype})")
        split = fixed_split_size
        if split is not None and (isinstance(split, bool) or not isinstance(split, int)):
            raise ValueError(f"{api}: fixed_split_size must be None or an int (pages per chunk; -1 for "
                             f"none), got {split!r}")
        rope = pos_encoding_mode == "ROPE_LLAMA"
        # Resolve (and, the first time, compile) the module now: an unsupported dtype or head_dim
        # fails at plan, and run() has nothing left to look up.
        module = _jit.module(_attention.DECODE, self._device, api, dtype=q_dtype, kv_dtype=kv_dtype,
                             head_dim=head_dim, soft_cap=logits_soft_cap is not None, rope=rope,
                             names={"dtype": "q_data_type", "kv_dtype": "kv_data_type",
                                    "rope": "pos_encoding_mode"})

        table_indptr = indptr if indptr_host is None else indptr_host
        indptr_h, kv_len = _attention.paged_kv_lengths(table_indptr, last_page_len, page_size,
                                                       indices.numel(), api)
        batch = kv_len.numel()
        if seq_lens is not None:
            given = _attention.index_tensor(seq_lens, "seq_lens", api).to("cpu", torch.int64)
            if not torch.equal(given, kv_len):
                raise ValueError(f"{api}: seq_lens {given.tolist()[:8]} differ from the page table's lengths "
                                 f"{kv_len.tolist()[:8]} (indptr, last_page_len, page_size={page_size})")
        if q_len > 1 and batch and int(kv_len.min()) < q_len:
            b = int(torch.argmin(kv_len))
            raise ValueError(f"{api}: q_len_per_req={q_len} needs kv_len >= q_len_per_req for every request "
                             f"(the verified tokens are in the cache already), but request {b} has kv_len "
                             f"{int(kv_len[b])}: its earlier queries would attend to an empty KV range")
        # The keys a request's queries see: from the first query's window start to the end.
        if window_left >= 0:
            begin = (kv_len - q_len - window_left).clamp(min=0)
        else:
            begin = torch.zeros_like(kv_len)
        units = module.ctas_per_item(num_qo_heads, num_kv_heads, q_len)  # CTAs per work item
        chunk = None
        if disable_split_kv:
            chunk = 0
        elif split is not None and split > 0:
            chunk = split * page_size
        sched = schedule(begin, kv_len, units, _slots(self._device), chunk=chunk)

        if self._use_cuda_graph:
            if batch != self._fixed_batch:
                raise ValueError(f"{api}: batch size {batch} differs from the CUDA-graph buffers' "
                                 f"{self._fixed_batch}; with use_cuda_graph=True the batch size is fixed")
            nnz = int(indptr_h[-1])
            if nnz > self._indices_buf.numel():
                raise ValueError(f"{api}: {nnz} pages exceed paged_kv_indices_buffer "
                                 f"({self._indices_buf.numel()})")
            if not buffers_written:
                if self._indptr_buf.data_ptr() != indptr.data_ptr():
                    self._indptr_buf.copy_(indptr, non_blocking=non_blocking)
                if self._indices_buf.data_ptr() != indices.data_ptr():
                    self._indices_buf[:nnz].copy_(indices[:nnz], non_blocking=non_blocking)
                if self._last_page_len_buf.data_ptr() != last_page_len.data_ptr():
                    self._last_page_len_buf.copy_(last_page_len, non_blocking=non_blocking)
            indptr_d, indices_d = self._indptr_buf, self._indices_buf
            work_cap, merge_cap = self._work_capacity, self._merge_capacity
        else:
            indptr_d = _attention.device_copy(indptr, self._device, non_blocking)
            indices_d = _attention.device_copy(indices, self._device, non_blocking)
            work_cap, merge_cap = sched.request.numel(), sched.merge_request.numel()
        if sched.request.numel() > work_cap:
            raise RuntimeError(f"{api}: {sched.request.numel()} work items exceed the fixed capacity "
                               f"{work_cap} (a fixed_split_size this small does not fit a CUDA-graph plan)")
        work = self._upload_work(sched, kv_len, work_cap, merge_cap, batch, non_blocking)
        counter = self._counters(merge_cap * units)
        slots = work_cap if self._use_cuda_graph else sched.num_slots
        pad = -self._workspace.data_ptr() % 16  # the kernel reads the partials in 16-byte vectors
        rows = q_len * num_qo_heads  # a partial slot's states
        need = pad + slots * rows * (head_dim + 1) * 4
        if need > self._workspace.numel():
            raise ValueError(f"{api}: float_workspace_buffer has {self._workspace.numel()} bytes; this "
                             f"plan's split-KV partials need {need} (allocate a larger buffer, e.g. 128 MB)")
        d = head_dim
        fws = self._workspace[pad : pad + slots * rows * (d + 1) * 4].view(torch.float32)
        partial_out = fws[: slots * rows * d].view(slots, rows, d)
        partial_lse = fws[slots * rows * d:].view(slots, rows)
        # Everything run() passes that the plan owns is converted to DLPack once, here: the binding
        # borrows capsules without consuming them, so run() only converts q, the caches and out.
        sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        soft_cap = logits_soft_cap if logits_soft_cap is not None else 0.0
        owned = dict(page_indptr=indptr_d, page_indices=indices_d, kv_len=work["kv_len"],
                     work_request=work["request"], work_token_begin=work["begin"], work_token_end=work["end"],
                     work_out_index=work["out_index"], work_merge_index=work["merge_index"],
                     merge_request=work["merge_request"], merge_indptr=work["merge_indptr"],
                     merge_counter=counter)
        fixed = {k: _jit.dl(t) for k, t in owned.items()}
        fixed.update(kv_layout=self._kv_layout, partial_out=_jit.dl(partial_out),
                     partial_lse=_jit.dl(partial_lse), sm_scale=sm_scale, soft_cap=soft_cap, q_len=q_len,
                     window_left=window_left, rope_scale=rope_scale, rope_theta=rope_theta,
                     errors=_attention.error_record(self._device))
        self._plan = _Plan(
            batch=batch, q_len=q_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            page_size=page_size, window_left=window_left, soft_cap=logits_soft_cap, rope=rope,
            q_dtype=q_dtype, kv_dtype=kv_dtype, sm_scale=sm_scale, chunk=sched.chunk,
            num_items=sched.request.numel(),
            slots=slots, module=module, fixed=fixed, tensors=(*owned.values(), partial_out, partial_lse),
            validate=self._device.type == "cuda" and env.get("KILN_VALIDATE_INDICES"),
        )
        if self._use_cuda_graph:
            self._frozen_q_len = q_len

    def _counters(self, n: int) -> torch.Tensor:
        """The split-KV merge counters, at least n int32 on the device, all zero between launches."""
        buf = self._merge_counter
        if buf is None or buf.numel() < n:
            if buf is not None and self._use_cuda_graph:
                self._retired_counters.append(buf)
            buf = self._merge_counter = torch.zeros(max(n, 1), dtype=torch.int32, device=self._device)
        return buf

    def _upload_work(self, sched, kv_len, work_cap: int, merge_cap: int, batch: int,
                     non_blocking: bool) -> dict:
        """The schedule and the requests' lengths as int32 device views: the work list padded to the
        capacities (padding: request -1)."""
        host = torch.full((5 * work_cap + 2 * merge_cap + 1 + batch,), -1, dtype=torch.int32)
        n, m = sched.request.numel(), sched.merge_request.numel()
        columns = (sched.request, sched.token_begin, sched.token_end, sched.out_index, sched.merge_index)
        for k, arr in enumerate(columns):
            host[k * work_cap:k * work_cap + n] = arr
        base = 5 * work_cap
        host[base:base + m] = sched.merge_request
        indptr = host[base + merge_cap:base + 2 * merge_cap + 1]
        indptr[:m + 1] = sched.merge_indptr
        indptr[m + 1:] = sched.merge_indptr[-1]  # padded merges cover no slots
        lens = base + 2 * merge_cap + 1
        host[lens:] = kv_len
        if self._use_cuda_graph:
            dev = self._work_buf
            if self._device.type == "cuda":
                if self._copy_done is not None:
                    self._copy_done.synchronize()  # the pinned staging buffer is about to be reused
                host = host.pin_memory()
                dev.copy_(host, non_blocking=non_blocking)
                self._copy_done = torch.cuda.Event()
                self._copy_done.record()
            else:
                dev.copy_(host)
        else:
            dev = host.to(self._device, non_blocking=False)
        views = [dev[k * work_cap:(k + 1) * work_cap] for k in range(5)]
        return dict(request=views[0], begin=views[1], end=views[2], out_index=views[3], merge_index=views[4],
                    merge_request=dev[base:base + merge_cap], merge_indptr=dev[base + merge_cap:lens],
                    kv_len=dev[lens:lens + batch])

    @logged_api(mutates=("out", "lse"))
    @traced(attention_traces.BATCH_DECODE)
    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            enable_pdl=None, window_left: int | None = None, sinks=None, q_len_per_req: int | None = None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """Attention of q [batch * q_len_per_req, num_qo_heads, head_dim] over the planned paged KV
        cache: a (k_cache, v_cache) tuple or one [pages, 2, ...] tensor, in the wrapper's layout.
        q_scale / k_scale / v_scale: floats (None is 1): logits use q * q_scale and k * k_scale,
        the output v * v_scale (an fp8 cache holds k / k_scale, v / v_scale). enable_pdl: accepted
        (FlashInfer's launch option; kiln's decode launch needs no programmatic dependent launch).
        window_left: None or the planned value. q_len_per_req: deprecated (FlashInfer's), checked
        against q's rows. sinks, skip_softmax_threshold_scale_factor, kv_cache_sf (NVFP4 caches):
        not supported, None only.

        Returns out (q's shape and dtype), and lse [batch * q_len_per_req, num_qo_heads] (float32,
        base 2) too when return_lse.
        """
        p = self._plan
        if p is None:
            raise RuntimeError(f"{API}.run called before plan()")
        if args:
            raise ValueError(f"{API}.run: extra positional arguments (FlashInfer's custom-kernel arguments) "
                             "are not supported")
        if sinks is not None or skip_softmax_threshold_scale_factor is not None or kv_cache_sf is not None:
            what = ("sinks" if sinks is not None else "kv_cache_sf (NVFP4 KV caches)"
                    if kv_cache_sf is not None else "skip_softmax_threshold_scale_factor")
            raise ValueError(f"{API}.run: {what} is not supported")
        k_scale = _attention.kv_scale(k_scale, "k_scale", API + ".run")
        v_scale = _attention.kv_scale(v_scale, "v_scale", API + ".run")
        sm_scale = p.fixed["sm_scale"]
        if q_scale is not None:
            sm_scale = sm_scale * _attention.kv_scale(q_scale, "q_scale", API + ".run")
        if window_left is not None and window_left != p.window_left:
            raise ValueError(f"{API}.run: window_left={window_left} differs from plan's {p.window_left}")
        if q_len_per_req is not None:
            warnings.warn(f"{API}.run: passing q_len_per_req to run() is deprecated (FlashInfer's); pass it "
                          "to plan()", DeprecationWarning, stacklevel=3)
            if q_len_per_req != p.q_len:
                raise ValueError(f"{API}.run: q_len_per_req={q_len_per_req} but plan() used {p.q_len}; "
                                 "re-plan with the matching q_len_per_req")
        if type(paged_kv_cache) is tuple and len(paged_kv_cache) == 2:
            k_cache, v_cache = paged_kv_cache
        else:
            k_cache, v_cache = _attention.split_cache(paged_kv_cache, API + ".run")
        # Full plan/run check once per distinct (q, cache) signature; later calls compare one tuple.
        signature = (q.shape, q.dtype, q.device, k_cache.shape, k_cache.dtype)
        if signature != p.checked:
            self._check_run(p, q, k_cache)
            p.checked = signature
        if out is None:
            out = torch.empty_like(q)
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        if torch.compiler.is_compiling():
            f = p.fixed
            _decode_op.op(q, k_cache, v_cache, self._kv_layout, *p.tensors, out, lse, sm_scale, f["soft_cap"],
                          k_scale, v_scale, p.q_len, p.window_left, p.rope, f["rope_scale"], f["rope_theta"])
            return (out, lse) if return_lse else out
        inference_only(API + ".run", q, k_cache, v_cache)
        if hooks.module_observer is not None:  # API logging: the module the plan chose
            hooks.module_observer(_attention.DECODE, None, q.device, p.module)
        to_dl = _jit.dl
        fixed = p.fixed if q_scale is None else {**p.fixed, "sm_scale": sm_scale}
        p.module.decode(q=to_dl(q), k_cache=to_dl(k_cache), v_cache=to_dl(v_cache), out=to_dl(out),
                        lse=None if lse is None else to_dl(lse), k_scale=k_scale, v_scale=v_scale,
                        stream=_jit.stream_of(q.device), **fixed)
        if p.validate:
            _attention.errors.check_errors(q.device)
        return (out, lse) if return_lse else out

    def _check_run(self, p: _Plan, q: torch.Tensor, k_cache: torch.Tensor) -> None:
        if isinstance(q, torch.Tensor) and q.dim() == 3 and q.shape[0] != p.batch * p.q_len:
            raise ValueError(f"{API}.run: q has {q.shape[0]} rows; the plan's batch of {p.batch} x "
                             f"q_len_per_req {p.q_len} needs {p.batch * p.q_len} (re-plan with the matching "
                             "q_len_per_req)")
        page_size, kv_heads, head_dim = _attention.cache_geometry(k_cache, self._kv_layout, API + ".run")
        expect = {"q.shape": ([p.batch * p.q_len, p.num_qo_heads, p.head_dim], list(q.shape)),
                  "q.dtype": (p.q_dtype, q.dtype), "cache dtype": (p.kv_dtype, k_cache.dtype),
                  "page_size": (p.page_size, page_size), "num_kv_heads": (p.num_kv_heads, kv_heads),
                  "cache head_dim": (p.head_dim, head_dim), "device": (self._device, q.device)}
        wrong = [f"{k}: planned {a}, got {b}" for k, (a, b) in expect.items() if a != b]
        if wrong:
            raise ValueError(f"{API}.run does not match its plan: {'; '.join(wrong)}")

    forward = run  # FlashInfer's older name

    def run_return_lse(self, q: torch.Tensor, paged_kv_cache, *args, **kwargs):
        """run(..., return_lse=True) (FlashInfer's name)."""
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kwargs)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache, pos_encoding_mode: str = "NONE",
                           q_scale=None, k_scale=None, v_scale=None, window_left: int = -1,
                           logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated form of run_return_lse: the attention options must be the planned
        ones (kiln fixes them at plan())."""
        p = self._plan
        if p is None:
            raise RuntimeError(f"{API}.forward_return_lse called before plan()")
        given = {"pos_encoding_mode": (pos_encoding_mode, "ROPE_LLAMA" if p.rope else "NONE"),
                 "window_left": (window_left, p.window_left),
                 "logits_soft_cap": (_attention.soft_cap(logits_soft_cap, API), p.soft_cap),
                 "sm_scale": (p.sm_scale if sm_scale is None else sm_scale, p.sm_scale)}
        wrong = [f"{k}={a!r} (planned {b!r})" for k, (a, b) in given.items() if a != b]
        if wrong:
            raise ValueError(f"{API}.forward_return_lse: {', '.join(wrong)}; plan() fixes them")
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """BatchDecodeWithPagedKVCacheWrapper with use_cuda_graph=True (FlashInfer's class and
    constructor): run() reads only the fixed buffers given here, so a captured run() replays
    correctly after later plan() calls with the same batch size (len(last_page_len_buffer))."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor,
                 indices_buffer: torch.Tensor, last_page_len_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


@logged_api
def fast_decode_plan(self: BatchDecodeWithPagedKVCacheWrapper, indptr: torch.Tensor, indices: torch.Tensor,
                     last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                     page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
                     logits_soft_cap: float | None = None, q_data_type=None, kv_data_type=None,
                     data_type=None, sm_scale: float | None = None, rope_scale: float | None = None,
                     rope_theta: float | None = None, non_blocking: bool = True,
                     fixed_split_size: int | None = None, disable_split_kv: bool = False,
                     q_len_per_req: int = 1, global_override_indptr_cpu: torch.Tensor | None = None) -> None:
    """FlashInfer's faster re-plan of a planned BatchDecodeWithPagedKVCacheWrapper (engines bind it
    as `wrapper.plan = functools.partial(fast_decode_plan, wrapper)`): the same plan, with
    `global_override_indptr_cpu` (a CPU copy of indptr) read instead of indptr, and under CUDA
    graphs no copy into the page-table buffers, which the caller has filled already."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper) or self._plan is None:
        raise ValueError("fast_decode_plan needs a wrapper with a prior plan() call (it re-plans the batch "
                         "that plan() set up)")
    if data_type is None and q_data_type is None:
        q_data_type = "float16"
    self._plan_batch(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                     logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
                     data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                     non_blocking=non_blocking, fixed_split_size=fixed_split_size,
                     disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req,
                     indptr_host=global_override_indptr_cpu, buffers_written=self._use_cuda_graph)


# The launch as a torch custom op, for compiled graphs: the same binding call, its arguments as
# tensors (run() calls the binding directly in eager mode, with the plan's prebuilt capsules).
@custom_op("batch_decode", mutates=("merge_counter", "out", "lse", "partial_out", "partial_lse"))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_layout: str,
               page_indptr: torch.Tensor, page_indices: torch.Tensor, kv_len: torch.Tensor,
               work_request: torch.Tensor, work_token_begin: torch.Tensor, work_token_end: torch.Tensor,
               work_out_index: torch.Tensor, work_merge_index: torch.Tensor, merge_request: torch.Tensor,
               merge_indptr: torch.Tensor, merge_counter: torch.Tensor, partial_out: torch.Tensor,
               partial_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None, sm_scale: float,
               soft_cap: float, k_scale: float, v_scale: float, q_len: int, window_left: int, rope: bool,
               rope_scale: float, rope_theta: float) -> None:
    module = _jit.module(_attention.DECODE, q.device, API + ".run", dtype=q.dtype, kv_dtype=k_cache.dtype,
                         head_dim=q.shape[-1], soft_cap=soft_cap > 0, rope=rope)
    dl = _jit.dl
    module.decode(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), kv_layout=kv_layout,
                  page_indptr=dl(page_indptr), page_indices=dl(page_indices), kv_len=dl(kv_len),
                  work_request=dl(work_request), work_token_begin=dl(work_token_begin),
                  work_token_end=dl(work_token_end), work_out_index=dl(work_out_index),
                  work_merge_index=dl(work_merge_index), merge_request=dl(merge_request),
                  merge_indptr=dl(merge_indptr), merge_counter=dl(merge_counter), out=dl(out),
                  lse=None if lse is None else dl(lse), partial_out=dl(partial_out),
                  partial_lse=dl(partial_lse),
                  sm_scale=sm_scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale, q_len=q_len,
                  window_left=window_left, rope_scale=rope_scale, rope_theta=rope_theta,
                  errors=_attention.error_record(q.device), stream=_jit.stream_of(q.device))
    _attention.errors.after_launch(q.device)


_single_workspaces: dict[torch.device, torch.Tensor] = {}
# Planned one-request wrappers by shape and options: a repeated call costs no host scheduling and
# no host-to-device copies (and can be captured in a CUDA graph). Bounded, least recently used out.
# What they hold (and the workspace) is made on kiln's worker thread (kiln/_persistent.py): the
# first call of a shape may run in a torch.compile CUDA graph tree's warm-up, whose thread allocates
# from the graph's pool (the tree stops when that pool holds a tensor it did not return).
_single_plans: collections.OrderedDict[tuple, BatchDecodeWithPagedKVCacheWrapper] = collections.OrderedDict()
_SINGLE_PLANS_MAX = 64


def _single_decode_wrapper(q, k, kv_layout, kv_len, kv_heads, pos_encoding_mode, window_left, logits_soft_cap,
                           sm_scale, rope_scale, rope_theta) -> BatchDecodeWithPagedKVCacheWrapper:
    num_qo_heads, head_dim = q.shape
    dev = q.device
    key = (dev, kv_layout, kv_len, num_qo_heads, kv_heads, head_dim, pos_encoding_mode, window_left,
           logits_soft_cap, q.dtype, k.dtype, sm_scale, rope_scale, rope_theta)
    wrapper = _single_plans.get(key)
    if wrapper is not None:
        _single_plans.move_to_end(key)
        return wrapper
    wrapper = _persistent.outside_graph_pools(
        dev, _plan_single, dev, kv_layout, kv_len, num_qo_heads, kv_heads, head_dim, pos_encoding_mode,
        window_left, logits_soft_cap, q.dtype, k.dtype, sm_scale, rope_scale, rope_theta)
    _single_plans[key] = wrapper
    while len(_single_plans) > _SINGLE_PLANS_MAX:
        _single_plans.popitem(last=False)
    return wrapper


def _plan_single(dev, kv_layout, kv_len, num_qo_heads, kv_heads, head_dim, pos_encoding_mode, window_left,
                 logits_soft_cap, q_dtype, kv_dtype, sm_scale, rope_scale,
                 rope_theta) -> BatchDecodeWithPagedKVCacheWrapper:
    """A wrapper planned for one request whose one page is the whole cache (kv_len tokens)."""
    workspace = _single_workspaces.get(dev)
    if workspace is None:
        workspace = _single_workspaces[dev] = torch.empty(32 << 20, dtype=torch.uint8, device=dev)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout)
    wrapper.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32, device=dev),
                 torch.tensor([kv_len], dtype=torch.int32), num_qo_heads, kv_heads, head_dim, kv_len,
                 pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                 logits_soft_cap=logits_soft_cap, q_data_type=q_dtype, kv_data_type=kv_dtype,
                 sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
    return wrapper


@logged_api
@traced(attention_traces.SINGLE_DECODE)
def single_decode_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str = "NHD",
                                pos_encoding_mode: str = "NONE", use_tensor_cores: bool = False,
                                q_scale=None, k_scale=None, v_scale=None, window_left: int = -1,
                                logits_soft_cap: float | None = None, sm_scale: float | None = None,
                                rope_scale=None, rope_theta=None, return_lse: bool = False):
    """Decode attention of one request: q [num_qo_heads, head_dim] over k, v [kv_len, num_kv_heads,
    head_dim] (NHD) or [num_kv_heads, kv_len, head_dim] (HND), of q's dtype or fp8 E4M3 with the
    per-tensor k_scale / v_scale (floats; logits use q * q_scale and k * k_scale, the output
    v * v_scale). pos_encoding_mode "ROPE_LLAMA" rotates q (at position kv_len - 1) and the keys
    inside the kernel (rope_scale, rope_theta: FlashInfer's defaults 1 and 1e4), as the batch
    wrapper's plan does; use_tensor_cores is accepted and ignored. Long caches are split over the
    GPU (flash-decoding) exactly as in the batch wrapper. Returns out [num_qo_heads, head_dim] and,
    with return_lse, lse [num_qo_heads] (float32, base 2)."""
    api = "single_decode_with_kv_cache"
    _attention.check_layout(kv_layout, api)
    if q.dim() != 2 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{api}: q must be [num_qo_heads, head_dim] and k, v 3-D; got q {list(q.shape)}, "
                         f"k {list(k.shape)}, v {list(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{api}: k.shape {list(k.shape)} must equal v.shape {list(v.shape)}")
    if q_scale is not None:  # FlashInfer folds it into the softmax scale
        sm_scale = (1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale) * _attention.kv_scale(
            q_scale, "q_scale", api)
    k_scale = _attention.kv_scale(k_scale, "k_scale", api)
    v_scale = _attention.kv_scale(v_scale, "v_scale", api)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:1], dtype=torch.float32, device=q.device) if return_lse else None
    # Planning is host work on shapes; in a compiled graph the whole call is one custom op.
    run = _single_decode_op.op if torch.compiler.is_compiling() else _single_decode
    run(q, k, v, out, lse, kv_layout, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, k_scale,
        v_scale, rope_scale, rope_theta)
    return (out, lse) if return_lse else out


@custom_op("single_decode", mutates=("out", "lse"))
def _single_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor | None, kv_layout: str, pos_encoding_mode: str, window_left: int,
                      logits_soft_cap: float | None, sm_scale: float | None, k_scale: float,
                      v_scale: float, rope_scale: float | None, rope_theta: float | None) -> None:
    _single_decode(q, k, v, out, lse, kv_layout, pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                   k_scale, v_scale, rope_scale, rope_theta)


def _single_decode(q, k, v, out, lse, kv_layout, pos_encoding_mode, window_left, logits_soft_cap,
                   sm_scale, k_scale, v_scale, rope_scale, rope_theta) -> None:
    kv_len, kv_heads = (k.shape[0], k.shape[1]) if kv_layout == "NHD" else (k.shape[1], k.shape[0])
    # A plan over at least one token, so an empty cache is checked exactly like any other (an
    # unsupported dtype or head_dim, a head count that is no multiple, mismatched dtypes).
    wrapper = _single_decode_wrapper(q, k, kv_layout, max(kv_len, 1), kv_heads, pos_encoding_mode,
                                     window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta)
    if kv_len == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return
    wrapper.run(q.unsqueeze(0), (k.unsqueeze(0), v.unsqueeze(0)), out=out.unsqueeze(0),
                lse=None if lse is None else lse.unsqueeze(0), return_lse=lse is not None, k_scale=k_scale,
                v_scale=v_scale)
