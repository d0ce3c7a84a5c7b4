"""Routines of the GEMM APIs (kiln.gemm), each against the torch call a user has without kiln and
FlashInfer 0.7 where it runs (optional: "unavailable" when it does not import or has no kernel
for the device):

  mm_bf16                torch.matmul (cuBLAS) on the same layouts; flashinfer.mm_bf16 (cuBLASLt);
                         kiln with pdl=True (kiln_pdl: programmatic dependent launch, sm90+)
  bmm_bf16               torch.bmm; flashinfer.bmm_bf16 (cuDNN, when the cudnn frontend imports)
  bmm_fp8                torch._scaled_mm per batch (cuBLASLt, per-tensor scales); flashinfer.bmm_fp8
  gemm_fp8_nt_groupwise  torch: dequantize per block and torch.matmul (what a user writes without
                         a block-scaled kernel); flashinfer (sm100/sm120 only: unavailable on 9.0)
  gemm_fp8_nt_blockscaled  the same dequantize-and-matmul with a's scales per 128 x 128 block too;
                         flashinfer (sm100/sm120 only)
  segment_gemm           a torch.matmul loop over the segments; torch._grouped_mm; FlashInfer's
                         SegmentGEMMWrapper
  grouped_mm             kiln's triton backend (kiln_triton); torch._grouped_mm; a torch.matmul loop
                         over the groups
  group_gemm_fp8_nt_groupwise  torch._grouped_mm on bf16 copies of the operands dequantised once,
                         outside the timing (what torch offers: it has no block-scaled fp8 grouped
                         GEMM; the MoE layer's torch pipeline); flashinfer (sm100/sm120 only)

Work counted: 2 m n k per product (FLOPs); bytes: every input and output once. Outputs given to
`out=` start as NaN, so an element a backend never writes fails the reference check.
"""

from __future__ import annotations

import functools

import torch

import kiln
from kiln.trace import gemm as gemm_traces
from kiln.trace import torch_dtype

from ..routine import Backend, Routine, cuda_only
from .norm import _flashinfer, flashinfer_version, kiln_version, torch_version

WORKSPACE_BYTES = 128 << 20


def gemm_flops(axes, dtype) -> int:
    rows = axes.get("m", axes.get("rows", 0)) * axes.get("batch", 1)
    return 2 * rows * axes["n"] * axes["k"]


def _nan_out(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _flashinfer_on(
    device: torch.device, dtype: str, dtypes=("bfloat16",), min_cc=(8, 0), max_cc=None, why=""
) -> str | None:
    if dtype not in dtypes:
        return f"FlashInfer's kernel takes {', '.join(dtypes)}, not {dtype}"
    missing = cuda_only(device) or _flashinfer()[1]
    if missing:
        return missing
    cc = torch.cuda.get_device_capability(device)
    if cc < min_cc or (max_cc is not None and cc > max_cc):
        return f"FlashInfer's kernel does not run on compute capability {cc[0]}.{cc[1]} {why}".strip()
    return None


# --- mm_bf16 / bmm_bf16 ---------------------------------------------------------------------------


def kiln_mm(inp, ctx):
    a, b = inp["a"], inp["b"]
    out = _nan_out((a.shape[0], b.shape[1]), a.dtype, a.device)
    return lambda: kiln.mm_bf16(a, b, out=out)


def kiln_mm_pdl(inp, ctx):
    """mm_bf16 launched with programmatic dependent launch (sm90+): back-to-back calls overlap
    each launch with the previous kernel's tail."""
    a, b = inp["a"], inp["b"]
    out = _nan_out((a.shape[0], b.shape[1]), a.dtype, a.device)
    return lambda: kiln.mm_bf16(a, b, pdl=True, out=out)


def torch_mm(inp, ctx):
    a, b = inp["a"], inp["b"]
    return lambda: torch.matmul(a, b)


def flashinfer_mm(inp, ctx):
    fi = _flashinfer()[0]
    a, b = inp["a"], inp["b"]
    return lambda: fi.mm_bf16(a, b, out_dtype=a.dtype, backend="cublaslt")


def kiln_bmm(inp, ctx):
    A, B = inp["A"], inp["B"]
    out = _nan_out((A.shape[0], A.shape[1], B.shape[2]), A.dtype, A.device)
    return lambda: kiln.bmm_bf16(A, B, out=out)


def torch_bmm(inp, ctx):
    A, B = inp["A"], inp["B"]
    return lambda: torch.bmm(A, B)


@functools.cache
def _cudnn() -> str | None:
    try:
        import cudnn  # noqa: F401 - FlashInfer's bmm_bf16 backend on 9.0 needs the cuDNN frontend

        return None
    except Exception as e:  # noqa: BLE001
        return f"FlashInfer's bmm_bf16 on this GPU needs the cudnn frontend: {type(e).__name__}: {e}"


def flashinfer_bmm_available(device, dtype):
    return _flashinfer_on(device, dtype) or _cudnn()


def flashinfer_bmm(inp, ctx):
    fi = _flashinfer()[0]
    A, B = inp["A"], inp["B"]
    return lambda: fi.bmm_bf16(A, B, out_dtype=A.dtype, backend="cudnn")


def _peers(kiln_setup, torch_name, torch_setup, fi_setup, fi_available, torch_available=None):
    backends = [Backend("kiln", kiln_setup, version=kiln_version)]
    if torch_setup is not None:
        backends.append(
            Backend(
                torch_name,
                torch_setup,
                version=torch_version,
                **({"available": torch_available} if torch_available else {}),
            )
        )
    if fi_setup is not None:
        backends.append(Backend("flashinfer", fi_setup, available=fi_available, version=flashinfer_version))
    return tuple(backends)


MM_BF16 = Routine(
    api=kiln.mm_bf16,
    backends=(
        *_peers(
            kiln_mm, "torch", torch_mm, flashinfer_mm, lambda device, dtype: _flashinfer_on(device, dtype)
        ),
        Backend("kiln_pdl", kiln_mm_pdl, available=cuda_only, version=kiln_version),
    ),
    flops_per_call=gemm_flops,
    max_sets=64,
)
BMM_BF16 = Routine(
    api=kiln.bmm_bf16,
    backends=_peers(kiln_bmm, "torch", torch_bmm, flashinfer_bmm, flashinfer_bmm_available),
    flops_per_call=gemm_flops,
    max_sets=64,
)

# --- bmm_fp8 / gemm_fp8_nt_groupwise ---------------------------------------------------------------


def kiln_bmm_fp8(inp, ctx):
    A, B, sa, sb = inp["A"], inp["B"], inp["A_scale"], inp["B_scale"]
    dtype = torch_dtype(ctx.dtype)
    out = _nan_out((A.shape[0], A.shape[1], B.shape[2]), dtype, A.device)
    return lambda: kiln.bmm_fp8(A, B, sa, sb, dtype, out=out)


def torch_scaled_mm(inp, ctx):
    """torch._scaled_mm (cuBLASLt fp8, per-tensor scales) on each product of the batch."""
    A, B, sa, sb = inp["A"], inp["B"], inp["A_scale"].reshape(()), inp["B_scale"].reshape(())
    dtype = torch_dtype(ctx.dtype)
    if A.shape[0] == 1:
        a, b = A[0], B[0]
        return lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=dtype).unsqueeze(0)
    return lambda: torch.stack(
        [torch._scaled_mm(A[i], B[i], scale_a=sa, scale_b=sb, out_dtype=dtype) for i in range(A.shape[0])]
    )


def flashinfer_bmm_fp8(inp, ctx):
    fi = _flashinfer()[0]
    A, B, sa, sb = inp["A"], inp["B"], inp["A_scale"], inp["B_scale"]
    dtype = torch_dtype(ctx.dtype)
    return lambda: fi.bmm_fp8(A, B, sa, sb, dtype, backend="cublas")


def kiln_groupwise(inp, ctx):
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    out = _nan_out((a.shape[0], b.shape[0]), dtype, a.device)
    mode = inp["scale_major_mode"]
    return lambda: kiln.gemm_fp8_nt_groupwise(a, b, sa, sb, mode, out=out)


def torch_groupwise(inp, ctx):
    """Dequantize each operand by its block scales into the workload dtype, then torch.matmul."""
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    m, k = a.shape
    n = b.shape[0]

    def run():
        a_deq = (a.float() * gemm_traces.expand_scales(sa.t(), m, k, 1)).to(dtype)
        b_deq = (b.float() * gemm_traces.expand_scales(sb.t(), n, k, gemm_traces.SCALE_BLOCK)).to(dtype)
        return a_deq @ b_deq.t()

    return run


def flashinfer_groupwise(inp, ctx):
    fi = _flashinfer()[0]
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    return lambda: fi.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out_dtype=dtype)


def kiln_blockscaled(inp, ctx):
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    out = _nan_out((a.shape[0], b.shape[0]), dtype, a.device)
    mode = inp["scale_major_mode"]
    return lambda: kiln.gemm_fp8_nt_blockscaled(a, b, sa, sb, mode, out=out)


def torch_blockscaled(inp, ctx):
    """Dequantize each operand by its 128 x 128 block scales into the workload dtype, then torch.matmul."""
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    m, k = a.shape
    n = b.shape[0]
    block = gemm_traces.SCALE_BLOCK

    def run():
        a_deq = (a.float() * gemm_traces.expand_scales(sa.t(), m, k, block)).to(dtype)
        b_deq = (b.float() * gemm_traces.expand_scales(sb.t(), n, k, block)).to(dtype)
        return a_deq @ b_deq.t()

    return run


def flashinfer_blockscaled(inp, ctx):
    fi = _flashinfer()[0]
    a, b, sa, sb = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"]
    dtype = torch_dtype(ctx.dtype)
    return lambda: fi.gemm_fp8_nt_blockscaled(a, b, sa, sb, "MN", out_dtype=dtype)


FP8_DTYPES = ("bfloat16", "float16")
BMM_FP8 = Routine(
    api=kiln.bmm_fp8,
    backends=_peers(
        kiln_bmm_fp8,
        "torch_scaled_mm",
        torch_scaled_mm,
        flashinfer_bmm_fp8,
        lambda device, dtype: _flashinfer_on(device, dtype, FP8_DTYPES, min_cc=(8, 9)),
        torch_available=lambda device, dtype: cuda_only(device),
    ),
    flops_per_call=gemm_flops,
    max_sets=64,
)
GEMM_FP8_NT_GROUPWISE = Routine(
    api=kiln.gemm_fp8_nt_groupwise,
    backends=_peers(
        kiln_groupwise,
        "torch_dequant",
        torch_groupwise,
        flashinfer_groupwise,
        lambda device, dtype: _flashinfer_on(
            device, dtype, FP8_DTYPES, min_cc=(10, 0), why="(its groupwise kernels are sm100/sm120)"
        ),
    ),
    flops_per_call=gemm_flops,
    max_sets=64,
)

GEMM_FP8_NT_BLOCKSCALED = Routine(
    api=kiln.gemm_fp8_nt_blockscaled,
    backends=_peers(
        kiln_blockscaled,
        "torch_dequant",
        torch_blockscaled,
        flashinfer_blockscaled,
        lambda device, dtype: _flashinfer_on(
            device, dtype, FP8_DTYPES, min_cc=(10, 0), why="(its block-scaled kernels are sm100/sm120)"
        ),
    ),
    flops_per_call=gemm_flops,
    max_sets=64,
)

# --- segment_gemm / grouped_mm -----------------------------------------------------------------------


def _workspace(ctx):
    if "workspace" not in ctx.shared:
        ctx.shared["workspace"] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)
    return ctx.shared["workspace"]


def kiln_segment(inp, ctx):
    w = kiln.SegmentGEMMWrapper(_workspace(ctx))
    x, weights, indptr, b = inp["x"], inp["weights"], inp["seg_indptr"], inp["batch_size"]
    out = _nan_out((x.shape[0], weights.shape[1]), x.dtype, x.device)
    return lambda: w.run(x, weights, b, True, out=out, seg_indptr=indptr)


def _loop(x, weights_kn, bounds: list[int]):
    """A torch.matmul per segment (the bounds read on the host outside timing)."""
    out = torch.zeros(x.shape[0], weights_kn.shape[2], dtype=x.dtype, device=x.device)
    pieces = [
        (lo, hi, weights_kn[s])
        for s, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        if hi > lo
    ]

    def run():
        for lo, hi, w in pieces:
            torch.matmul(x[lo:hi], w, out=out[lo:hi])
        return out

    return run


def torch_segment_loop(inp, ctx):
    return _loop(inp["x"], inp["weights"].transpose(1, 2), inp["seg_indptr"].tolist())


def _grouped_mm_available(device, dtype):
    if dtype != "bfloat16":
        return f"torch._grouped_mm takes bfloat16, not {dtype}"
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return "torch._grouped_mm needs compute capability 9.0+"
    return None


def torch_segment_grouped_mm(inp, ctx):
    x, weights = inp["x"], inp["weights"].transpose(1, 2)
    offs = inp["seg_indptr"][1:].to(torch.int32)
    return lambda: torch._grouped_mm(x, weights, offs=offs)


def flashinfer_segment(inp, ctx):
    fi = _flashinfer()[0]
    w = fi.SegmentGEMMWrapper(_workspace(ctx))
    x, weights, indptr, b = inp["x"], inp["weights"], inp["seg_indptr"], inp["batch_size"]
    return lambda: w.run(x, weights, b, True, seg_indptr=indptr)


SEGMENT_GEMM = Routine(
    api=kiln.SegmentGEMMWrapper.run,
    backends=(
        Backend("kiln", kiln_segment, version=kiln_version),
        Backend("torch_loop", torch_segment_loop, version=torch_version),
        Backend(
            "torch_grouped_mm",
            torch_segment_grouped_mm,
            available=_grouped_mm_available,
            version=torch_version,
        ),
        Backend(
            "flashinfer",
            flashinfer_segment,
            version=flashinfer_version,
            available=lambda device, dtype: _flashinfer_on(device, dtype, ("bfloat16", "float16")),
        ),
    ),
    flops_per_call=gemm_flops,
    max_sets=16,
)


def kiln_grouped_mm(inp, ctx):
    a, b, offs = inp["a"], inp["b"], inp["offs"]
    out = _nan_out((a.shape[0], b.shape[2]), a.dtype, a.device)
    return lambda: kiln.grouped_mm(a, b, offs, out=out)


def kiln_triton_grouped_mm(inp, ctx):
    """backend="triton": kiln's Triton kernel (ops/gemm/grouped_triton.py) through the driver."""
    a, b, offs = inp["a"], inp["b"], inp["offs"]
    out = _nan_out((a.shape[0], b.shape[2]), a.dtype, a.device)
    return lambda: kiln.grouped_mm(a, b, offs, out=out, backend="triton")


def _triton_available(device, dtype):
    import importlib.util

    if device.type != "cuda":
        return "the triton backend runs on CUDA tensors"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton==3.6.0)"
    return None


def torch_grouped_mm(inp, ctx):
    a, b, offs = inp["a"], inp["b"], inp["offs"]
    return lambda: torch._grouped_mm(a, b, offs=offs)


def torch_grouped_loop(inp, ctx):
    return _loop(inp["a"], inp["b"], [0, *inp["offs"].tolist()])


GROUPED_MM = Routine(
    api=kiln.grouped_mm,
    backends=(
        Backend("kiln", kiln_grouped_mm, version=kiln_version),
        Backend("kiln_triton", kiln_triton_grouped_mm, available=_triton_available, version=kiln_version),
        Backend("torch_grouped_mm", torch_grouped_mm, available=_grouped_mm_available, version=torch_version),
        Backend("torch_loop", torch_grouped_loop, version=torch_version),
    ),
    flops_per_call=gemm_flops,
    max_sets=16,
)


# --- group_gemm_fp8_nt_groupwise ----------------------------------------------------------------------


def kiln_group_fp8(inp, ctx):
    a, b, sa, sb, indptr = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"], inp["m_indptr"]
    out = _nan_out((a.shape[0], b.shape[1]), torch_dtype(ctx.dtype), a.device)
    mode = inp["scale_major_mode"]
    return lambda: kiln.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, scale_major_mode=mode, out=out)


def _dequant_blocks(b: torch.Tensor, sb: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """b [E, n, k] fp8 times its "MN" block scales [E, k/128, ceil(n/128)], in dtype, one expert at a
    time (no float32 copy of all of b)."""
    e, n, k = b.shape
    out = torch.empty((e, n, k), dtype=dtype, device=b.device)
    blk = gemm_traces.SCALE_BLOCK
    for i in range(e):
        full = sb[i].t().repeat_interleave(blk, 0)[:n].repeat_interleave(blk, 1)[:, :k]
        out[i] = (b[i].float() * full).to(dtype)
    return out


def torch_group_fp8(inp, ctx):
    """torch._grouped_mm on the operands dequantised to the workload dtype once (setup, untimed)."""
    a, b, sa, sb, indptr = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"], inp["m_indptr"]
    dtype = torch_dtype(ctx.dtype)
    rows, k = a.shape
    a_deq = (a.float() * gemm_traces.expand_scales(sa.t(), rows, k, 1)).to(dtype)
    b_deq = _dequant_blocks(b, sb, dtype).transpose(1, 2)
    offs = indptr[1:].to(torch.int32)
    return lambda: torch._grouped_mm(a_deq, b_deq, offs=offs)


def flashinfer_group_fp8(inp, ctx):
    fi = _flashinfer()[0]
    a, b, sa, sb, indptr = inp["a"], inp["b"], inp["a_scale"], inp["b_scale"], inp["m_indptr"]
    dtype = torch_dtype(ctx.dtype)
    return lambda: fi.group_gemm_fp8_nt_groupwise(a, b, sa, sb, indptr, out_dtype=dtype)


GROUP_GEMM_FP8_NT_GROUPWISE = Routine(
    api=kiln.group_gemm_fp8_nt_groupwise,
    backends=_peers(
        kiln_group_fp8,
        "torch_grouped_mm",
        torch_group_fp8,
        flashinfer_group_fp8,
        lambda device, dtype: _flashinfer_on(
            device, dtype, FP8_DTYPES, min_cc=(10, 0), why="(its grouped fp8 kernels are sm100/sm120)"
        ),
        torch_available=_grouped_mm_available,
    ),
    flops_per_call=gemm_flops,
    max_sets=2,  # E 256 x 4096 x 7168 weights are 7.5 GB a set
)

ROUTINES = (
    MM_BF16,
    BMM_BF16,
    BMM_FP8,
    GEMM_FP8_NT_GROUPWISE,
    GEMM_FP8_NT_BLOCKSCALED,
    SEGMENT_GEMM,
    GROUPED_MM,
    GROUP_GEMM_FP8_NT_GROUPWISE,
)
