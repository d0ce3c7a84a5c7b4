"""GEMM (//ops/gemm:mm, :fp8, :grouped, :fp8_grouped) with FlashInfer's and torch's names and argument order:

    mm_bf16(a, b, bias=None, pdl=False, out=None, out_dtype=None, backend="cudnn")
                                                                          out = a @ b (+ bias)
    bmm_bf16(A, B, out=None, out_dtype=None, backend="cudnn")             out[i] = A[i] @ B[i]
    bmm_fp8(A, B, A_scale, B_scale, dtype, out=None, backend="cublas")    out[i] = A_scale B_scale A[i] @ B[i]
    gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode=None, mma_sm=1,
                          scale_granularity_mnk=(1, 128, 128), out=None, out_dtype=None, backend="cutlass")
    gemm_fp8_nt_blockscaled(a, b, a_scale, b_scale, scale_major_mode="MN", mma_sm=1, out=None,
                          out_dtype=None)                                 both operands per 128 x 128 block
    SegmentGEMMWrapper(float_workspace_buffer, backend="auto").run(x, weights, batch_size,
                          weight_column_major, out=None, seg_lens=None, seg_indptr=None, weight_indices=None)
    grouped_mm(a, b, offs, bias=None, out_dtype=None, out=None, backend="auto")
                                                                          torch._grouped_mm, 2-D x 3-D
    group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, scale_granularity_mnk=(1, 128, 128),
                          scale_major_mode="MN", mma_sm=1, out=None, out_dtype=None, backend="trtllm",
                          segment_alignment=1)                            grouped fp8, MoE experts

Every M, N, K works (odd sizes, unaligned views: the fallback kernel); accumulation is float32.
docs/gemm.md has the shapes, layouts, what each refuses and why, the kernels and the autotuner.

Each launch is a torch custom op (kiln::mm, kiln::gemm_fp8, kiln::grouped_gemm,
kiln::group_gemm_fp8) with a fake
implementation, so torch.compile(fullgraph=True) traces through and CUDA graphs capture it; in
eager mode the launcher is called directly. The tactic (kernel and tile) of each call comes from
kiln.autotune when it tuned one, else from the default heuristic (ops/gemm/gemm_tactics.cc);
blocklisted tactics never run (kiln/autotuner.py). CPU tensors run the host backend.

Backends. Every backend name FlashInfer 0.7.2 has for an API is accepted and runs kiln's kernels of
that API's target (the default heuristic or kiln.autotune picks the kernel per call; docs/gemm.md
has the table); a call FlashInfer refuses for a backend name (CUTLASS with a bias, cuTile with
MN-major scales, ...) is refused here with FlashInfer's reason, and a name FlashInfer does not have
is a ValueError listing the accepted ones. The APIs FlashInfer decorates with @backend_requirement
answer is_compute_capability_supported(cc) / is_backend_supported(backend, cc) from kiln's build
graph (kiln/_support.py). mm_bf16's pdl=True launches with programmatic dependent launch on sm90+.

grouped_mm also has a Triton kernel (ops/gemm/grouped_triton.py, the triton toolchain, launched
through the CUDA driver: kiln::grouped_gemm_triton), chosen with backend="triton"; backend="auto"
keeps the CUDA backend until measurements say otherwise (docs/perf/gemm-triton.md).
"""

from __future__ import annotations

import operator

import torch

from kiln.runtime import env

from . import _jit, autotuner, errors
from ._ops import custom_op
from ._support import backend_requirement, check_backend
from .api_logging import logged_api
from .diagnostics import hooks
from .trace import gemm as gemm_traces
from .trace import traced
from .utils import use_pdl

MM = "//ops/gemm:mm"
FP8 = "//ops/gemm:fp8"
GROUPED = "//ops/gemm:grouped"
FP8_GROUPED = "//ops/gemm:fp8_grouped"
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_16BIT = (torch.bfloat16, torch.float16)
_INDEX = (torch.int32, torch.int64)
SCALE_GRANULARITY = (1, 128, 128)  # the one groupwise granularity kiln's kernels implement
BLOCK_GRANULARITY = (128, 128, 128)  # gemm_fp8_nt_blockscaled: a's scales expanded per row
# FlashInfer 0.7.2's backend names of each API (its @backend_requirement tables, "auto" apart).
# Every name runs kiln's kernels of the API's target: the tactic comes from the default heuristic
# or kiln.autotune, whatever the name (docs/gemm.md, "Backends").
MM_BF16_BACKENDS = ("cudnn", "cutlass", "tgv", "cublaslt", "tinygemm", "cutile", "cute-dsl")
BMM_BF16_BACKENDS = ("cutlass", "cudnn", "cutile", "tgv", "cake")
BMM_FP8_BACKENDS = ("cudnn", "cublas", "cutlass", "cute-dsl")
GEMM_FP8_NT_GROUPWISE_BACKENDS = ("cutlass", "trtllm", "cutile")
GROUP_GEMM_FP8_BACKENDS = ("trtllm", "cutile")  # FlashInfer declares no backend choices for it
SEGMENT_GEMM_BACKENDS = ("auto", "sm80", "sm90")
_MM_ACCEPTED = (*MM_BF16_BACKENDS, "auto")
_BMM_ACCEPTED = (*BMM_BF16_BACKENDS, "auto")
_FP8_ACCEPTED = (*BMM_FP8_BACKENDS, "auto")
_SHORT = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


def _tensor(api: str, name: str, t, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{api}: {name} must be {ndim}-D, got shape {list(t.shape)}")
    return t


def _same_device(api: str, ref_name: str, ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(
                f"{api}: {name} is on {t.device} but {ref_name} is on {ref.device}; all tensors of "
                "a call must be on one device"
            )


def _k_matches(api: str, b_name: str, b_dim: int, a_name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    k = a.shape[-1]
    if b.shape[b_dim] != k:
        raise ValueError(
            f"{api}: {b_name}.shape[{b_dim}] must equal {a_name}.shape[-1] (k = {k}), got "
            f"{b.shape[b_dim]} ({a_name} {list(a.shape)}, {b_name} {list(b.shape)})"
        )


def _out(api: str, out, shape: tuple[int, ...], dtype: torch.dtype, ref: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=ref.device)
    _tensor(api, "out", out)
    if out.dtype != dtype:
        raise TypeError(f"{api}: out.dtype must be {dtype} (the output dtype asked for), got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{api}: out must have shape {list(shape)}, got {list(out.shape)}")
    _same_device(api, "the inputs", ref, out=out)
    return out


def _dense_out_dtype(api: str, a: torch.Tensor, out, out_dtype) -> torch.dtype:
    dtype = out_dtype if out_dtype is not None else (out.dtype if isinstance(out, torch.Tensor) else a.dtype)
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(
            f"{api}: the output dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype}"
        )
    return dtype


def _backend_refuses(api: str, backend: str, why: str) -> ValueError:
    return ValueError(
        f"{api}: FlashInfer's {backend!r} backend {why}; kiln keeps its contract (pass "
        "another backend name: every one runs kiln's kernels)"
    )


# FlashInfer's refusals, per backend name, of mm_bf16 calls (its @backend_requirement checkers):
# (bias given, pdl, output dtype) -> why, or None. kiln's kernels could run these calls; a program
# written for FlashInfer never makes them, and the names keep their meaning.
def _mm_refusal(backend: str, bias, pdl: bool, dtype: torch.dtype) -> str | None:
    if backend == "cutlass" and (bias is not None or pdl):
        return "takes no bias and no pdl (FlashInfer: use the TGV backend)"
    if backend == "cublaslt" and pdl:
        return "does not support PDL"
    if backend == "cublaslt" and bias is not None and dtype != torch.bfloat16:
        return "fuses a bias only with a bfloat16 output"
    if backend == "cutile" and bias is not None:
        return "ignores `bias`; pass bias=None"
    if backend == "cutile" and pdl:
        return "ignores `pdl`; pass pdl=False"
    if backend in ("tgv", "tinygemm", "cute-dsl") and dtype != torch.bfloat16:
        return f"writes a bfloat16 output only, got {dtype}"
    return None


def _layout(t: torch.Tensor) -> str:
    return "kmajor" if t.stride(-2) == 1 else "nmajor"


def _launch_tuned(mod, op: str, fn: str, shape, device: torch.device, args: dict, **launch) -> None:
    """One call of binding `fn` through the autotuner (its tactic list from `fn`_tactics, with the
    same arguments): the tuned tactic for (op, shape()), else the default. `launch`: the further
    keywords of the launch alone (errors)."""
    run, tactics = getattr(mod, fn), getattr(mod, fn + "_tactics")
    launch["stream"] = _jit.stream_of(device)
    autotuner.launch(
        mod,
        op,
        shape,
        device,
        lambda t, strict, blocked: run(**args, tactic=t, strict=strict, blocked=blocked, **launch),
        lambda: tactics(**args),
    )


# --- dense 16-bit: mm_bf16, bmm_bf16 --------------------------------------------------------------


@custom_op("mm", mutates=("out",))
def _mm_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, pdl: bool) -> None:
    """pdl: launch with programmatic dependent launch (resolved by the API: kiln.utils.use_pdl)."""
    device = a.device
    mod = _jit.module(MM, device, "kiln.mm_bf16", dtype=a.dtype, names={"dtype": "a.dtype"})
    dl = _jit.dl
    args = {"a": dl(a), "b": dl(b), "out": dl(out)}

    def shape():
        batch = a.shape[0] if a.dim() == 3 else 1
        return (
            f"m{autotuner.bucket(a.shape[-2])} batch{autotuner.bucket(batch)} n{b.shape[-1]} k{a.shape[-1]} "
            f"{_SHORT[a.dtype]} b:{_layout(b)} out:{_SHORT[out.dtype]}"
        )

    _launch_tuned(mod, "mm", "mm", shape, device, args, pdl=pdl)


def _dense(api: str, a, b, a_name: str, b_name: str, ndim: int) -> None:
    _tensor(api, a_name, a, ndim)
    _tensor(api, b_name, b, ndim)
    if a.dtype not in _16BIT:
        raise TypeError(
            f"{api}: {a_name}.dtype {a.dtype} is not supported; supported dtypes: bfloat16, float16 "
            "(fp8: bmm_fp8, gemm_fp8_nt_groupwise)"
        )
    if b.dtype != a.dtype:
        raise TypeError(f"{api}: {b_name}.dtype must be {a_name}'s ({a.dtype}), got {b.dtype}")
    _same_device(api, a_name, a, **{b_name: b})
    if ndim == 3 and b.shape[0] != a.shape[0]:
        raise ValueError(
            f"{api}: {b_name}.shape[0] must equal {a_name}.shape[0] (the batch, {a.shape[0]}), got "
            f"{b.shape[0]}"
        )
    _k_matches(api, b_name, ndim - 2, a_name, a, b)


def _bias(api: str, bias, a: torch.Tensor, n: int) -> torch.Tensor:
    _tensor(api, "bias", bias, 1)
    if bias.dtype != a.dtype:
        raise TypeError(f"{api}: bias.dtype must be a's ({a.dtype}), got {bias.dtype}")
    if bias.shape[0] != n:
        raise ValueError(f"{api}: bias must have shape [n] = [{n}], got {list(bias.shape)}")
    _same_device(api, "a", a, bias=bias)
    return bias


@backend_requirement(MM, MM_BF16_BACKENDS)
@logged_api(mutates=("out",))
@traced(gemm_traces.MM_BF16)
def mm_bf16(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    pdl: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "cudnn",
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """Dense GEMM, float32 accumulation, optionally plus a bias (FlashInfer's mm_bf16).

    ``out[i, j] = sum_k a[i, k] * b[k, j] (+ bias[j])``

    Args:
        a: ``[m, k]``, bfloat16 or float16, row-major (any row stride).
        b: ``[k, n]``, a's dtype: column-major (``w.t()`` of an ``[n, k]`` weight, as linear layers
            hold them) or row-major.
        bias: optional ``[n]`` of a's dtype, added to the product after the GEMM (one elementwise
            pass over out, rounded in out's dtype; not fused into the kernel).
        pdl: programmatic dependent launch: on sm90+ GPUs the kernel is launched so that it may
            start while the kernel before it on the stream finishes (it waits for that kernel's
            results before reading anything); ignored on CPU tensors and older GPUs.
        out: optional ``[m, n]`` output, row-major (any row stride), of the output dtype.
        out_dtype: a's dtype (default), the other 16-bit dtype or torch.float32 (a bfloat16 ->
            float16 product runs the mma.sync kernels: the sm90 ones write the input dtype or
            float32 only).
        backend: one of FlashInfer's names ("cudnn", the default, "cutlass", "tgv", "cublaslt",
            "tinygemm", "cutile", "cute-dsl", "auto"); each runs kiln's kernels, chosen per call
            by the default heuristic or kiln.autotune. A call FlashInfer refuses for the name
            (CUTLASS or cuTile with a bias or pdl, cuBLASLt with pdl, TGV / TinyGEMM / CuTe-DSL with
            a non-bfloat16 output) is a ValueError with FlashInfer's reason.
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments (the
            checks keep every call memory-safe).

    Returns:
        ``out`` (a new ``[m, n]`` tensor when not given).
    """
    api = "kiln.mm_bf16"
    _dense(api, a, b, "a", "b", 2)
    dtype = _dense_out_dtype(api, a, out, out_dtype)
    if backend != "cudnn":
        check_backend(api, backend, _MM_ACCEPTED)
        why = _mm_refusal(backend, bias, pdl, dtype)
        if why is not None:
            raise _backend_refuses(api, backend, why)
    if pdl is not False and pdl is not True and pdl is not None:
        raise TypeError(f"{api}: pdl must be a bool, got {type(pdl).__name__}")
    if bias is not None:
        _bias(api, bias, a, b.shape[1])
    out = _out(api, out, (a.shape[0], b.shape[1]), dtype, a)
    _mm_op(out, a, b, pdl is not False and use_pdl(pdl, a.device))
    if bias is not None:
        out.add_(bias)
    return out


@backend_requirement(MM, BMM_BF16_BACKENDS)
@logged_api(mutates=("out",))
@traced(gemm_traces.BMM_BF16)
def bmm_bf16(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "cudnn",
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """Batched dense GEMM, float32 accumulation (FlashInfer's bmm_bf16).

    ``out[b, i, j] = sum_k A[b, i, k] * B[b, k, j]``

    Args:
        A: ``[batch, m, k]``, bfloat16 or float16, row-major in its last two dimensions.
        B: ``[batch, k, n]``, A's dtype, column-major (the transpose view of ``[batch, n, k]``) or
            row-major; any batch strides.
        out: optional ``[batch, m, n]`` output, row-major in its last two dimensions.
        out_dtype: A's dtype (default), the other 16-bit dtype or torch.float32.
        backend: one of FlashInfer's names ("cudnn", the default, "cutlass", "cutile", "tgv",
            "cake", "auto"); each runs kiln's kernels. "tgv" refuses a non-bfloat16 output, as
            FlashInfer's does.
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments.
    """
    api = "kiln.bmm_bf16"
    _dense(api, A, B, "A", "B", 3)
    dtype = _dense_out_dtype(api, A, out, out_dtype)
    if backend != "cudnn":
        check_backend(api, backend, _BMM_ACCEPTED)
        if backend == "tgv" and dtype != torch.bfloat16:
            raise _backend_refuses(api, backend, f"writes a bfloat16 output only, got {dtype}")
    out = _out(api, out, (A.shape[0], A.shape[1], B.shape[2]), dtype, A)
    _mm_op(out, A, B, False)
    return out


# --- fp8: bmm_fp8, gemm_fp8_nt_groupwise -----------------------------------------------------------


_fp8_dlpack: bool | None = None  # does this torch export fp8 tensors through DLPack?


def _fp8_dl(t: torch.Tensor):
    """(DLPack capsule, "") of an fp8 tensor; where this torch's DLPack export has no fp8 codes
    (DLPack 1.1's), a uint8 view of it and the fp8 type it stands for ("e4m3", "e5m2")."""
    global _fp8_dlpack
    if _fp8_dlpack is None:
        try:
            _jit.dl(torch.empty(1, dtype=torch.float8_e4m3fn))
            _fp8_dlpack = True
        except (RuntimeError, TypeError, BufferError):
            _fp8_dlpack = False
    if _fp8_dlpack:
        return _jit.dl(t), ""
    return _jit.dl(t.view(torch.uint8)), _SHORT[t.dtype]


@custom_op("gemm_fp8", mutates=("out",))
def _fp8_op(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_mode: str,
) -> None:
    device = a.device
    api = "kiln.bmm_fp8" if scale_mode == "tensor" else "kiln.gemm_fp8_nt_groupwise"
    mod = _jit.module(
        FP8, device, api, dtype=a.dtype, names={"dtype": "A.dtype" if scale_mode == "tensor" else "a.dtype"}
    )
    dl = _jit.dl
    (a_dl, a_as), (b_dl, b_as) = _fp8_dl(a), _fp8_dl(b)
    args = {
        "a": a_dl,
        "b": b_dl,
        "out": dl(out),
        "a_scale": dl(a_scale),
        "b_scale": dl(b_scale),
        "scale_mode": scale_mode,
        "a_as": a_as,
        "b_as": b_as,
    }

    def shape():
        batch = a.shape[0] if a.dim() == 3 else 1
        return (
            f"{scale_mode} m{autotuner.bucket(a.shape[-2])} batch{autotuner.bucket(batch)} n{b.shape[-1]} "
            f"k{a.shape[-1]} {_SHORT[a.dtype]}x{_SHORT[b.dtype]} out:{_SHORT[out.dtype]}"
        )

    _launch_tuned(mod, "fp8", "gemm_fp8", shape, device, args)


def _fp8_pair(api: str, a, b, a_name: str, b_name: str) -> None:
    for name, t in ((a_name, a), (b_name, b)):
        if t.dtype not in _FP8:
            raise TypeError(
                f"{api}: {name}.dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {t.dtype}"
            )
    _same_device(api, a_name, a, **{b_name: b})


def _scale(api: str, name: str, t, ref: torch.Tensor) -> torch.Tensor:
    _tensor(api, name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"{api}: {name}.dtype must be torch.float32, got {t.dtype}")
    _same_device(api, "the inputs", ref, **{name: t})
    return t


def _tensor_scale(api: str, name: str, t, ref: torch.Tensor) -> None:
    """A per-tensor scale: one float32 on ref's device (FlashInfer's words in each error)."""
    _tensor(api, name, t)
    if t.numel() != 1:
        raise ValueError(
            f"{api}: {name} must contain exactly one element (a per-tensor float32 scale), got shape "
            f"{list(t.shape)}"
        )
    if t.dtype != torch.float32:
        raise ValueError(f"{api}: {name} must have dtype torch.float32, got {t.dtype}")
    if t.device != ref.device:
        kind = "CUDA" if ref.device.type == "cuda" else ref.device.type.upper()
        raise ValueError(f"{api}: {name} must be a {kind} tensor on {ref.device} (A's), got {t.device}")


@backend_requirement(FP8, BMM_FP8_BACKENDS)
@logged_api(mutates=("out",))
@traced(gemm_traces.BMM_FP8)
def bmm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
    backend: str = "cublas",
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """Batched fp8 GEMM with per-tensor scales, float32 accumulation (FlashInfer's bmm_fp8).

    ``out[b, i, j] = A_scale * B_scale * sum_k A[b, i, k] * B[b, k, j]``

    Args:
        A: ``[batch, m, k]``, float8_e4m3fn or float8_e5m2, row-major in its last two dimensions.
        B: ``[batch, k, n]``, float8_e4m3fn (the fast kernels) or float8_e5m2, column-major: the
            transpose view of a contiguous ``[batch, n, k]``, as FlashInfer requires. A row-major B
            is refused (FlashInfer 0.7 silently returns wrong results for one).
        A_scale, B_scale: float32 tensors of one element (dequantization scales).
        dtype: the output dtype, torch.bfloat16 or torch.float16.
        out: optional ``[batch, m, n]`` output of ``dtype``.
        backend: one of FlashInfer's names ("cublas", the default, "cudnn", "cutlass", "cute-dsl",
            "auto"); each runs kiln's kernels. "cutlass" refuses e5m2 operands, as FlashInfer's does.
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments.
    """
    api = "kiln.bmm_fp8"
    _tensor(api, "A", A, 3)
    _tensor(api, "B", B, 3)
    _fp8_pair(api, A, B, "A", "B")
    _tensor_scale(api, "A_scale", A_scale, A)
    _tensor_scale(api, "B_scale", B_scale, A)
    if backend != "cublas":
        check_backend(api, backend, _FP8_ACCEPTED)
        if backend == "cutlass" and torch.float8_e5m2 in (A.dtype, B.dtype):
            raise _backend_refuses(api, backend, "does not support e5m2 for bmm_fp8")
    if B.shape[0] != A.shape[0]:
        raise ValueError(
            f"{api}: B.shape[0] must equal A.shape[0] (the batch, {A.shape[0]}), got {B.shape[0]}"
        )
    _k_matches(api, "B", 1, "A", A, B)
    if B.shape[1] > 1 and B.shape[2] > 1 and B.stride(1) != 1:
        raise ValueError(
            f"{api}: B must be column-major [batch, k, n] (the transpose view of a contiguous "
            f"[batch, n, k]: B = W.transpose(-2, -1)), got strides {list(B.stride())}; kiln, like "
            "FlashInfer, requires it (FlashInfer 0.7 silently returns wrong results for a row-major B)"
        )
    if dtype not in _16BIT:
        raise TypeError(f"{api}: dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    out = _out(api, out, (A.shape[0], A.shape[1], B.shape[2]), dtype, A)
    _fp8_op(out, A, B, A_scale, B_scale, "tensor")
    return out


def _trtllm_scales(api: str, a_scale, b_scale, m: int, n: int, k: int):
    """gemm_fp8_nt_groupwise(backend="trtllm")'s scales as the "K" mode reads them. FlashInfer's
    TensorRT-LLM kernel reads a_scale m-major (element (i, kb) at i + kb * m: a [k / 128, m] tensor
    or its [m, k / 128] transpose view) and b_scale k-major (element (jb, kb) at jb * (k / 128) + kb:
    [ceil(n / 128), k / 128], or its transpose view), whatever scale_major_mode says. A square
    scale (m or ceil(n / 128) equal to k / 128) is told apart by which dimension has stride 1."""
    kb, nb = k // SCALE_GRANULARITY[2], -(-n // SCALE_GRANULARITY[1])
    for t, name in ((a_scale, "a_scale"), (b_scale, "b_scale")):
        _tensor(api, name, t, 2)
    if tuple(a_scale.shape) == (m, kb) and (m != kb or a_scale.stride(0) == 1 or m == 1):
        sa = a_scale
    elif tuple(a_scale.shape) == (kb, m):
        sa = a_scale.t()
    else:
        raise ValueError(
            f"{api}: backend 'trtllm' takes a_scale [k / 128, m] = [{kb}, {m}] (or its transpose view), "
            f"got shape {list(a_scale.shape)}"
        )
    if tuple(b_scale.shape) == (nb, kb) and (nb != kb or b_scale.stride(1) == 1 or kb == 1):
        sb = b_scale
    elif tuple(b_scale.shape) == (kb, nb):
        sb = b_scale.t()
    else:
        raise ValueError(
            f"{api}: backend 'trtllm' takes b_scale [ceil(n / 128), k / 128] = [{nb}, {kb}] (or its "
            f"transpose view), got shape {list(b_scale.shape)}"
        )
    return sa, sb


@backend_requirement(FP8, GEMM_FP8_NT_GROUPWISE_BACKENDS)
@logged_api(mutates=("out",))
@traced(gemm_traces.GEMM_FP8_NT_GROUPWISE)
def gemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None = None,
    mma_sm: int = 1,
    scale_granularity_mnk: tuple[int, int, int] = SCALE_GRANULARITY,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "cutlass",
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """fp8 GEMM with DeepSeek-V3 groupwise scales, float32 accumulation (FlashInfer's name).

    ``out[i, j] = sum_kb a_scale(i, kb) * b_scale(j // 128, kb) * sum_{k in block kb} a[i, k] * b[j, k]``

    Args:
        a: ``[m, k]``, float8_e4m3fn or float8_e5m2, row-major; k a multiple of 128.
        b: ``[n, k]``, float8_e4m3fn (the fast kernels) or float8_e5m2, k contiguous ("nt").
        a_scale: float32, one scale per row and 128-wide k block: ``[k / 128, m]`` for
            scale_major_mode "MN", ``[m, k / 128]`` for "K" (either stride order).
        b_scale: float32, one per 128 x 128 block: ``[k / 128, ceil(n / 128)]`` ("MN") or
            ``[ceil(n / 128), k / 128]`` ("K").
        scale_major_mode: "MN", "K", or None: "MN" for the cutlass backend (FlashInfer's cutlass
            requires the mode; kiln takes None as "MN"), "K" for cutile; ignored by trtllm.
        mma_sm: 1 or 2, accepted for FlashInfer compatibility; no effect (kiln's cluster shape is a
            tactic: the default heuristic or kiln.autotune picks it).
        scale_granularity_mnk: (1, 128, 128), or (128, 128, 128) (a_scale per 128 x 128 block of
            a as gemm_fp8_nt_blockscaled takes it; the cutlass backend only, as FlashInfer's).
        out: optional ``[m, n]`` output; its dtype wins over out_dtype.
        out_dtype: torch.bfloat16 (None, the default) or torch.float16.
        backend: FlashInfer's names, each running kiln's kernels: "cutlass" (the default; the
            scales as scale_major_mode says), "trtllm" (the scales as FlashInfer's TensorRT-LLM
            kernel reads them: a_scale m-major ``[k / 128, m]``, b_scale k-major
            ``[ceil(n / 128), k / 128]``, or either's transpose view; scale_major_mode ignored;
            k >= 256, as FlashInfer's), "cutile" (scale_major_mode "K" or None only: FlashInfer's
            cuTile refuses "MN").
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments.
    """
    return _groupwise(
        "kiln.gemm_fp8_nt_groupwise",
        a,
        b,
        a_scale,
        b_scale,
        scale_major_mode,
        mma_sm,
        scale_granularity_mnk,
        out,
        out_dtype,
        backend,
    )


@backend_requirement(FP8)  # no backend choices, as FlashInfer's @backend_requirement({}, ...)
@logged_api(mutates=("out",))
@traced(gemm_traces.GEMM_FP8_NT_BLOCKSCALED)
def gemm_fp8_nt_blockscaled(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None = "MN",
    mma_sm: int = 1,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """fp8 GEMM with 128 x 128 block scales on both operands, float32 accumulation (FlashInfer's
    gemm_fp8_nt_groupwise with scale_granularity_mnk (128, 128, 128)).

    ``out[i, j] = sum_kb a_scale(i // 128, kb) * b_scale(j // 128, kb) * (a[i, kb] . b[j, kb])``, the
    dot product over the 128-wide k block kb

    Args:
        a: ``[m, k]``, float8_e4m3fn or float8_e5m2, row-major; k a multiple of 128.
        b: ``[n, k]``, float8_e4m3fn (the fast kernels) or float8_e5m2, k contiguous.
        a_scale: float32, one per 128 x 128 block of a: ``[k / 128, ceil(m / 128)]`` ("MN") or
            ``[ceil(m / 128), k / 128]`` ("K"); expanded to one scale per row (a copy of
            ``m * k / 128`` floats) for the 1 x 128 kernels of gemm_fp8_nt_groupwise.
        b_scale: float32, one per 128 x 128 block of b, as for gemm_fp8_nt_groupwise.
        scale_major_mode: "MN" (the default; None is "MN") or "K".
        mma_sm: 1 or 2, accepted for FlashInfer compatibility; no effect.
        out: optional ``[m, n]`` output; its dtype wins over out_dtype.
        out_dtype: torch.bfloat16 (None, the default) or torch.float16.
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments.
    """
    return _groupwise(
        "kiln.gemm_fp8_nt_blockscaled",
        a,
        b,
        a_scale,
        b_scale,
        scale_major_mode,
        mma_sm,
        BLOCK_GRANULARITY,
        out,
        out_dtype,
        "cutlass",
    )


def _rows_of_blocks(api: str, a_scale: torch.Tensor, m: int, kb: int, mode: str) -> torch.Tensor:
    """a's 128 x 128 block scales as one scale per row (the 1 x 128 layout of the same mode)."""
    mb = -(-m // SCALE_GRANULARITY[1])
    want = (kb, mb) if mode == "MN" else (mb, kb)
    if a_scale.dim() != 2 or tuple(a_scale.shape) != want:
        shape = "[k / 128, ceil(m / 128)]" if mode == "MN" else "[ceil(m / 128), k / 128]"
        raise ValueError(
            f"{api}: a_scale must be {shape} = {list(want)} for scale_major_mode {mode!r} with 128 x 128 "
            f"blocks of a, got shape {list(a_scale.shape)}"
        )
    dim = 1 if mode == "MN" else 0
    return a_scale.repeat_interleave(SCALE_GRANULARITY[1], dim=dim).narrow(dim, 0, m)


def _groupwise(
    api, a, b, a_scale, b_scale, scale_major_mode, mma_sm, scale_granularity_mnk, out, out_dtype, backend
) -> torch.Tensor:
    """gemm_fp8_nt_groupwise and gemm_fp8_nt_blockscaled: the checks, then the launch."""
    _tensor(api, "a", a, 2)
    _tensor(api, "b", b, 2)
    _fp8_pair(api, a, b, "a", "b")
    _k_matches(api, "b", 1, "a", a, b)
    if backend != "cutlass":
        check_backend(api, backend, GEMM_FP8_NT_GROUPWISE_BACKENDS)
    if backend == "cutile" and scale_major_mode not in (None, "K"):
        raise _backend_refuses(api, backend, f"supports scale_major_mode='K' only, got {scale_major_mode!r}")
    if backend != "trtllm" and scale_major_mode not in (None, "MN", "K"):
        raise ValueError(f"{api}: scale_major_mode must be 'MN', 'K' or None, got {scale_major_mode!r}")
    mode = scale_major_mode or ("K" if backend == "cutile" else "MN")
    if mma_sm not in (1, 2):
        raise ValueError(f"{api}: mma_sm must be 1 or 2, got {mma_sm!r}")
    granularity = tuple(scale_granularity_mnk)
    if granularity not in (SCALE_GRANULARITY, BLOCK_GRANULARITY):
        raise ValueError(
            f"{api}: scale_granularity_mnk {granularity} is not supported: kiln's groupwise kernels "
            f"scale per {SCALE_GRANULARITY} blocks (DeepSeek-V3's), or {BLOCK_GRANULARITY} "
            "(expanded to one scale per row)"
        )
    if granularity == BLOCK_GRANULARITY and backend != "cutlass":
        raise _backend_refuses(api, backend, f"supports scale_granularity_mnk {SCALE_GRANULARITY} only")
    k = a.shape[1]
    if k % SCALE_GRANULARITY[2]:
        raise ValueError(f"{api}: k (a.shape[1] = {k}) must be a multiple of 128 for groupwise scaling")
    if backend == "trtllm" and k < 256:
        raise _backend_refuses(api, backend, f"needs k >= 256 (a.shape[1] = {k})")
    if b.shape[0] > 1 and k > 1 and b.stride(1) != 1:
        raise ValueError(
            f"{api}: b must be [n, k] with k contiguous (stride 1), got strides {list(b.stride())}; "
            "call .contiguous() on it"
        )
    dtype = out.dtype if isinstance(out, torch.Tensor) else (out_dtype or torch.bfloat16)
    if dtype not in _16BIT:
        raise TypeError(f"{api}: the output dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    _scale(api, "a_scale", a_scale, a)
    _scale(api, "b_scale", b_scale, a)
    if backend == "trtllm":
        a_scale, b_scale = _trtllm_scales(api, a_scale, b_scale, a.shape[0], b.shape[0], k)
        mode = "K"
    if granularity == BLOCK_GRANULARITY:
        a_scale = _rows_of_blocks(api, a_scale, a.shape[0], k // SCALE_GRANULARITY[2], mode)
    out = _out(api, out, (a.shape[0], b.shape[0]), dtype, a)
    _fp8_op(out, a, b.t(), a_scale, b_scale, mode)
    return out


# --- grouped: SegmentGEMMWrapper, grouped_mm ---------------------------------------------------------


@custom_op("grouped_gemm", mutates=("out",))
def _grouped_op(
    out: torch.Tensor,
    x: torch.Tensor,
    weights: torch.Tensor,
    bounds: torch.Tensor,
    bounds_are_ends: bool,
    weight_indices: torch.Tensor | None,
) -> None:
    device = x.device
    api = "kiln.grouped_mm" if bounds_are_ends else "kiln.SegmentGEMMWrapper.run"
    mod = _jit.module(
        GROUPED, device, api, dtype=x.dtype, names={"dtype": "a.dtype" if bounds_are_ends else "x.dtype"}
    )
    dl = _jit.dl
    args = {
        "x": dl(x),
        "weights": dl(weights),
        "out": dl(out),
        "bounds": dl(bounds),
        "bounds_are_ends": bounds_are_ends,
        "weight_indices": None if weight_indices is None else dl(weight_indices),
    }

    def shape():
        groups = bounds.numel() - (0 if bounds_are_ends else 1)
        return (
            f"rows{autotuner.bucket(x.shape[0])} groups{groups} n{weights.shape[-1]} k{x.shape[1]} "
            f"{_SHORT[x.dtype]} w:{_layout(weights)} out:{_SHORT[out.dtype]}"
        )

    _launch_tuned(mod, "grouped", "grouped", shape, device, args, errors=errors.record_address(device))
    errors.after_launch(device)


def _index(api: str, name: str, t, device: torch.device) -> torch.Tensor:
    _tensor(api, name, t, 1)
    if t.dtype not in _INDEX:
        raise TypeError(f"{api}: {name} must be an int64 (or int32) tensor, got {t.dtype}")
    return t.to(device)


class SegmentGEMMWrapper:
    """FlashInfer's segment GEMM (LoRA / MoE): segment s of the packed rows of x times weight
    weights[weight_indices[s]] (or weights[s]). Bounds and weight indices are checked where the
    kernels read them (docs/gemm.md, index errors)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        """float_workspace_buffer: any tensor (FlashInfer's CUTLASS kernels use it; kiln's need no
        workspace, it is kept for compatibility). backend: FlashInfer's "auto", "sm80" (its Ampere
        CUTLASS kernel) or "sm90" (its Hopper one): each runs kiln's grouped kernels, chosen per
        call (the sm90 kernel on a 9.0 GPU wherever its alignment rules hold, else the fallback;
        the default heuristic or kiln.autotune)."""
        api = "kiln.SegmentGEMMWrapper"
        _tensor(api, "float_workspace_buffer", float_workspace_buffer)
        check_backend(api, backend, SEGMENT_GEMM_BACKENDS)
        self._float_workspace_buffer = float_workspace_buffer
        self.backend = backend

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor
    ) -> None:
        """FlashInfer compatibility: the buffers are kept and not used."""
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    @logged_api(mutates=("out",))
    @traced(gemm_traces.SEGMENT_GEMM)
    def run(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        batch_size: int,
        weight_column_major: bool,
        out: torch.Tensor | None = None,
        seg_lens: torch.Tensor | None = None,
        seg_indptr: torch.Tensor | None = None,
        weight_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``out[r] = x[r] @ W_s`` for the rows r of segment s, ``W_s = weights[weight_indices[s]]``
        (``weights[s]`` without weight_indices) as ``[d_in, d_out]``; float32 accumulation.

        Args:
            x: ``[rows, d_in]``, bfloat16 or float16, row-major.
            weights: ``[num_weights, d_out, d_in]`` if weight_column_major else
                ``[num_weights, d_in, d_out]``, x's dtype.
            batch_size: the number of segments.
            out: optional ``[rows, d_out]`` output of x's dtype (or float32); rows in no segment
                are not written (a new out is zeros).
            seg_lens: ``[batch_size]`` segment lengths (int64 or int32), or
            seg_indptr: ``[batch_size + 1]`` segment bounds from 0 (wins over seg_lens).
            weight_indices: ``[batch_size]`` weight of each segment (int64 or int32).
        """
        api = "kiln.SegmentGEMMWrapper.run"
        _tensor(api, "x", x, 2)
        _tensor(api, "weights", weights, 3)
        if x.dtype not in _16BIT:
            raise TypeError(f"{api}: x.dtype {x.dtype} is not supported; supported dtypes: bfloat16, float16")
        if weights.dtype != x.dtype:
            raise TypeError(f"{api}: weights.dtype must be x's ({x.dtype}), got {weights.dtype}")
        _same_device(api, "x", x, weights=weights)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(
                f"{api}: batch_size must be an int >= 0 (the number of segments), got {batch_size!r}"
            )
        if seg_lens is None and seg_indptr is None:
            raise ValueError(f"{api}: either seg_lens or seg_indptr should be provided")
        w = weights.transpose(1, 2) if weight_column_major else weights  # [num_weights, d_in, d_out]
        _k_matches(api, "weights", 1 if not weight_column_major else 2, "x", x, weights)
        if seg_indptr is not None:
            bounds = _index(api, "seg_indptr", seg_indptr, x.device)
            if bounds.numel() != batch_size + 1:
                raise ValueError(
                    f"{api}: seg_indptr must have batch_size + 1 = {batch_size + 1} entries, got "
                    f"{bounds.numel()}"
                )
        else:
            lens = _index(api, "seg_lens", seg_lens, x.device)
            if lens.numel() != batch_size:
                raise ValueError(
                    f"{api}: seg_lens must have batch_size = {batch_size} entries, got {lens.numel()}"
                )
            bounds = torch.zeros(batch_size + 1, dtype=torch.int64, device=x.device)
            torch.cumsum(lens, 0, out=bounds[1:])
        indices = None
        if weight_indices is not None:
            indices = _index(api, "weight_indices", weight_indices, x.device)
            if indices.numel() != batch_size:
                raise ValueError(
                    f"{api}: weight_indices must have batch_size = {batch_size} entries, got "
                    f"{indices.numel()}"
                )
        d_out = w.shape[2]
        if out is None:
            out = torch.zeros(x.shape[0], d_out, dtype=x.dtype, device=x.device)
        else:
            _tensor(api, "out", out)
            if tuple(out.shape) != (x.shape[0], d_out):
                raise ValueError(
                    f"{api}: output tensor shape mismatch, expected {[x.shape[0], d_out]}, got "
                    f"{list(out.shape)}"
                )
            _same_device(api, "x", x, out=out)
        _grouped_op(out, x, w, bounds, False, indices)
        return out


GROUPED_BACKENDS = ("auto", "cuda", "triton")
_INT32_MAX = 2**31 - 1


class _TritonTactics:
    """The triton grouped module as kiln uses it. Its kernels (ops/gemm/BUILD.py): the fallback
    for any strides (grouped_mm_kernel, and grouped_mm_f32_kernel for float32 out) and the fast
    ones compiled for unit strides and 16-aligned pointers and sizes, b column-major (kmajor) or
    row-major (nmajor). The kmajor configs are the autotuner's tactics (kiln/autotuner.py, op
    "grouped_triton": tuning, persistence and the blocklist as for the CUDA kernels); the
    globaltimer timer borrows the CUDA grouped module's timestamp kernel."""

    def __init__(self, mod, device: torch.device, dtype: torch.dtype):
        self.mod, self.device, self.dtype = mod, device, dtype
        names = [e for e in mod.entries if e.startswith("grouped_mm_kmajor")]
        self.tactic_names = tuple(sorted(names, key=lambda e: (e != "grouped_mm_kmajor", e)))
        self.kernels = [mod.kernel(e) for e in self.tactic_names]
        self.nmajor = mod.kernel("grouped_mm_nmajor")
        self.generic = mod.kernel("grouped_mm_kernel")
        self.f32 = mod.kernel("grouped_mm_f32_kernel")
        self.every = list(range(len(self.kernels)))
        self._defaults: dict[int, int] = {}

    def default(self, blocked: int) -> int:
        """The tactic the untuned path runs: the first one not blocked (0 if all are)."""
        got = self._defaults.get(blocked)
        if got is None:
            got = self._defaults[blocked] = next((i for i in self.every if not (blocked >> i) & 1), 0)
        return got

    def timestamp(self, **kwargs):
        return _jit.module(GROUPED, self.device, "kiln.autotune", dtype=self.dtype).timestamp(**kwargs)


_triton_tactics: dict[int, _TritonTactics] = {}  # id(module) -> its tactics
_triton_by_call: dict[tuple, _TritonTactics] = {}  # (device, dtype) -> the tactics of its module


def _tactics_of(device: torch.device, dtype: torch.dtype) -> _TritonTactics:
    """The triton module's tactics for a call on `device` with a's `dtype`: after the first call one
    dict lookup; through _jit.triton_module (which builds or loads it, and reports it to API logging's
    module observer) on the first and whenever the observer is on."""
    tactics = _triton_by_call.get((device, dtype))
    if tactics is None or hooks.module_observer is not None:
        mod = _jit.triton_module(GROUPED, device, "kiln.grouped_mm", dtype=dtype, names={"dtype": "a.dtype"})
        tactics = _triton_tactics.get(id(mod))
        if tactics is None:
            tactics = _triton_tactics.setdefault(id(mod), _TritonTactics(mod, device, dtype))
        _triton_by_call[(device, dtype)] = tactics
    return tactics


# The grouped kernels' parameters, in the order _operands gives their values; each kernel takes a
# subset (a fast kernel's unit strides are constexprs), picked by _picker.
_PARAMS = (
    "a",
    "b",
    "out",
    "offs",
    "rows",
    "n",
    "k",
    "groups",
    "stride_am",
    "stride_ak",
    "stride_bg",
    "stride_bk",
    "stride_bn",
    "stride_om",
    "stride_on",
)
_pickers: dict = {}  # kernel -> (its arguments from _operands' tuple, BLOCK_M, BLOCK_N)


def _operands(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, offs_ptr: int) -> tuple:
    """Every value a grouped kernel may take, in _PARAMS order (a few torch calls, made once)."""
    rows, k = a.shape
    groups, _, n = b.shape
    return (
        a.data_ptr(),
        b.data_ptr(),
        out.data_ptr(),
        offs_ptr,
        rows,
        n,
        k,
        groups,
        *a.stride(),
        *b.stride(),
        *out.stride(),
    )


def _layout_of(v: tuple, same_dtype: bool) -> str | None:
    """_fast_layout on _operands' values."""
    pa, pb, po, _, _, n, k, _, sam, sak, sbg, sbk, sbn, som, son = v
    if sak != 1 or son != 1 or not same_dtype:
        return None
    if (pa | pb | po | sam | som | sbg) & 15:
        return None
    if sbk == 1 and sbn & 15 == 0 and k & 15 == 0:
        return "kmajor"
    if sbn == 1 and sbk & 15 == 0 and n & 15 == 0:
        return "nmajor"
    return None


def _fast_layout(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """ "kmajor" / "nmajor" when the call meets what the fast kernels were compiled assuming
    (unit strides along k for a, along n for out; 16-byte aligned pointers; row strides, k or n
    multiples of 16), else None (the fallback kernel)."""
    return _layout_of(_operands(out, a, b, 0), out.dtype == a.dtype)


def _picker(kernel) -> tuple:
    got = _pickers.get(kernel)
    if got is None:
        unknown = [p for p in kernel.params if p not in _PARAMS]
        if unknown:
            raise ValueError(f"grouped triton kernel takes {unknown}, which kiln.gemm does not pass")
        at = [_PARAMS.index(p) for p in kernel.params]
        pick = operator.itemgetter(*at) if len(at) > 1 else (lambda v, i=at[0]: (v[i],))
        got = _pickers[kernel] = (pick, kernel.constexprs["BLOCK_M"], kernel.constexprs["BLOCK_N"])
    return got


def _launch_values(kernel, v: tuple, device: torch.device) -> None:
    """Launch `kernel` with its arguments out of _operands' `v`, on the grid of
    ops/gemm/grouped_triton.py, in `device`'s primary context (whatever the thread has current:
    none in a thread that never touched the GPU, where torch.cuda.device(0) binds nothing, as
    cudaGetDevice says 0) on its current stream."""
    pick, block_m, block_n = _pickers.get(kernel) or _picker(kernel)
    grid = (-(-v[4] // block_m) + v[7], -(-v[5] // block_n))
    kernel(grid, *pick(v), stream=_jit.stream_of(device), device=device.index)


def _launch_triton(kernel, out, a, b, offs) -> None:
    _launch_values(kernel, _operands(out, a, b, offs.data_ptr()), a.device)


@custom_op("grouped_gemm_triton", mutates=("out",))
def _grouped_triton_op(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, bounds: torch.Tensor
) -> None:
    """grouped_mm on the triton backend: one launch of the fast kernel for the call's layout (for
    kmajor the tuned config, else the default) or of the fallback, with the grid of
    ops/gemm/grouped_triton.py; offs is int32 on a's device, bounds the caller's offs (int32 or
    int64, what KILN_VALIDATE_INDICES=1 checks). Everything past the Python API's checks happens
    here, inside the custom op, so torch.compile never traces it: the environment read (a lock
    on first use), the host check of offs (a sync), the module lookup and the driver launch.
    The common path (nothing tuned) builds no callables: autotuner.untuned says it applies."""
    if env.get("KILN_VALIDATE_INDICES"):
        _check_offs_now("kiln.grouped_mm", bounds, a.shape[0])
    device = a.device
    tactics = _tactics_of(device, a.dtype)
    if a.shape[0] == 0 or b.shape[2] == 0:
        return
    v = _operands(out, a, b, offs.data_ptr())
    layout = _layout_of(v, out.dtype == a.dtype)
    if layout != "kmajor":
        fallback = tactics.f32 if out.dtype == torch.float32 else tactics.generic
        _launch_values(tactics.nmajor if layout == "nmajor" else fallback, v, device)
        return
    blocked = autotuner.untuned(tactics, "grouped_triton", device)
    if blocked is not None:
        _launch_values(tactics.kernels[tactics.default(blocked)], v, device)
        return

    def run(t: int, strict: bool, blocked: int) -> int:
        if t < 0 or (blocked >> t) & 1:
            t = tactics.default(blocked)
        _launch_values(tactics.kernels[t], v, device)
        return t

    def shape() -> str:
        return (
            f"rows{autotuner.bucket(a.shape[0])} groups{b.shape[0]} n{b.shape[2]} k{a.shape[1]} "
            f"{_SHORT[a.dtype]} w:kmajor out:{_SHORT[out.dtype]}"
        )

    autotuner.launch(tactics, "grouped_triton", shape, device, run, lambda: (0, tactics.every))


def _check_offs_now(api: str, offs: torch.Tensor, rows: int) -> None:
    """KILN_VALIDATE_INDICES=1 on the triton backend: offs checked on the host (a sync). Without
    it the kernel clamps each end into [previous end, rows], so it never leaves a and out."""
    ends = offs.tolist()
    prev = 0
    for g, e in enumerate(ends):
        if e < prev or e > rows:
            raise IndexError(
                f"{api}: offs[{g}] = {e} is out of range: offs must be non-decreasing ends in "
                f"[0, rows = {rows}] (offs[{g - 1 if g else 0}] = {prev if g else 0})"
            )
        prev = e


@logged_api(mutates=("out",))
@traced(gemm_traces.GROUPED_MM)
def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """torch._grouped_mm's MoE form, 2-D a x 3-D b: group g is rows ``[offs[g-1], offs[g])`` of a
    (``offs[-1]`` = 0), and ``out[rows of g] = a[rows of g] @ b[g]``; float32 accumulation.

    Args:
        a: ``[rows, k]``, bfloat16 (torch's contract; float16 too), row-major.
        b: ``[groups, k, n]``, a's dtype, each ``[k, n]`` column-major (the transpose view of
            ``[groups, n, k]``, as MoE weights are held) or row-major.
        offs: ``[groups]`` cumulative row ends, int32 (int64 accepted), non-decreasing, at most rows.
        bias: must be None (torch: not supported).
        out_dtype: a's dtype (default) or torch.float32.
        out: optional ``[rows, n]`` output; rows past offs[-1] are not written (a new out leaves
            them unset, as torch does).
        backend: "auto" (the CUDA backend on CUDA tensors), "cuda", or "triton" (the Triton kernel
            of ops/gemm/grouped_triton.py, compiled by kiln's triton toolchain). CPU tensors run
            the host backend whatever the backend ("triton" included: its host fallback). The
            triton backend checks offs only under KILN_VALIDATE_INDICES=1 and otherwise clamps
            each end into [previous end, rows] (never out of bounds); the CUDA backend reports a
            bad offs as an index error (docs/gemm.md).
    """
    api = "kiln.grouped_mm"
    if backend not in GROUPED_BACKENDS:
        raise ValueError(f"{api}: backend must be one of {', '.join(GROUPED_BACKENDS)}, got {backend!r}")
    _tensor(api, "a", a)
    _tensor(api, "b", b)
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(
            f"{api}: kiln supports a 2-D a [rows, k] and a 3-D b [groups, k, n] (the MoE form of "
            f"torch._grouped_mm), got a {a.dim()}-D, b {b.dim()}-D"
        )
    if a.dtype not in _16BIT:
        raise TypeError(f"{api}: a.dtype {a.dtype} is not supported; supported dtypes: bfloat16, float16")
    if b.dtype != a.dtype:
        raise TypeError(f"{api}: b.dtype must be a's ({a.dtype}), got {b.dtype}")
    _same_device(api, "a", a, b=b)
    if bias is not None:
        raise ValueError(f"{api}: bias is not supported (torch._grouped_mm does not support it either)")
    _k_matches(api, "b", 1, "a", a, b)
    bounds = _index(api, "offs", offs, a.device)
    if bounds.numel() != b.shape[0]:
        raise ValueError(
            f"{api}: offs must have one entry per group of b ({b.shape[0]}), got {bounds.numel()}"
        )
    dtype = _dense_out_dtype(api, a, out, out_dtype)
    out = _out(api, out, (a.shape[0], b.shape[2]), dtype, a)
    if backend == "triton" and a.device.type == "cuda":
        if max(a.shape[0], a.shape[1], b.shape[0], b.shape[2]) > _INT32_MAX:
            for name, size in (
                ("a.shape[0]", a.shape[0]),
                ("a.shape[1]", a.shape[1]),
                ("b.shape[2]", b.shape[2]),
                ("b.shape[0]", b.shape[0]),
            ):
                if size > _INT32_MAX:
                    raise ValueError(f"{api}: backend='triton' needs {name} <= {_INT32_MAX}, got {size}")
        offs32 = bounds if bounds.dtype == torch.int32 else bounds.clamp(-1, _INT32_MAX).to(torch.int32)
        _grouped_triton_op(out, a, b, offs32, bounds)  # (KILN_VALIDATE_INDICES is read in there)
        return out
    _grouped_op(out, a, b, bounds, True, None)
    return out


# --- grouped fp8: group_gemm_fp8_nt_groupwise --------------------------------------------------------


@custom_op("group_gemm_fp8", mutates=("out",))
def _group_fp8_op(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bounds: torch.Tensor,
    bounds_are_ends: bool,
    scale_mode: str,
) -> None:
    device = a.device
    mod = _jit.module(
        FP8_GROUPED, device, "kiln.group_gemm_fp8_nt_groupwise", dtype=a.dtype, names={"dtype": "a.dtype"}
    )
    dl = _jit.dl
    (a_dl, a_as), (b_dl, b_as) = _fp8_dl(a), _fp8_dl(b)
    args = {
        "a": a_dl,
        "b": b_dl,
        "out": dl(out),
        "bounds": dl(bounds),
        "bounds_are_ends": bounds_are_ends,
        "a_scale": dl(a_scale),
        "b_scale": dl(b_scale),
        "scale_mode": scale_mode,
        "a_as": a_as,
        "b_as": b_as,
    }

    def shape():
        groups = bounds.numel() - (0 if bounds_are_ends else 1)
        return (
            f"{scale_mode} rows{autotuner.bucket(a.shape[0])} groups{groups} n{b.shape[1]} k{a.shape[1]} "
            f"e4m3 out:{_SHORT[out.dtype]}"
        )

    errors_at = errors.record_address(device)
    _launch_tuned(mod, "fp8_grouped", "group_gemm_fp8", shape, device, args, errors=errors_at)
    errors.after_launch(device)


def _group_fp8(api: str, a, b, a_scale, b_scale, bounds, bounds_are_ends: bool, scale_major_mode: str, out):
    """The checks of group_gemm_fp8_nt_groupwise (and of the MoE layer's fp8 path, which passes
    offs), then the launch into out."""
    _tensor(api, "a", a, 2)
    _tensor(api, "b", b, 3)
    for name, t in (("a", a), ("b", b)):
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{api}: {name}.dtype must be torch.float8_e4m3fn, got {t.dtype}")
    _same_device(api, "a", a, b=b)
    _k_matches(api, "b", 2, "a", a, b)
    if scale_major_mode not in ("MN", "K"):
        raise ValueError(f"{api}: scale_major_mode must be 'MN' or 'K', got {scale_major_mode!r}")
    k = a.shape[1]
    if k % SCALE_GRANULARITY[2]:
        raise ValueError(f"{api}: k (a.shape[1] = {k}) must be a multiple of 128 for groupwise scaling")
    _scale(api, "a_scale", a_scale, a)
    _scale(api, "b_scale", b_scale, a)
    name = "offs" if bounds_are_ends else "m_indptr"
    _tensor(api, name, bounds, 1)
    if bounds.dtype not in _INDEX:
        raise TypeError(f"{api}: {name} must be an int32 (or int64) tensor, got {bounds.dtype}")
    _same_device(api, "a", a, **{name: bounds})
    groups = bounds.numel() - (0 if bounds_are_ends else 1)
    if groups < 0 or groups > b.shape[0]:
        raise ValueError(
            f"{api}: {name} has {bounds.numel()} entries: {groups} segments, but b holds {b.shape[0]} "
            f"weights (segment s uses b[s]; m_indptr has num_groups + 1 entries)"
        )
    if out.dtype not in _16BIT:
        raise TypeError(f"{api}: the output dtype must be torch.bfloat16 or torch.float16, got {out.dtype}")
    _group_fp8_op(out, a, b, a_scale, b_scale, bounds.contiguous(), bounds_are_ends, scale_major_mode)
    return out


@backend_requirement(FP8_GROUPED)  # no backend choices, as FlashInfer's @backend_requirement({}, ...)
@logged_api(mutates=("out",))
@traced(gemm_traces.GROUP_GEMM_FP8_NT_GROUPWISE)
def group_gemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m_indptr: torch.Tensor,
    scale_granularity_mnk: tuple[int, int, int] = SCALE_GRANULARITY,
    scale_major_mode: str = "MN",
    mma_sm: int = 1,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "trtllm",
    segment_alignment: int = 1,
    *,
    skip_check: bool = False,
) -> torch.Tensor:
    """Grouped fp8 GEMM with DeepSeek-V3 groupwise scales, float32 accumulation (FlashInfer's name and
    argument order; the MoE experts' GEMM). For each segment s, rows ``[m_indptr[s], m_indptr[s+1])``:

    ``out[i, j] = sum_kb a_scale(i, kb) * b_scale(s, j // 128, kb) * (a[i, kb] . b[s, j, kb])``, the
    dot product over the 128-wide k block kb

    Args:
        a: ``[cum_m, k]`` float8_e4m3fn, row-major; k a multiple of 128.
        b: ``[E, n, k]`` float8_e4m3fn, k contiguous (each expert's weight as a linear layer holds it).
        a_scale: float32, one per row and 128-wide k block: ``[k / 128, cum_m]`` ("MN") or
            ``[cum_m, k / 128]`` ("K"); any strides.
        b_scale: float32, one per expert and 128 x 128 block: ``[E, k / 128, ceil(n / 128)]`` ("MN")
            or ``[E, ceil(n / 128), k / 128]`` ("K"); any strides (a per-expert scale ``s [E]`` is
            ``s[:, None, None].expand(...)``).
        m_indptr: ``[E + 1]`` int32 (or int64) segment bounds, from 0, non-decreasing, at most
            cum_m; segment s uses b[s]. Unlike FlashInfer, no multiple-of-4 padding is needed.
            Checked where the kernel reads them: a bad segment writes nothing and is reported by
            ``kiln.check_errors()`` (immediately under ``KILN_VALIDATE_INDICES=1``; on the CPU an
            IndexError at once). Rows in no segment are not written.
        scale_granularity_mnk: (1, 128, 128), the only granularity supported.
        scale_major_mode: "MN" (FlashInfer's default) or "K".
        mma_sm: 1 or 2, accepted for FlashInfer compatibility; no effect.
        out: optional ``[cum_m, n]`` output; its dtype wins over out_dtype.
        out_dtype: torch.bfloat16 (default) or torch.float16.
        backend: FlashInfer's "trtllm" (the default) or "cutile"; both run kiln's kernels.
        segment_alignment: the row alignment the caller promises for every segment (>= 1;
            FlashInfer's cuTile kernel uses it); kiln's kernels take any segments and ignore it.
        skip_check: accepted for FlashInfer compatibility; kiln always checks its arguments.
    """
    api = "kiln.group_gemm_fp8_nt_groupwise"
    _tensor(api, "a", a, 2)
    _tensor(api, "b", b, 3)
    if backend != "trtllm":
        check_backend(api, backend, GROUP_GEMM_FP8_BACKENDS)
    if isinstance(segment_alignment, bool) or not isinstance(segment_alignment, int) or segment_alignment < 1:
        raise ValueError(f"{api}: segment_alignment must be an int >= 1, got {segment_alignment!r}")
    if mma_sm not in (1, 2):
        raise ValueError(f"{api}: mma_sm must be 1 or 2, got {mma_sm!r}")
    if tuple(scale_granularity_mnk) != SCALE_GRANULARITY:
        raise ValueError(
            f"{api}: scale_granularity_mnk {tuple(scale_granularity_mnk)} is not supported: kiln's "
            f"groupwise kernels scale per {SCALE_GRANULARITY} blocks (DeepSeek-V3's) only"
        )
    dtype = out.dtype if isinstance(out, torch.Tensor) else (out_dtype or torch.bfloat16)
    if dtype not in _16BIT:
        raise TypeError(f"{api}: the output dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    out = _out(api, out, (a.shape[0], b.shape[1]), dtype, a)
    return _group_fp8(api, a, b, a_scale, b_scale, m_indptr, False, scale_major_mode, out)
