"""Prefill attention (//ops:attention), FlashInfer's names and argument order:

    single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", sm_scale=None,
                                 logits_soft_cap=None, window_left=-1, return_lse=False)
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

The ragged wrapper takes k, v [total_kv, num_kv_heads, head_dim] (NHD) packed by kv_indptr; it
runs the paged kernel with one-token pages. run(k_scale=, v_scale=) scales any cache as FlashInfer
does (logits use k * k_scale, the output v * v_scale). The paged wrapper also reads an fp8 E4M3
cache (plan(kv_data_type=torch.float8_e4m3fn)): each run gathers the plan's pages into a compact
16-bit copy (E4M3 is exact in f16 and bf16) that the kernels read (_Fp8PageStaging).
plan() reads the index arrays on the host (a sync), schedules 128-query tiles longest-first, and is
reused by run() for every layer.
"""

from __future__ import annotations

import functools
import math

import torch

from kiln.runtime import env

from . import _attention, _jit
from ._ops import custom_op, inference_only
from .api_logging import logged_api
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
    a widening pass over the request's pages per call (about 5x the fp8 bytes of traffic: 1.22x
    the bf16 cache's time at 16 x 2048 causal on the H200, docs/perf/decode-fp8.md); the buffers
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
        kernel="fa2",
        kv_contiguous=False,
    ):
        if pos_encoding_mode != "NONE":
            raise ValueError(
                f"{api}.plan: pos_encoding_mode {pos_encoding_mode!r} is not supported; apply "
                "RoPE to q and k first"
            )
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
        self.module = _jit.module(_attention.PREFILL, device, api + ".plan", dtype=q_dtype,
                                  head_dim=head_dim, soft_cap=soft_cap is not None)
        qo_h, qo_len = _attention.indptr_lengths(qo_indptr, "qo_indptr", api + ".plan")
        if kv_len_h.numel() != qo_len.numel():
            raise ValueError(
                f"{api}.plan: {qo_len.numel()} requests in qo_indptr but {kv_len_h.numel()} in the "
                "KV page table"
            )
        request, q_start = schedule(qo_len, kv_len_h, causal, self.module.queries_per_item)
        self.api, self.device = api, device
        self.total_q, self.num_qo_heads, self.num_kv_heads, self.head_dim = (
            int(qo_h[-1]),
            num_qo_heads,
            num_kv_heads,
            head_dim,
        )
        self.q_dtype, self.causal, self.window_left, self.soft_cap = q_dtype, causal, window_left, soft_cap
        self.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        dev = lambda t: _attention.device_copy(t, device)  # noqa: E731 - buffers the plan owns
        self.tensors = dict(qo_indptr=dev(qo_indptr), kv_len=dev(kv_len_h), work_request=dev(request),
                            work_q_start=dev(q_start))
        self.num_items = request.numel()
        self.kernel, self.kv_contiguous = kernel, kv_contiguous
        self.fixed = {k: _jit.dl(t) for k, t in self.tensors.items()}
        self.fixed.update(sm_scale=self.sm_scale, soft_cap=self.soft_cap or 0.0, causal=causal,
                          window_left=window_left, kernel=kernel, kv_contiguous=kv_contiguous,
                          errors=_attention.error_record(device))
        self.validate = device.type == "cuda" and env.get("KILN_VALIDATE_INDICES")

    def run(self, q, k_cache, v_cache, layout, pages, out, lse, return_lse, k_scale=1.0, v_scale=1.0):
        """`pages`: the page table as tensors (kv_indptr, kv_indices) and as DLPack capsules.
        k_scale folds into sm_scale; v_scale multiplies the output (after the kernel, in place)."""
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
                           self.kv_contiguous)
            if v_scale != 1.0:
                out.mul_(v_scale)
            return (out, lse) if return_lse else out
        inference_only(self.api + ".run", q, k_cache, v_cache)
        if _jit.module_observer is not None:  # API logging: the module the plan chose
            _jit.module_observer(_attention.PREFILL, None, q.device, self.module)
        dl = _jit.dl
        self.module.prefill(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), kv_layout=layout,
                            out=dl(out), lse=None if lse is None else dl(lse),
                            stream=_jit.stream_of(q.device), **page_capsules, **fixed)
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
                causal: bool, window_left: int, kernel: str, kv_contiguous: bool) -> None:
    module = _jit.module(_attention.PREFILL, q.device, "prefill", dtype=q.dtype, head_dim=q.shape[-1],
                         soft_cap=soft_cap > 0)
    dl = _jit.dl
    module.prefill(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), kv_layout=kv_layout,
                   qo_indptr=dl(qo_indptr), kv_indptr=dl(kv_indptr), kv_indices=dl(kv_indices),
                   kv_len=dl(kv_len), work_request=dl(work_request), work_q_start=dl(work_q_start),
                   out=dl(out), lse=None if lse is None else dl(lse), sm_scale=sm_scale,
                   soft_cap=soft_cap, causal=causal, window_left=window_left, kernel=kernel,
                   kv_contiguous=kv_contiguous, errors=_attention.error_record(q.device),
                   stream=_jit.stream_of(q.device))
    _attention.errors.after_launch(q.device)


def _page_table(indptr: torch.Tensor, indices: torch.Tensor):
    """The page table as run() takes it: tensors (for a compiled graph) and capsules (eager)."""
    return (indptr, indices), {"kv_indptr": _jit.dl(indptr), "kv_indices": _jit.dl(indices)}


class _PrefillWrapper:
    """The constructor and run() checks the paged and ragged prefill wrappers share (subclasses
    set API)."""

    API = ""

    def _setup(self, float_workspace_buffer: torch.Tensor, custom_mask_buf, backend: str) -> None:
        if custom_mask_buf is not None:
            raise ValueError(f"{self.API}: custom masks are not supported")
        self._device = _attention.workspace_bytes(float_workspace_buffer, self.API).device
        self._kernel = _attention.prefill_kernel(backend, self._device, self.API)
        self._plan = None

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
        """float_workspace_buffer fixes the device; use_cuda_graph, the *_buf arguments and jit_args
        are accepted for FlashInfer compatibility (kiln's prefill needs no workspace); backend is
        "auto" (the faster kernel where measured: fa3 on compute capability 9.0, else fa2), "fa2"
        or "fa3" (9.0 only; every page size: those its TMA boxes cannot tile are gathered with
        cp.async, docs/attention.md). A custom mask is not supported."""
        self._kv_layout = _attention.check_layout(kv_layout, self.API)
        self._setup(float_workspace_buffer, custom_mask_buf, backend)

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
        non_blocking: bool = True,
    ) -> None:
        _attention.errors.poll(self._device)  # an index error of an earlier call (kiln/errors.py)
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(f"{self.API}.plan: custom masks are not supported")
        _, kv_len = _attention.paged_kv_lengths(
            paged_kv_indptr, paged_kv_last_page_len, page_size, paged_kv_indices.numel(), self.API + ".plan"
        )
        q_dtype = _attention.as_dtype(q_data_type, torch.float16)
        kv_dtype = _attention.as_dtype(kv_data_type, q_dtype)
        fp8 = kv_dtype == _attention.FP8_KV and q_dtype in (torch.float16, torch.bfloat16)
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
            self._kernel,
        )
        _attention.index_tensor(paged_kv_indices, "paged_kv_indices", self.API + ".plan")
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
        k_scale / v_scale: the cache's per-tensor scales (floats; None is 1)."""
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
        if kv_layout != "NHD":
            raise ValueError(f"{self.API}: kv_layout must be 'NHD' (k, v [total_kv, num_kv_heads, head_dim])")
        self._setup(float_workspace_buffer, custom_mask_buf, backend)

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
        non_blocking: bool = True,
    ) -> None:
        _attention.errors.poll(self._device)  # an index error of an earlier call (kiln/errors.py)
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(f"{self.API}.plan: custom masks are not supported")
        kv_h, kv_len = _attention.indptr_lengths(kv_indptr, "kv_indptr", self.API + ".plan")
        q_dtype = _attention.as_dtype(q_data_type, torch.float16)
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
            self._kernel,
            True,  # one-token pages with identity indices: consecutive rows per request
        )
        # Ragged KV = pages of one token, page b of request r at row kv_indptr[r] + b.
        self._total_kv = int(kv_h[-1])
        self._pages = _page_table(
            _attention.device_copy(kv_indptr, self._device),
            torch.arange(self._total_kv, dtype=torch.int32, device=self._device),
        )

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
        k_scale / v_scale: per-tensor scales of k and v (floats; None is 1)."""
        k_scale, v_scale = self._check_run(args, q_scale, k_scale, v_scale)
        expect = [self._total_kv, self._plan.num_kv_heads, self._plan.head_dim]
        if k.dim() != 3 or list(k.shape) != expect or k.shape != v.shape:
            raise ValueError(
                f"{self.API}.run does not match its plan: k {list(k.shape)}, v {list(v.shape)}; "
                f"planned {expect}"
            )
        k, v = k.unsqueeze(1), v.unsqueeze(1)
        return self._plan.run(q, k, v, "NHD", self._pages, out, lse, return_lse, k_scale, v_scale)

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
    kernel,
):
    """The plan of a one-request prefill and its one-page table, kept per shape: a repeated call
    costs no host scheduling and no host-to-device copies."""
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
        kernel,
        True,  # one page holds the request's keys
    )
    pages = _page_table(
        torch.tensor([0, 1], dtype=torch.int32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device),
    )
    return plan, pages


@logged_api
@traced(attention_traces.SINGLE_PREFILL)
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    return_lse: bool = False,
    backend: str = "auto",
):
    """Prefill of one request: q [qo_len, num_qo_heads, head_dim] over k, v [kv_len, num_kv_heads,
    head_dim] (NHD) or [num_kv_heads, kv_len, head_dim] (HND). Returns out (and lse). backend:
    "auto" (the faster kernel where measured: fa3 on compute capability 9.0, else fa2), "fa2" or
    "fa3" (9.0 only)."""
    api = "single_prefill_with_kv_cache"
    layout = _attention.check_layout(kv_layout, api)
    if backend not in _attention.PREFILL_BACKENDS:
        _attention.prefill_kernel(backend, q.device, api)  # the error naming the allowed values
    if custom_mask is not None or packed_custom_mask is not None:
        raise ValueError(f"{api}: custom masks are not supported")
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"{api}: q must be [qo_len, heads, head_dim] and k, v equal 3-D tensors; got q "
            f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    # Planning is host work on shapes; in a compiled graph the whole call is one custom op.
    run = _single_prefill_op.op if torch.compiler.is_compiling() else _single_prefill
    run(q, k, v, out, lse, causal, layout, sm_scale, window_left, logits_soft_cap, pos_encoding_mode, backend)
    return (out, lse) if return_lse else out


@custom_op("single_prefill", mutates=("out", "lse"))
def _single_prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor | None, causal: bool, kv_layout: str, sm_scale: float | None,
                       window_left: int, logits_soft_cap: float | None, pos_encoding_mode: str,
                       backend: str) -> None:
    _single_prefill(q, k, v, out, lse, causal, kv_layout, sm_scale, window_left, logits_soft_cap,
                    pos_encoding_mode, backend)


def _single_prefill(q, k, v, out, lse, causal, kv_layout, sm_scale, window_left, logits_soft_cap,
                    pos_encoding_mode, backend) -> None:
    kernel = _attention.prefill_kernel(backend, q.device, "single_prefill_with_kv_cache")
    kv_len, kv_heads = (k.shape[0], k.shape[1]) if kv_layout == "NHD" else (k.shape[1], k.shape[0])
    plan, pages = _single_plan(q.shape[0], kv_len, q.shape[1], kv_heads, q.shape[2], causal, sm_scale,
                               window_left, logits_soft_cap, q.dtype, k.dtype, q.device, pos_encoding_mode,
                               kernel)
    if kv_len == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return
    plan.run(q, k.unsqueeze(0), v.unsqueeze(0), kv_layout, pages, out, lse, lse is not None)
