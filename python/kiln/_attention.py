"""Shared pieces of the attention APIs (//ops/attention, one target per op): the targets'
labels, paged KV caches, kv_layout names and the prefill kernel choice."""

from __future__ import annotations

import functools
import math

import torch

from kiln.runtime import env

from . import errors, utils

DECODE = "//ops/attention:decode"
PREFILL = "//ops/attention:prefill"
CASCADE = "//ops/attention:cascade"
PAGE = "//ops/attention:page"
POSITIONS = "//ops/attention:positions"
LAYOUTS = ("NHD", "HND")  # the bindings take these names
# The smallest float_workspace_buffer the wrappers accept: decode's split-KV partials need up to
# SMs x 2 slots x heads x (head_dim + 1) x 4 bytes (17 MB at 64 heads x 128 on 132 SMs; each plan
# checks its own need), FlashInfer's 128 MB covers every plan.
MIN_WORKSPACE_BYTES = 1 << 20
_INDEX_DTYPES = (torch.int32, torch.int64)


def workspace_bytes(buffer, api: str) -> torch.Tensor:
    """The wrapper's float_workspace_buffer as a flat uint8 view, after checking it is a buffer of
    bytes: uint8, or int8 as FlashInfer's tests and several engines allocate it."""
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"{api}: float_workspace_buffer must be a torch.Tensor, got {type(buffer).__name__}")
    if buffer.dtype not in (torch.uint8, torch.int8):
        raise TypeError(f"{api}: float_workspace_buffer must be a torch.uint8 or torch.int8 tensor (e.g. "
                        f"torch.empty(128 << 20, dtype=torch.uint8, device=...)), got {buffer.dtype}")
    if not buffer.is_contiguous():
        raise ValueError(f"{api}: float_workspace_buffer must be contiguous")
    if buffer.numel() < MIN_WORKSPACE_BYTES:
        raise ValueError(f"{api}: float_workspace_buffer has {buffer.numel()} bytes; kiln needs at least "
                         f"{MIN_WORKSPACE_BYTES} (1 MiB; 128 MB serves every plan)")
    return buffer.view(-1).view(torch.uint8)


def soft_cap(value, api: str) -> float | None:
    """logits_soft_cap: None or 0 for none (FlashInfer's convention), else finite and > 0."""
    if value is None or value == 0:
        return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{api}: logits_soft_cap must be None, 0 (no soft-cap) or a finite value > 0, "
                         f"got {value!r}")
    return float(value)


def check_window(window_left, api: str) -> int:
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"{api}: window_left must be -1 (no window) or an int >= 0, got {window_left!r}")
    return window_left


def check_sm_scale(sm_scale, api: str) -> None:
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale)
                                     and sm_scale > 0):
        raise ValueError(f"{api}: sm_scale must be None (1/sqrt(head_dim)) or finite and > 0, "
                         f"got {sm_scale!r}")


def index_tensor(t, name: str, api: str) -> torch.Tensor:
    """A 1-D int32/int64 tensor (an index array), or a TypeError/ValueError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{api}: {name} must be an int32 tensor (int64 is accepted), got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{api}: {name} must be 1-D, got shape {list(t.shape)}")
    return t


def device_copy(t: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
    """An int32 copy of `t` on `device` that the plan owns: a caller's later change to `t` cannot
    reach the kernels through it."""
    return t.to(device=device, dtype=torch.int32, non_blocking=non_blocking, copy=True)


def error_record(device: torch.device) -> int:
    """The address of the device's index-error record for a launch (kiln/errors.py)."""
    return errors.record_address(device)


FP8_KV = torch.float8_e4m3fn  # the fp8 cache dtype (E4M3 "fn"), with per-tensor k_scale / v_scale


def kv_cache_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype, api: str) -> torch.dtype:
    """The cache dtype for queries of q_dtype: the same 16-bit dtype, or fp8 E4M3."""
    if kv_dtype not in (q_dtype, FP8_KV):
        raise TypeError(f"{api}: a KV cache of {kv_dtype} is not supported with {q_dtype} queries; the cache "
                        f"is {q_dtype} or torch.float8_e4m3fn (fp8 E4M3, with k_scale / v_scale)")
    return kv_dtype


def kv_scale(value, name: str, api: str) -> float:
    """k_scale / v_scale as a float: None is 1; a number or a one-element CPU tensor, finite and > 0.
    (A CUDA tensor is refused: reading it would synchronise every call.)"""
    if value is None:
        return 1.0
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.numel() != 1:
            raise TypeError(f"{api}: {name} must be a float (or a one-element CPU tensor), got a tensor "
                            f"of shape {list(value.shape)} on {value.device}")
        value = float(value)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{api}: {name} must be a finite number > 0 (the cache's per-tensor scale), "
                         f"got {value!r}")
    return float(value)


def check_layout(kv_layout: str, api: str) -> str:
    if kv_layout not in LAYOUTS:
        raise ValueError(f"{api}: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout


PREFILL_BACKENDS = ("auto", "fa2", "fa3")


@functools.lru_cache(maxsize=16)
def _is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and utils.compute_capability(device) == (9, 0)


def prefill_kernel(backend: str, device: torch.device, api: str, variant: str | None = None) -> str:
    """The prefill binding's kernel for FlashInfer's backend names: "fa2" the mma.sync kernel (every
    family), "fa3" the sm90a kernel (wgmma + TMA, compute capability 9.0 only; its module is always
    built as 9.0a: BUILD.py declares sm90a), "auto" the faster of the two where measured: fa3 on
    compute capability 9.0 (faster at every shape of benchmarks/prefill_backends.py:
    docs/perf/prefill.md), fa2 elsewhere. Calls the fa3 kernel
    cannot tile (page sizes, strides) run fa2: docs/attention.md. `variant` names what only fa2
    computes (a custom mask, RoPE or ALiBi inside the kernel, as FlashInfer's fa3 has none): "auto"
    then runs fa2 and "fa3" is an error."""
    if backend not in PREFILL_BACKENDS:
        raise ValueError(f"{api}: backend must be one of 'auto', 'fa2', 'fa3', got {backend!r}")
    if variant is not None:
        if backend == "fa3":
            raise ValueError(f"{api}: backend='fa3' has no {variant} (nor has FlashInfer's fa3); use "
                             "backend='fa2' or 'auto', which runs fa2 for it")
        return "fa2"
    if backend == "fa3" and not _is_sm90(device):
        if device.type == "cuda":
            major, minor = utils.compute_capability(device)
            what = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
        else:
            what = "the CPU (host backend)"
        families = ", ".join(str(f) for f in utils.target_arch_families(PREFILL))
        raise ValueError(
            f"{api}: backend='fa3' needs a compute capability 9.0 GPU (family sm90a: H100, H200), "
            f"but {device} is {what}; {PREFILL} families: {families}; use backend='fa2' or 'auto'"
        )
    if backend == "fa3" or (backend == "auto" and _is_sm90(device)):
        return "fa3_strict" if env.get("KILN_PREFILL_FA3_STRICT") else "fa3"  # strict: no fallback
    return "fa2"


def indptr_lengths(indptr: torch.Tensor, name: str, api: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr, lengths) on the host as int64 for an indptr of B + 1 entries that starts at 0 and
    does not decrease; a ValueError naming the argument otherwise."""
    indptr_h = index_tensor(indptr, name, api).to("cpu", torch.int64)
    lengths = indptr_h[1:] - indptr_h[:-1]
    if indptr_h.numel() < 1 or indptr_h[0] != 0 or bool((lengths < 0).any()):
        raise ValueError(f"{api}: {name} must start at 0 and be non-decreasing")
    return indptr_h, lengths


def split_cache(paged_kv_cache, api: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache) from a tuple, or from one [pages, 2, ...] tensor."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"{api}: paged_kv_cache must be (k_cache, v_cache), got {len(paged_kv_cache)} items"
            )
        return paged_kv_cache[0], paged_kv_cache[1]
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                f"{api}: a single paged_kv_cache tensor must be [max_num_pages, 2, ...] "
                f"(5-D), got shape {list(paged_kv_cache.shape)}"
            )
        return paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    raise TypeError(
        f"{api}: paged_kv_cache must be a (k_cache, v_cache) tuple or a tensor, got "
        f"{type(paged_kv_cache).__name__}"
    )


def as_dtype(value, default: torch.dtype | None) -> torch.dtype | None:
    """A torch dtype from a dtype or its name ("bfloat16"), or `default` for None."""
    if value is None:
        return default
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)
    raise TypeError(f"not a dtype: {value!r}")


def paged_kv_lengths(
    indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int, num_indices: int, api: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr, kv_len) of a page table on the host (int64), after checking it: B + 1 and B
    entries, indptr from 0 and non-decreasing within the indices, last_page_len in
    [1, page_size] for requests with pages. Reads the tensors on the host (a sync for GPU ones)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"{api}: page_size must be a positive int, got {page_size!r}")
    indptr_h = index_tensor(indptr, "indptr", api).to("cpu", torch.int64)
    last_h = index_tensor(last_page_len, "last_page_len", api).to("cpu", torch.int64)
    batch = indptr_h.numel() - 1
    if batch < 0 or last_h.numel() != batch:
        raise ValueError(
            f"{api}: indptr has {indptr_h.numel()} entries and last_page_len {last_h.numel()}; a "
            "batch of B requests needs B + 1 and B"
        )
    pages = indptr_h[1:] - indptr_h[:-1]
    if batch and (indptr_h[0] != 0 or bool((pages < 0).any())):
        raise ValueError(f"{api}: indptr must start at 0 and be non-decreasing")
    if int(indptr_h[-1]) > num_indices:
        raise ValueError(
            f"{api}: indptr[-1] = {int(indptr_h[-1])} but indices has only {num_indices} entries"
        )
    bad = (pages > 0) & ((last_h < 1) | (last_h > page_size))
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise ValueError(
            f"{api}: last_page_len[{b}] = {int(last_h[b])} is outside [1, page_size={page_size}] "
            "for a request with pages"
        )
    return indptr_h, torch.where(pages > 0, (pages - 1) * page_size + last_h, torch.zeros_like(pages))


def cache_geometry(k_cache: torch.Tensor, kv_layout: str, api: str) -> tuple[int, int, int]:
    """(page_size, num_kv_heads, head_dim) of a 4-D cache in `kv_layout`."""
    if k_cache.dim() != 4:
        raise ValueError(
            f"{api}: k_cache must be 4-D [pages, page_size, kv_heads, head_dim] (NHD) or "
            f"[pages, kv_heads, page_size, head_dim] (HND), got shape {list(k_cache.shape)}"
        )
    if kv_layout == "NHD":
        return k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    return k_cache.shape[2], k_cache.shape[1], k_cache.shape[3]
