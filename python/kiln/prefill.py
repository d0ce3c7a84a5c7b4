"""Prefill attention (//ops:attention), FlashInfer's names and argument order:

    single_prefill_with_kv_cache(q, k, v, ..., custom_mask=None, packed_custom_mask=None,
                                 causal=False, kv_layout="NHD", pos_encoding_mode="NONE", ...,
                                 sm_scale=None, window_left=-1, logits_soft_cap=None,
                                 rope_scale=None, rope_theta=None, backend="auto",
                                 return_lse=False, kv_cache_sf=None, k_scale=None, v_scale=None)
    BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD").plan(qo_indptr,
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
        head_dim_qk, page_size, causal=False, ...).run(q, paged_kv_cache)
    BatchPrefillWithRaggedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD").plan(qo_indptr,
        kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=False, ...).run(q, k, v)

Queries of all requests are packed: request b's are rows qo_indptr[b]:qo_indptr[b+1] of
q [total_q, num_qo_heads, head_dim]. Query i of a request with qo_len queries and kv_len keys sits
at key position i + kv_len - qo_len: with causal=True it sees keys j <= i + kv_len - qo_len (the
mask aligned to the end, so a prompt continuing a cached prefix attends to all of it), and with
window_left >= 0 only keys j >= i + kv_len - qo_len - window_left. Logits are q.k * sm_scale
(default 1/sqrt(head_dim)), soft-capped as cap * tanh(logit / cap) when logits_soft_cap > 0;
lse = log2(sum exp(logits)) (base 2). A query that sees no key gets out = 0, lse = -inf.

Variants (FlashInfer's): a custom mask (custom_mask booleans or packed_custom_mask bits, and the
multi-item scoring arguments prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
max_item_len_ptr of the paged and ragged plans; kiln/_prefill_mask.py has the layouts) replaces
causal (the window still applies); pos_encoding_mode="ROPE_LLAMA" rotates q (query i at position
i + kv_len - qo_len) and k (key j at j) inside the kernel, rope_scale and rope_theta as in
kiln.apply_rope; "ALIBI" adds slope(h) * (j - i) to the logits. Each runs the fa2 kernel (a module
of its own, compiled on first use); backend="auto" picks it, "fa3" refuses them.

The ragged wrapper takes k, v [total_kv, num_kv_heads, head_dim] (NHD) packed by kv_indptr; it
runs the paged kernel with one-token pages. run(k_scale=, v_scale=) scales any cache as FlashInfer
does (logits use k * k_scale, the output v * v_scale). The paged wrapper also reads an fp8 E4M3
cache (plan(kv_data_type=torch.float8_e4m3fn)): each run gathers the plan's pages into a compact
16-bit copy (E4M3 is exact in f16 and bf16) that the kernels read (_Fp8PageStaging).
plan() reads the index arrays on the host (a sync), schedules 128-query tiles longest-first, and is
reused by run() for every layer. With use_cuda_graph=True (FlashInfer's fixed buffers) every
tensor run() reads keeps its address across plans, so a captured run() replays later plans of the
same batch size (_GraphBuffers).

single_prefill_with_kv_cache also reads an NVFP4 cache (k, v uint8 [.., head_dim / 2] of packed
E2M1 pairs, low nibble first, with kv_cache_sf=(k_sf, v_sf) E4M3 scales per 16 values, linear
layout): it dequantises them into q's dtype (exactly: an E2M1 value times an E4M3 scale has at
most 6 significant bits) and runs the 16-bit kernels on that copy, k_scale and v_scale applied as
for any cache.
"""

from __future__ import annotations

import functools
import math

import torch

from kiln.runtime import env

from . import _attention, _jit, _persistent
from . import _prefill_mask as masks
from ._ops import custom_op, inference_only
from .api_logging import logged_api
from .diagnostics import hooks
from .trace import attention as attention_traces
from .trace import traced


def schedule(qo_len: torch.Tensor, kv_len: torch.Tensor, causal: bool, queries_per_item: int):
    """Work items (request, first query) of `queries_per_item` queries (the kernels' tile: the
    module's queries_per_item), the most work first (the keys an item's last query sees), so long
    causal tiles of skewed batches start first."""
    tiles = (qo_len + queries_per_item - 1) // queries_per_item
    request = torch.repeat_interleave(torch.arange(qo_len.numel()), tiles)
    first = torch.cumsum(tiles, 0) - tiles
    q_start = (torch.arange(request.numel()) - first[request]) * queries_per_item
    if causal:
        last = torch.minimum(q_start + queries_per_item, qo_len[request]) - 1
        work = torch.clamp(
            torch.minimum(kv_len[request], last + kv_len[request] - qo_len[request] + 1), min=0
        )
    else:
        work = kv_len[request]
    order = torch.sort(work, descending=True, stable=True).indices
    return request[order].to(torch.int32), q_start[order].to(torch.int32)


class _Fp8PageStaging:
    """Prefill over an fp8 E4M3 cache: the plan's pages gathered, in page-table order, into a
    compact cache of the query's 16-bit dtype that the prefill kernels read, with the identity
    page table. E4M3 values are exact in f16 and bf16, so the staged cache holds the fp8 values
    themselves; k_scale folds into sm_scale and v_scale multiplies the output. Costs a gather and
    a widening pass over the request's pages per call (about 5x the fp8 bytes of traffic; its
    measured cost against a bf16 cache: docs/perf/decode-fp8.md); the buffers
    are the plan's, reused by every layer's run. The
    page ids are checked on the host against each cache before the gather reads through them."""

    def __init__(self, indices: torch.Tensor, dtype: torch.dtype, api: str):
        self.indices = indices  # the plan's device copy of the page ids, in page-table order
        self.host_ids = indices.to("cpu", torch.int64)  # plan time: it syncs anyway
        self.lo = int(self.host_ids.min()) if self.host_ids.numel() else 0
        self.hi = int(self.host_ids.max()) if self.host_ids.numel() else -1
        self.dtype, self.api = dtype, api
        self.pages = torch.arange(indices.numel(), dtype=torch.int32, device=indices.device)
        self._buffers: tuple | None = None

    def _check(self, num_pages: int) -> None:
        if self.lo < 0 or self.hi >= num_pages:
            bad = int(torch.nonzero((self.host_ids < 0) | (self.host_ids >= num_pages))[0])
            raise IndexError(f"{self.api}.run: paged_kv_indices[{bad}] = {int(self.host_ids[bad])} is not "
                             f"a page of the cache (valid page ids: [0, {num_pages}))")

    def stage(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(k_cache.shape[0])
        shape = (self.indices.numel(), *k_cache.shape[1:])
        if self._buffers is None or self._buffers[0].shape != shape:
            dev = k_cache.device
            raw = [torch.empty(shape, dtype=torch.uint8, device=dev) for _ in range(2)]
            wide = [torch.empty(shape, dtype=self.dtype, device=dev) for _ in range(2)]
            self._buffers = (*raw, *wide)
        raw_k, raw_v, k16, v16 = self._buffers
        torch.index_select(k_cache.view(torch.uint8), 0, self.indices, out=raw_k)  # a byte gather
        torch.index_select(v_cache.view(torch.uint8), 0, self.indices, out=raw_v)
        k16.copy_(raw_k.view(_attention.FP8_KV))
        v16.copy_(raw_v.view(_attention.FP8_KV))
        return k16, v16


POS_ENCODINGS = {"NONE": "none", "ROPE_LLAMA": "rope", "ALIBI": "alibi"}  # -> the BUILD axis


def pos_encoding_axis(pos_encoding_mode, api: str) -> str:
    """FlashInfer's pos_encoding_mode as the prefill target's pos_encoding axis value."""
    axis = POS_ENCODINGS.get(pos_encoding_mode) if isinstance(pos_encoding_mode, str) else None
    if axis is None:
        raise ValueError(f"{api}: pos_encoding_mode must be one of 'NONE', 'ROPE_LLAMA', 'ALIBI', got "
                         f"{pos_encoding_mode!r}")
    return axis


def rope_params(rope_scale, rope_theta, api: str) -> tuple[float, float]:
    """(rope_scale, rope_theta) with FlashInfer's defaults (1, 1e4) for None; finite and > 0."""
    out = []
    for name, value, default in (("rope_scale", rope_scale, 1.0), ("rope_theta", rope_theta, 1e4)):
        value = default if value is None else value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{api}: {name} must be None or a finite number > 0, got {value!r}")
        out.append(float(value))
    return out[0], out[1]


def variant_name(mask, pos_encoding: str) -> str | None:
    """What only the fa2 kernel computes (the reason backend='fa3' is refused), or None."""
    parts = (["custom mask"] if mask else []) + ({"rope": ["RoPE (ROPE_LLAMA)"],
                                                   "alibi": ["ALiBi"]}.get(pos_encoding, []))
    return " and ".join(parts) or None


def check_output_dtype(o_data_type, q_dtype: torch.dtype, api: str) -> None:
    o_dtype = _attention.as_dtype(o_data_type, q_dtype)
    if o_dtype != q_dtype:
        raise ValueError(f"{api}: o_data_type {o_dtype} must be None or q's dtype {q_dtype} (kiln writes the "
                         "output in the query's dtype)")


def _graph_buffer(buf, name: str, api: str, device: torch.device, size: int | None = None,
                  dtype=torch.int32) -> torch.Tensor:
    """A caller's fixed buffer of use_cuda_graph=True: a contiguous 1-D tensor of `dtype` on the
    wrapper's device (with `size` entries where given)."""
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"{api}: {name} should be a torch.Tensor in CUDA graph mode (use_cuda_graph=True)")
    if buf.dim() != 1 or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
        raise ValueError(f"{api}: {name} must be a contiguous 1-D {dtype} tensor on {device}, got "
                         f"{buf.dtype} of shape {list(buf.shape)} on {buf.device}")
    if size is not None and buf.numel() != size:
        raise ValueError(f"{api}: {name} has {buf.numel()} entries; the batch size fixed by qo_indptr_buf "
                         f"needs {size}")
    return buf


class _GraphBuffers:
    """use_cuda_graph=True: every tensor a run() reads stays at one address, so a captured run()
    replays correctly after later plans. The batch size is fixed (len(qo_indptr_buf) - 1) and the
    first plan fixes the rest: the query rows (later plans may have fewer), the work list's capacity
    (padded entries do nothing) and the launch's arguments (causal, window, scales, the kernel and
    its variant), which a replay repeats, so a later plan must keep them."""

    def __init__(self, api: str, device: torch.device, qo_indptr_buf):
        self.api, self.device = api, device
        self.qo_indptr = _graph_buffer(qo_indptr_buf, "qo_indptr_buf", api, device)
        self.batch = self.qo_indptr.numel() - 1
        self.signature = None
        self.rows = self.capacity = 0
        self.kv_len = torch.zeros(max(self.batch, 0), dtype=torch.int32, device=device)
        self.work_request = self.work_q_start = None

    def check_batch(self, batch: int, what: str) -> None:
        if batch != self.batch:
            raise ValueError(f"{self.api}.plan: {what} has {batch} requests; with use_cuda_graph=True the "
                             f"batch size is fixed by qo_indptr_buf at {self.batch}")

    def fill(self, signature, qo_indptr, kv_len_h, request, q_start, queries_per_item) -> dict:
        """Copy the plan's host arrays into the fixed buffers (the work list padded to capacity)
        after the last checks; the first plan's signature is kept."""
        api = self.api + ".plan"
        self.check_batch(kv_len_h.numel(), "the plan")
        rows = int(qo_indptr[-1])
        if self.work_request is None:  # the first plan: room for any batch of at most its rows
            self.rows = rows
            self.capacity = -(-rows // queries_per_item) + self.batch
            self.work_request = torch.full((self.capacity,), -1, dtype=torch.int32, device=self.device)
            self.work_q_start = torch.zeros(self.capacity, dtype=torch.int32, device=self.device)
        elif rows > self.rows:
            raise ValueError(f"{api}: qo_indptr covers {rows} query rows; in CUDA graph mode a plan has at "
                             f"most the first plan's {self.rows}")
        self.signature = signature
        pad = self.capacity - request.numel()
        self.qo_indptr.copy_(qo_indptr.to(torch.int32))
        self.kv_len.copy_(kv_len_h.to(torch.int32))
        self.work_request.copy_(torch.cat([request, torch.full((pad,), -1, dtype=torch.int32)]))
        self.work_q_start.copy_(torch.cat([q_start, torch.zeros(pad, dtype=torch.int32)]))
        return dict(qo_indptr=self.qo_indptr, kv_len=self.kv_len, work_request=self.work_request,
                    work_q_start=self.work_q_start)

    def check_signature(self, plan) -> tuple:
        """A later plan launches what the first did (a captured run repeats its arguments); the
        plan's launch, which fill() then records."""
        signature = (plan.module, plan.causal, plan.window_left, plan.sm_scale, plan.soft_cap, plan.kernel,
                     plan.kv_contiguous, plan.rope, plan.num_qo_heads, plan.num_kv_heads, plan.head_dim)
        if self.signature is not None and signature != self.signature:
            raise ValueError(f"{self.api}.plan: with use_cuda_graph=True every plan keeps the first plan's "
                             "heads, head_dim, dtype, causal, window_left, sm_scale, logits_soft_cap, custom "
                             "mask and pos_encoding_mode: a captured run() replays the first plan's launch")
        return signature

    def fits(self, buf, count: int, name: str) -> None:
        if count > buf.numel():
            raise ValueError(f"{self.api}.plan: {name} holds {buf.numel()} entries, the plan needs {count}")

    def into(self, buf, src: torch.Tensor, name: str) -> torch.Tensor:
        """src copied into the front of the caller's buffer `buf` (the whole buffer returned)."""
        self.fits(buf, src.numel(), name)
        buf[: src.numel()].copy_(src.to(buf.dtype))
        return buf


class _PrefillPlan:
    def __init__(
        self,
        api,
        qo_indptr,
        kv_len_h,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        causal,
        sm_scale,
        window_left,
        logits_soft_cap,
        q_dtype,
        kv_dtype,
        device,
        pos_encoding_mode,
        head_dim_vo,
        backend="fa2",
        kv_contiguous=False,
        custom_mask=False,
        rope=(1.0, 1e4),
        multi_item=False,
        graph=None,
    ):
        """custom_mask: whether run() gets a mask (a masks.PrefillMask); multi_item: the mask is
        multi-item scoring's, which includes the causal mask (so causal tiles are skipped); graph:
        the wrapper's _GraphBuffers (use_cuda_graph=True), which hold the plan's arrays."""
        pos_encoding = pos_encoding_axis(pos_encoding_mode, api + ".plan")
        if head_dim_vo is not None and head_dim_vo != head_dim:
            raise ValueError(f"{api}.plan: head_dim_vo {head_dim_vo} must equal head_dim_qk {head_dim}")
        for name, value in (
            ("num_qo_heads", num_qo_heads),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{api}.plan: {name} must be a positive int, got {value!r}")
        if num_qo_heads % num_kv_heads:
            raise ValueError(
                f"{api}.plan: num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                f"({num_kv_heads})"
            )
        if kv_dtype != q_dtype:
            raise ValueError(f"{api}.plan: kv_data_type {kv_dtype} must equal q_data_type {q_dtype} (an fp8 "
                             "E4M3 cache: BatchPrefillWithPagedKVCacheWrapper)")
        soft_cap = _attention.soft_cap(logits_soft_cap, api + ".plan")
        _attention.check_window(window_left, api + ".plan")
        _attention.check_sm_scale(sm_scale, api + ".plan")
        variant = variant_name(custom_mask, pos_encoding)
        kernel = _attention.prefill_kernel(backend, device, api + ".plan", variant)
        self.module = _jit.module(_attention.PREFILL, device, api + ".plan", dtype=q_dtype, head_dim=head_dim,
                                  soft_cap=soft_cap is not None, custom_mask=bool(custom_mask),
                                  pos_encoding=pos_encoding)
        qo_h, qo_len = _attention.indptr_lengths(qo_indptr, "qo_indptr", api + ".plan")
        if kv_len_h.numel() != qo_len.numel():
            raise ValueError(
                f"{api}.plan: {qo_len.numel()} requests in qo_indptr but {kv_len_h.numel()} in the "
                "KV page table"
            )
        # A custom mask replaces causal (FlashInfer's rule); multi-item scoring's mask holds it.
        kernel_causal = multi_item if custom_mask else causal
        request, q_start = schedule(qo_len, kv_len_h, kernel_causal, self.module.queries_per_item)
        self.api, self.device = api, device
        self.qo_len, self.kv_len = qo_len, kv_len_h  # host int64, per request (the mask's block sizes)
        self.total_q, self.num_qo_heads, self.num_kv_heads, self.head_dim = (
            int(qo_h[-1]),
            num_qo_heads,
            num_kv_heads,
            head_dim,
        )
        self.q_dtype, self.causal, self.window_left = q_dtype, kernel_causal, window_left
        self.soft_cap = soft_cap
        self.custom_mask, self.pos_encoding, self.rope = bool(custom_mask), pos_encoding, rope
        self.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        self.kernel, self.kv_contiguous = kernel, kv_contiguous
        if graph is None:
            dev = lambda t: _attention.device_copy(t, device)  # noqa: E731 - buffers the plan owns
            self.tensors = dict(qo_indptr=dev(qo_indptr), kv_len=dev(kv_len_h), work_request=dev(request),
                                work_q_start=dev(q_start))
        else:  # checked before anything is copied into the buffers a captured run reads
            signature = graph.check_signature(self)
            self.tensors = graph.fill(signature, qo_h, kv_len_h, request, q_start,
                                      self.module.queries_per_item)
        self.num_items = request.numel()
        self.fixed = {k: _jit.dl(t) for k, t in self.tensors.items()}
        self.fixed.update(sm_scale=self.sm_scale, soft_cap=self.soft_cap or 0.0, causal=kernel_causal,
                          window_left=window_left, kernel=kernel, kv_contiguous=kv_contiguous,
                          rope_scale=rope[0], rope_theta=rope[1], errors=_attention.error_record(device))
        self.mask: masks.PrefillMask | None = None  # the wrappers' plan() sets it
        self.validate = device.type == "cuda" and env.get("KILN_VALIDATE_INDICES")

    def run(self, q, k_cache, v_cache, layout, pages, out, lse, return_lse, k_scale=1.0, v_scale=1.0,
            mask=None):
        """`pages`: the page table as tensors (kv_indptr, kv_indices) and as DLPack capsules.
        k_scale folds into sm_scale; v_scale multiplies the output (after the kernel, in place).
        `mask` (a masks.PrefillMask): the call's custom mask, else the plan's."""
        if (
            list(q.shape) != [self.total_q, self.num_qo_heads, self.head_dim]
            or q.dtype != self.q_dtype
            or q.device != self.device
        ):
            raise ValueError(
                f"{self.api}.run does not match its plan: q is {list(q.shape)} {q.dtype} on "
                f"{q.device}, planned [{self.total_q}, {self.num_qo_heads}, {self.head_dim}] "
                f"{self.q_dtype} on {self.device}"
            )
        mask = self.mask if mask is None else mask
        if self.custom_mask != (mask is not None):
            raise RuntimeError(f"{self.api}: a plan with a custom mask runs with one (a kiln bug)")
        if out is None:
            out = torch.empty_like(q)
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        (kv_indptr, kv_indices), page_capsules = pages
        fixed = self.fixed if k_scale == 1.0 else {**self.fixed, "sm_scale": self.sm_scale * k_scale}
        if torch.compiler.is_compiling():
            t = self.tensors
            _prefill_op.op(q, k_cache, v_cache, layout, t["qo_indptr"], kv_indptr, kv_indices, t["kv_len"],
                           t["work_request"], t["work_q_start"], out, lse, fixed["sm_scale"],
                           self.soft_cap or 0.0, self.causal, self.window_left, self.kernel,
                           self.kv_contiguous, None if mask is None else mask.packed,
                           None if mask is None else mask.indptr, self.pos_encoding, *self.rope)
            if v_scale != 1.0:
                out.mul_(v_scale)
            return (out, lse) if return_lse else out
        inference_only(self.api + ".run", q, k_cache, v_cache)
        if hooks.module_observer is not None:  # API logging: the module the plan chose
            hooks.module_observer(_attention.PREFILL, None, q.device, self.module)
        dl = _jit.dl
        self.module.prefill(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), kv_layout=layout,
                            out=dl(out), lse=None if lse is None else dl(lse),
                            stream=_jit.stream_of(q.device), **page_capsules, **fixed,
                            **({} if mask is None else mask.capsules()))
        if self.validate:
            _attention.errors.check_errors(q.device)
        if v_scale != 1.0:
            out.mul_(v_scale)
        return (out, lse) if return_lse else out


# The launch as a torch custom op, for compiled graphs (run() calls the binding directly in eager
# mode, with the plan's prebuilt capsules).
@custom_op("batch_prefill", mutates=("out", "lse"))
def _prefill_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_layout: str,
                qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                kv_len: torch.Tensor, work_request: torch.Tensor, work_q_start: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor | None, sm_scale: float, soft_cap: float,
                causal: bool, window_left: int, kernel: str, kv_contiguous: bool,
                custom_mask: torch.Tensor | None, mask_indptr: torch.Tensor | None, pos_encoding: str,
                rope_scale: float, rope_theta: float) -> None:
    module = _jit.module(_attention.PREFILL, q.device, "prefill", dtype=q.dtype, head_dim=q.shape[-1],
                         soft_cap=soft_cap > 0, custom_mask=custom_mask is not None,
                         pos_encoding=pos_encoding)
    dl = _jit.dl
    module.prefill(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), kv_layout=kv_layout,
                   qo_indptr=dl(qo_indptr), kv_indptr=dl(kv_indptr), kv_indices=dl(kv_indices),
                   kv_len=dl(kv_len), work_request=dl(work_request), work_q_start=dl(work_q_start),
                   out=dl(out), lse=None if lse is None else dl(lse), sm_scale=sm_scale,
                   soft_cap=soft_cap, causal=causal, window_left=window_left, kernel=kernel,
                   kv_contiguous=kv_contiguous, custom_mask=None if custom_mask is None else dl(custom_mask),
                   mask_indptr=None if mask_indptr is None else dl(mask_indptr), rope_scale=rope_scale,
                   rope_theta=rope_theta, errors=_attention.error_record(q.device),
                   stream=_jit.stream_of(q.device))
    _attention.errors.after_launch(q.device)


def _page_table(indptr: torch.Tensor, indices: torch.Tensor):
    """The page table as run() takes it: tensors (for a compiled graph) and capsules (eager)."""
    return (indptr, indices), {"kv_indptr": _jit.dl(indptr), "kv_indices": _jit.dl(indices)}


def _multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr):
    """The multi-item scoring arguments as masks.resolve takes them (None: not multi-item)."""
    if prefix_len_ptr is None:
        return None
    return prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr


class _PrefillWrapper:
    """The constructor and run() checks the paged and ragged prefill wrappers share (subclasses
    set API)."""

    API = ""

    def _setup(self, float_workspace_buffer: torch.Tensor, backend: str, use_cuda_graph: bool, qo_indptr_buf,
               custom_mask_buf, mask_indptr_buf) -> None:
        self._device = _attention.workspace_bytes(float_workspace_buffer, self.API).device
        _attention.prefill_kernel(backend, self._device, self.API)  # the backend name's checks, now
        self._backend = backend
        self._plan = None
        self._graph = _GraphBuffers(self.API, self._device, qo_indptr_buf) if use_cuda_graph else None
        self._mask_bufs = (custom_mask_buf, mask_indptr_buf)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._graph is not None

    def _mask_buffers(self):
        """CUDA graph mode: (custom_mask_buf as uint8, mask_indptr_buf), checked."""
        bits_buf, indptr_buf = self._mask_bufs
        for buf, name in ((bits_buf, "custom_mask_buf"), (indptr_buf, "mask_indptr_buf")):
            if not isinstance(buf, torch.Tensor):
                raise ValueError(f"{self.API}.plan: {name} must be initialized with a torch.Tensor in cuda "
                                 "graph mode if we use custom mask in attention computation.")
        if bits_buf.dtype == torch.int8:
            bits_buf = bits_buf.view(torch.uint8)
        return (_graph_buffer(bits_buf, "custom_mask_buf", self.API, self._device, dtype=torch.uint8),
                _graph_buffer(indptr_buf, "mask_indptr_buf", self.API, self._device, self._graph.batch + 1))

    def _check_mask_room(self, mask) -> None:
        if self._graph is not None and mask is not None:
            self._graph.fits(self._mask_buffers()[0], mask.packed.numel(), "custom_mask_buf")

    def _place_mask(self, mask):
        """CUDA graph mode: the plan's mask copied into custom_mask_buf / mask_indptr_buf."""
        if self._graph is None or mask is None:
            return mask
        bits_buf, indptr_buf = self._mask_buffers()
        return masks.PrefillMask(self._graph.into(bits_buf, mask.packed, "custom_mask_buf"),
                                 self._graph.into(indptr_buf, mask.indptr, "mask_indptr_buf"))

    def _plan_common(self, qo_indptr, kv_len, custom_mask, packed_custom_mask, multi_item, pos_encoding_mode,
                     rope_scale, rope_theta, o_data_type, q_dtype):
        """(mask or None, rope, multi_item flag): the checks and the mask both plans make."""
        api = self.API + ".plan"
        check_output_dtype(o_data_type, q_dtype, api)
        rope = rope_params(rope_scale, rope_theta, api)
        _, qo_len = _attention.indptr_lengths(qo_indptr, "qo_indptr", api)
        if qo_len.numel() != kv_len.numel():
            raise ValueError(f"{api}: {qo_len.numel()} requests in qo_indptr but {kv_len.numel()} in the KV "
                             "page table")
        mask = masks.resolve(api, qo_len, kv_len, self._device, custom_mask, packed_custom_mask, multi_item)
        return mask, rope

    def _check_run(self, args, q_scale, k_scale, v_scale) -> tuple[float, float]:
        """(k_scale, v_scale) as floats, after the checks every run() makes."""
        if self._plan is None:
            raise RuntimeError(f"{self.API}.run called before plan()")
        if args or q_scale is not None:
            raise ValueError(f"{self.API}.run: q_scale and extra positional arguments (fp8 queries) are not "
                             "supported: queries are float16 or bfloat16")
        return (_attention.kv_scale(k_scale, "k_scale", self.API + ".run"),
                _attention.kv_scale(v_scale, "v_scale", self.API + ".run"))


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill over paged KV caches (the layout of BatchDecodeWithPagedKVCacheWrapper)."""

    API = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend: str = "auto",
        jit_args=None,
    ) -> None:
        """float_workspace_buffer fixes the device (kiln's prefill needs no workspace); jit_args is
        accepted for FlashInfer compatibility. use_cuda_graph=True (FlashInfer's CUDA graph mode):
        plan() copies the page table into qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf
        and paged_kv_last_page_len_buf (int32 device tensors, required; a custom mask into
        custom_mask_buf, uint8, and mask_indptr_buf) and its schedule into fixed buffers, so a
        captured run() replays correctly after later plans of the same batch size (_GraphBuffers
        says what else the first plan fixes). backend is "auto" (the faster kernel where measured:
        fa3 on compute capability 9.0, else fa2; fa2 for a custom mask, RoPE or ALiBi), "fa2" or
        "fa3" (9.0 only; every page size: those its TMA boxes cannot tile are gathered with
        cp.async, docs/attention.md; no custom mask, RoPE or ALiBi)."""
        self._kv_layout = _attention.check_layout(kv_layout, self.API)
        self._setup(float_workspace_buffer, backend, use_cuda_graph, qo_indptr_buf, custom_mask_buf,
                    mask_indptr_buf)
        if use_cuda_graph:
            batch = self._graph.batch
            self._page_bufs = (
                _graph_buffer(paged_kv_indptr_buf, "paged_kv_indptr_buf", self.API, self._device, batch + 1),
                _graph_buffer(paged_kv_indices_buf, "paged_kv_indices_buf", self.API, self._device),
                _graph_buffer(paged_kv_last_page_len_buf, "paged_kv_last_page_len_buf", self.API,
                              self._device, batch),
            )

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask=None,
        packed_custom_mask=None,
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
        o_data_type=None,
        non_blocking: bool = True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr=None,
    ) -> None:
        """FlashInfer's plan. custom_mask: booleans, each request's [qo_len, kv_len] block flattened
        in turn (sum(qo_len * kv_len) elements, True = attend), or packed_custom_mask: the bits of
        FlashInfer's segment_packbits(..., bitorder="little"), each request from a byte of its own;
        either replaces causal. prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len and
        max_item_len_ptr: FlashInfer's multi-item scoring (its mask, causal included, is built here;
        max_item_len_ptr is checked, not needed). pos_encoding_mode "ROPE_LLAMA" (rope_scale,
        rope_theta: default 1, 1e4) or "ALIBI" runs inside the kernel. use_fp16_qk_reduction and
        non_blocking are accepted and change nothing (kiln reduces in float32; plan syncs anyway);
        o_data_type must be None or q_data_type."""
        _attention.errors.poll(self._device)  # an index error of an earlier call (kiln/errors.py)
        _, kv_len = _attention.paged_kv_lengths(
            paged_kv_indptr, paged_kv_last_page_len, page_size, paged_kv_indices.numel(), self.API + ".plan"
        )
        q_dtype = _attention.as_dtype(q_data_type, torch.float16)
        kv_dtype = _attention.as_dtype(kv_data_type, q_dtype)
        fp8 = kv_dtype == _attention.FP8_KV and q_dtype in (torch.float16, torch.bfloat16)
        multi_item = _multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                                 max_item_len_ptr)
        mask, rope = self._plan_common(qo_indptr, kv_len, custom_mask, packed_custom_mask, multi_item,
                                       pos_encoding_mode, rope_scale, rope_theta, o_data_type, q_dtype)
        if self._graph is not None:  # every size checked before a fixed buffer changes
            if fp8:
                raise ValueError(f"{self.API}.plan: use_cuda_graph=True with an fp8 cache is not supported "
                                 "(each run stages the cache into buffers of the plan)")
            if page_size != getattr(self, "_page_size", page_size):
                raise ValueError(f"{self.API}.plan: with use_cuda_graph=True page_size stays the first "
                                 f"plan's ({self._page_size}), got {page_size}")
            self._graph.check_batch(paged_kv_last_page_len.numel(), "paged_kv_last_page_len")
            self._graph.fits(self._page_bufs[1], paged_kv_indices.numel(), "paged_kv_indices_buf")
            self._check_mask_room(mask)
        self._plan = _PrefillPlan(
            self.API,
            qo_indptr,
            kv_len,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            causal,
            sm_scale,
            window_left,
            logits_soft_cap,
            q_dtype,
            q_dtype if fp8 else kv_dtype,  # the kernels read the staged 16-bit copy of an fp8 cache
            self._device,
            pos_encoding_mode,
            head_dim_vo,
            self._backend,
            custom_mask=mask is not None,
            rope=rope,
            multi_item=multi_item is not None,
            graph=self._graph,
        )
        self._plan.mask = self._place_mask(mask)
        _attention.index_tensor(paged_kv_indices, "paged_kv_indices", self.API + ".plan")
        if self._graph is not None:
            g, (indptr_buf, indices_buf, last_buf) = self._graph, self._page_bufs
            indptr_d = g.into(indptr_buf, paged_kv_indptr, "paged_kv_indptr_buf")
            indices_d = g.into(indices_buf, paged_kv_indices, "paged_kv_indices_buf")
            g.into(last_buf, paged_kv_last_page_len, "paged_kv_last_page_len_buf")
        else:
            indptr_d = _attention.device_copy(paged_kv_indptr, self._device)
            indices_d = _attention.device_copy(paged_kv_indices, self._device)
        nnz = int(paged_kv_indptr[-1])
        self._fp8 = _Fp8PageStaging(indices_d[:nnz], q_dtype, self.API) if fp8 else None
        self._pages = _page_table(indptr_d, self._fp8.pages if fp8 else indices_d)
        self._page_size = page_size

    @logged_api(mutates=("out", "lse"))
    @traced(attention_traces.BATCH_PREFILL)
    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl=None,
        window_left: int | None = None,
    ):
        """out [total_q, num_qo_heads, head_dim] (and lse [total_q, num_qo_heads] with return_lse).
        k_scale / v_scale: the cache's per-tensor scales (floats; None is 1). enable_pdl is accepted
        (the prefill kernels do not use programmatic dependent launch)."""
        k_scale, v_scale = self._check_run(args, q_scale, k_scale, v_scale)
        if window_left is not None and window_left != self._plan.window_left:
            raise ValueError(
                f"{self.API}.run: window_left={window_left} differs from plan's {self._plan.window_left}"
            )
        k_cache, v_cache = _attention.split_cache(paged_kv_cache, self.API + ".run")
        page_size, kv_heads, head_dim = _attention.cache_geometry(k_cache, self._kv_layout, self.API + ".run")
        if (page_size, kv_heads, head_dim) != (self._page_size, self._plan.num_kv_heads, self._plan.head_dim):
            raise ValueError(
                f"{self.API}.run does not match its plan: cache has page_size {page_size}, "
                f"{kv_heads} kv heads, head_dim {head_dim}; planned {self._page_size}, "
                f"{self._plan.num_kv_heads}, {self._plan.head_dim}"
            )
        if self._fp8 is not None:
            if k_cache.dtype != _attention.FP8_KV or v_cache.dtype != _attention.FP8_KV:
                raise ValueError(f"{self.API}.run does not match its plan: the cache is {k_cache.dtype}, "
                                 "planned torch.float8_e4m3fn")
            k_cache, v_cache = self._fp8.stage(k_cache, v_cache)
        layout, scales = self._kv_layout, (k_scale, v_scale)
        return self._plan.run(q, k_cache, v_cache, layout, self._pages, out, lse, return_lse, *scales)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward = run


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill where each request's keys and values are contiguous rows of k, v."""

    API = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf=None,
        kv_indptr_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend: str = "auto",
        jit_args=None,
    ) -> None:
        """As BatchPrefillWithPagedKVCacheWrapper's; k, v are [total_kv, num_kv_heads, head_dim]
        (kv_layout "NHD"); in CUDA graph mode qo_indptr_buf and kv_indptr_buf are required, and the
        first plan's total_kv bounds the later ones'."""
        if kv_layout != "NHD":
            raise ValueError(f"{self.API}: kv_layout must be 'NHD' (k, v [total_kv, num_kv_heads, head_dim])")
        self._setup(float_workspace_buffer, backend, use_cuda_graph, qo_indptr_buf, custom_mask_buf,
                    mask_indptr_buf)
        if use_cuda_graph:
            self._kv_indptr_buf = _graph_buffer(kv_indptr_buf, "kv_indptr_buf", self.API, self._device,
                                                self._graph.batch + 1)
            self._rows = None  # the identity page table of the first plan's total_kv rows

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask=None,
        packed_custom_mask=None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking: bool = True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr=None,
    ) -> None:
        """As BatchPrefillWithPagedKVCacheWrapper.plan, with request b's keys rows
        kv_indptr[b]:kv_indptr[b + 1] of k and v."""
        _attention.errors.poll(self._device)  # an index error of an earlier call (kiln/errors.py)
        kv_h, kv_len = _attention.indptr_lengths(kv_indptr, "kv_indptr", self.API + ".plan")
        q_dtype = _attention.as_dtype(q_data_type, torch.float16)
        multi_item = _multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                                 max_item_len_ptr)
        mask, rope = self._plan_common(qo_indptr, kv_len, custom_mask, packed_custom_mask, multi_item,
                                       pos_encoding_mode, rope_scale, rope_theta, o_data_type, q_dtype)
        if self._graph is not None:  # every size checked before a fixed buffer changes
            self._check_mask_room(mask)
            if self._rows is not None and int(kv_h[-1]) > self._rows.numel():
                raise ValueError(f"{self.API}.plan: kv_indptr covers {int(kv_h[-1])} rows; in CUDA graph "
                                 f"mode a plan has at most the first plan's {self._rows.numel()}")
        self._plan = _PrefillPlan(
            self.API,
            qo_indptr,
            kv_len,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            causal,
            sm_scale,
            window_left,
            logits_soft_cap,
            q_dtype,
            _attention.as_dtype(kv_data_type, q_dtype),
            self._device,
            pos_encoding_mode,
            head_dim_vo,
            self._backend,
            True,  # one-token pages with identity indices: consecutive rows per request
            custom_mask=mask is not None,
            rope=rope,
            multi_item=multi_item is not None,
            graph=self._graph,
        )
        self._plan.mask = self._place_mask(mask)
        # Ragged KV = pages of one token, page b of request r at row kv_indptr[r] + b.
        self._total_kv = int(kv_h[-1])
        if self._graph is None:
            self._pages = _page_table(
                _attention.device_copy(kv_indptr, self._device),
                torch.arange(self._total_kv, dtype=torch.int32, device=self._device),
            )
            return
        if self._rows is None:
            self._rows = torch.arange(self._total_kv, dtype=torch.int32, device=self._device)
        indptr_d = self._graph.into(self._kv_indptr_buf, kv_indptr, "kv_indptr_buf")
        self._pages = _page_table(indptr_d, self._rows)

    @logged_api(mutates=("out", "lse"))
    @traced(attention_traces.BATCH_PREFILL_RAGGED)
    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl=None,
    ):
        """out [total_q, num_qo_heads, head_dim] (and lse [total_q, num_qo_heads] with return_lse).
        k_scale / v_scale: per-tensor scales of k and v (floats; None is 1). enable_pdl is accepted
        (the prefill kernels do not use programmatic dependent launch)."""
        k_scale, v_scale = self._check_run(args, q_scale, k_scale, v_scale)
        expect = [self._total_kv, self._plan.num_kv_heads, self._plan.head_dim]
        if k.dim() != 3 or list(k.shape) != expect or k.shape != v.shape:
            raise ValueError(
                f"{self.API}.run does not match its plan: k {list(k.shape)}, v {list(v.shape)}; "
                f"planned {expect}"
            )
        k, v = k.unsqueeze(1), v.unsqueeze(1)
        return self._plan.run(q, k, v, "NHD", self._pages, out, lse, return_lse, k_scale, v_scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward = run


@functools.lru_cache(maxsize=64)
def _single_plan(
    qo_len,
    kv_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    causal,
    sm_scale,
    window_left,
    logits_soft_cap,
    q_dtype,
    kv_dtype,
    device,
    pos_encoding_mode,
    backend,
    custom_mask,
    rope,
):
    """The plan of a one-request prefill and its one-page table, kept per shape: a repeated call
    costs no host scheduling and no host-to-device copies. With a custom mask, the mask's indptr
    (the request's one byte range) too. Made on kiln's worker thread (kiln/_persistent.py): the
    first call of a shape may run in a torch.compile CUDA graph tree's warm-up, whose thread
    allocates from the graph's pool."""

    def build():
        plan = _PrefillPlan(
            "single_prefill_with_kv_cache",
            torch.tensor([0, qo_len]),
            torch.tensor([kv_len]),
            num_qo_heads,
            num_kv_heads,
            head_dim,
            causal,
            sm_scale,
            window_left,
            logits_soft_cap,
            q_dtype,
            kv_dtype,
            device,
            pos_encoding_mode,
            None,
            backend,
            True,  # one page holds the request's keys
            custom_mask=custom_mask,
            rope=rope,
        )
        pages = _page_table(
            torch.tensor([0, 1], dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
        )
        mask_indptr = None
        if custom_mask:
            mask_indptr = masks.byte_indptr(torch.tensor([qo_len]), torch.tensor([kv_len]))
            mask_indptr = mask_indptr.to(device, torch.int32)
        return plan, pages, mask_indptr

    return _persistent.outside_graph_pools(device, build)


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def nvfp4_dequantize(packed: torch.Tensor, sf: torch.Tensor, dtype: torch.dtype, name: str,
                     api: str) -> torch.Tensor:
    """An NVFP4 tensor (uint8 [..., d / 2]: E2M1 pairs, element 2i in the low nibble of byte i)
    with its E4M3 scales (sf [..., d / 16], one per 16 values, as float8_e4m3fn or its uint8 bits)
    as `dtype` [..., d]: E2M1 value times scale, exact in float16 and bfloat16."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"{api}: with kv_cache_sf, {name} must be uint8 (packed NVFP4 pairs), got "
                        f"{packed.dtype}")
    if sf.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError(f"{api}: {name}'s scales (kv_cache_sf) must be float8_e4m3fn (or its uint8 bits), "
                        f"got {sf.dtype}")
    d = 2 * packed.shape[-1]
    if d % 16 or list(sf.shape) != [*packed.shape[:-1], d // 16] or sf.device != packed.device:
        lead = ", ".join(map(str, packed.shape[:-1]))
        raise ValueError(f"{api}: {name}'s scales must be [{lead}, {d // 16}] (one per 16 of its {d} values) "
                         f"on {packed.device}, got {list(sf.shape)} on {sf.device}")
    table = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).reshape(*packed.shape[:-1], d // 16, 16)
    scales = sf.view(torch.float8_e4m3fn).float().unsqueeze(-1)
    return (table[codes.long()] * scales).reshape(*packed.shape[:-1], d).to(dtype)


@logged_api
@traced(attention_traces.SINGLE_PREFILL)
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q=None,
    scale_k=None,
    scale_v=None,
    o_dtype=None,
    custom_mask=None,
    packed_custom_mask=None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    rope_scale=None,
    rope_theta=None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf=None,
    k_scale=None,
    v_scale=None,
):
    """Prefill of one request: q [qo_len, num_qo_heads, head_dim] over k, v [kv_len, num_kv_heads,
    head_dim] (NHD) or [num_kv_heads, kv_len, head_dim] (HND). Returns out (and lse). backend:
    "auto" (the faster kernel where measured: fa3 on compute capability 9.0, else fa2; fa2 for a
    custom mask, RoPE or ALiBi), "fa2" or "fa3" (9.0 only; none of those variants).

    custom_mask: booleans [qo_len, kv_len] (any shape of that many elements; True = attend), or
    packed_custom_mask: FlashInfer's packbits(custom_mask.flatten(), bitorder="little"); either
    replaces causal. pos_encoding_mode "ROPE_LLAMA" (rope_scale, rope_theta) or "ALIBI" runs inside
    the kernel. k_scale / v_scale: the cache's per-tensor scales (floats; None is 1). kv_cache_sf
    = (k_sf, v_sf): k, v are NVFP4 (module docstring). scale_q, scale_k, scale_v (FlashInfer's fp8
    query scales) must be None: q is float16 or bfloat16; o_dtype must be None or q's dtype;
    use_fp16_qk_reduction is accepted and changes nothing."""
    api = "single_prefill_with_kv_cache"
    layout = _attention.check_layout(kv_layout, api)
    if backend not in _attention.PREFILL_BACKENDS:
        _attention.prefill_kernel(backend, q.device, api)  # the error naming the allowed values
    if scale_q is not None or scale_k is not None or scale_v is not None:
        raise ValueError(f"{api}: scale_q, scale_k and scale_v are FlashInfer's per-head fp8 query scales; "
                         "kiln's q is float16 or bfloat16 (per-tensor cache scales: k_scale, v_scale)")
    if o_dtype is not None and o_dtype != q.dtype:
        raise ValueError(f"{api}: o_dtype {o_dtype} must be None or q's dtype {q.dtype}")
    pos_encoding = pos_encoding_axis(pos_encoding_mode, api)
    rope = rope_params(rope_scale, rope_theta, api)
    if kv_cache_sf is not None:
        if not isinstance(kv_cache_sf, (tuple, list)) or len(kv_cache_sf) != 2:
            raise ValueError(f"{api}: kv_cache_sf must be a (k_scales, v_scales) pair")
        k = nvfp4_dequantize(k, kv_cache_sf[0], q.dtype, "k", api)
        v = nvfp4_dequantize(v, kv_cache_sf[1], q.dtype, "v", api)
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"{api}: q must be [qo_len, heads, head_dim] and k, v equal 3-D tensors; got q "
            f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    k_scale = _attention.kv_scale(k_scale, "k_scale", api)
    v_scale = _attention.kv_scale(v_scale, "v_scale", api)
    kv_len = k.shape[0] if layout == "NHD" else k.shape[1]
    packed = None
    if custom_mask is not None or packed_custom_mask is not None:
        qo_t, kv_t = torch.tensor([q.shape[0]]), torch.tensor([kv_len])
        if packed_custom_mask is not None:
            packed = masks.check_packed(packed_custom_mask, int(masks.byte_indptr(qo_t, kv_t)[-1]), api)
        else:
            packed = masks.pack(custom_mask, qo_t, kv_t, api)
        packed = packed.to(q.device)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    # Planning is host work on shapes; in a compiled graph the whole call is one custom op.
    run = _single_prefill_op.op if torch.compiler.is_compiling() else _single_prefill
    run(q, k, v, out, lse, packed, causal, layout, sm_scale, window_left, logits_soft_cap, pos_encoding,
        rope[0], rope[1], backend, k_scale, v_scale)
    return (out, lse) if return_lse else out


@custom_op("single_prefill", mutates=("out", "lse"))
def _single_prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor | None, packed_custom_mask: torch.Tensor | None, causal: bool,
                       kv_layout: str, sm_scale: float | None, window_left: int,
                       logits_soft_cap: float | None, pos_encoding: str, rope_scale: float, rope_theta: float,
                       backend: str, k_scale: float, v_scale: float) -> None:
    _single_prefill(q, k, v, out, lse, packed_custom_mask, causal, kv_layout, sm_scale, window_left,
                    logits_soft_cap, pos_encoding, rope_scale, rope_theta, backend, k_scale, v_scale)


def _single_prefill(q, k, v, out, lse, packed, causal, kv_layout, sm_scale, window_left, logits_soft_cap,
                    pos_encoding, rope_scale, rope_theta, backend, k_scale, v_scale) -> None:
    kv_len, kv_heads = (k.shape[0], k.shape[1]) if kv_layout == "NHD" else (k.shape[1], k.shape[0])
    mode = {v: k for k, v in POS_ENCODINGS.items()}[pos_encoding]
    plan, pages, mask_indptr = _single_plan(q.shape[0], kv_len, q.shape[1], kv_heads, q.shape[2], causal,
                                            sm_scale, window_left, logits_soft_cap, q.dtype, k.dtype,
                                            q.device, mode, backend, packed is not None,
                                            (rope_scale, rope_theta))
    if kv_len == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return
    mask = None if packed is None else masks.PrefillMask(packed, mask_indptr)
    plan.run(q, k.unsqueeze(0), v.unsqueeze(0), kv_layout, pages, out, lse, lse is not None, k_scale, v_scale,
             mask)
