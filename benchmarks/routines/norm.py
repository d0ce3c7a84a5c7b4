"""Routines of kiln.norm: rmsnorm, fused_add_rmsnorm, the Gemma variants, layernorm and the fp8
rmsnorm_quant, fused_add_rmsnorm_quant and layernorm_quant, each against torch (the equivalent an
eager model runs) and FlashInfer (when importable, CUDA only).

kiln's backend runs the CUDA kernels on a GPU and the host backend on the CPU. Outputs given to
`out=` start as NaN, so an element a backend never writes fails the reference check.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import kiln

from ..routine import Backend, Routine, cuda_only


def kiln_version() -> str:
    return str(kiln.__version__)


def torch_version() -> str:
    return torch.__version__


@functools.cache
def _flashinfer():
    """FlashInfer's module, or the ImportError's text (FlashInfer is an optional peer)."""
    try:
        import flashinfer

        return flashinfer, None
    except Exception as e:  # noqa: BLE001 - any failure to import means "not here"
        return None, f"flashinfer is not importable: {type(e).__name__}: {e}"


def flashinfer_available(device: torch.device, dtype: str) -> str | None:
    if dtype not in ("float16", "bfloat16"):
        return f"FlashInfer's norm kernels take float16 and bfloat16, not {dtype}"
    return cuda_only(device) or _flashinfer()[1]


def flashinfer_version() -> str:
    fi = _flashinfer()[0]
    return getattr(fi, "__version__", "") if fi else ""


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


# --- rmsnorm / gemma_rmsnorm: out = input * rsqrt(mean(input^2) + eps) * (offset + weight)


def kiln_rmsnorm(api):
    def setup(inp, ctx):
        x, w, eps, out = inp["input"], inp["weight"], inp["eps"], _poisoned(inp["input"])
        return lambda: api(x, w, eps=eps, out=out)

    return setup


def torch_rmsnorm(inp, ctx):
    x, w, eps = inp["input"], inp["weight"], inp["eps"]
    return lambda: F.rms_norm(x, (x.shape[-1],), w, eps=eps)


def torch_gemma_rmsnorm(inp, ctx):
    # Gemma's reference implementation: normalise in float32, scale by (1 + weight), round once.
    x, w, eps = inp["input"], inp["weight"], inp["eps"]
    return lambda: (F.rms_norm(x.float(), (x.shape[-1],), eps=eps) * (1.0 + w.float())).to(x.dtype)


def flashinfer_rmsnorm(name):
    def setup(inp, ctx):
        fn = getattr(_flashinfer()[0].norm, name)
        x, w, eps, out = inp["input"], inp["weight"], inp["eps"], _poisoned(inp["input"])
        return lambda: fn(x, w, eps=eps, out=out)

    return setup


# --- fused_add_rmsnorm / gemma_fused_add_rmsnorm: in place, residual += input; input = norm


def kiln_fused(api):
    def setup(inp, ctx):
        x, r, w, eps = inp["input"], inp["residual"], inp["weight"], inp["eps"]

        def run():
            api(x, r, w, eps=eps)
            return x, r

        return run

    return setup


def torch_fused(gemma: bool):
    def setup(inp, ctx):
        x, r, w, eps = inp["input"], inp["residual"], inp["weight"], inp["eps"]
        hidden = (x.shape[-1],)

        def run():
            r.add_(x)
            if gemma:
                x.copy_(F.rms_norm(r.float(), hidden, eps=eps) * (1.0 + w.float()))
            else:
                x.copy_(F.rms_norm(r, hidden, w, eps=eps))
            return x, r

        return run

    return setup


def flashinfer_fused(name):
    def setup(inp, ctx):
        fn = getattr(_flashinfer()[0].norm, name)
        x, r, w, eps = inp["input"], inp["residual"], inp["weight"], inp["eps"]

        def run():
            fn(x, r, w, eps=eps)
            return x, r

        return run

    return setup


def _backends(kiln_setup, torch_setup, flashinfer_setup):
    return (
        Backend("kiln", kiln_setup, version=kiln_version),
        Backend("torch", torch_setup, version=torch_version),
        Backend("flashinfer", flashinfer_setup, available=flashinfer_available, version=flashinfer_version),
    )


def norm_flops(fused: bool):
    """~4 FLOPs per element (square, accumulate, scale, weight), +1 for the residual add."""
    return lambda axes, dtype: (5 if fused else 4) * axes["tokens"] * axes["hidden"]


RMSNORM = Routine(
    api=kiln.rmsnorm,
    backends=_backends(kiln_rmsnorm(kiln.rmsnorm), torch_rmsnorm, flashinfer_rmsnorm("rmsnorm")),
    flops_per_call=norm_flops(False),
)
FUSED_ADD_RMSNORM = Routine(
    api=kiln.fused_add_rmsnorm,
    backends=_backends(kiln_fused(kiln.fused_add_rmsnorm), torch_fused(False),
                       flashinfer_fused("fused_add_rmsnorm")),
    flops_per_call=norm_flops(True),
)
GEMMA_RMSNORM = Routine(
    api=kiln.gemma_rmsnorm,
    backends=_backends(kiln_rmsnorm(kiln.gemma_rmsnorm), torch_gemma_rmsnorm,
                       flashinfer_rmsnorm("gemma_rmsnorm")),
    flops_per_call=norm_flops(False),
)
GEMMA_FUSED_ADD_RMSNORM = Routine(
    api=kiln.gemma_fused_add_rmsnorm,
    backends=_backends(kiln_fused(kiln.gemma_fused_add_rmsnorm), torch_fused(True),
                       flashinfer_fused("gemma_fused_add_rmsnorm")),
    flops_per_call=norm_flops(True),
)



# --- layernorm: out = (input - mean) / sqrt(var + eps) * gemma + beta, gemma/beta float32


def kiln_layernorm(inp, ctx):
    x, g, b, eps = inp["input"], inp["gemma"], inp["beta"], inp["eps"]
    return lambda: kiln.layernorm(x, g, b, eps=eps)


def torch_layernorm(inp, ctx):
    # In float32 with the float32 parameters, rounded once: F.layer_norm in bf16 would need the
    # parameters rounded to bf16 first, which misses the reference by more than its tolerance.
    x, g, b, eps = inp["input"], inp["gemma"], inp["beta"], inp["eps"]
    return lambda: F.layer_norm(x.float(), (x.shape[-1],), g, b, eps=eps).to(x.dtype)


def flashinfer_layernorm_available(device: torch.device, dtype: str) -> str | None:
    if dtype != "bfloat16":
        return f"FlashInfer's layernorm takes bfloat16 only, not {dtype}"
    return cuda_only(device) or _flashinfer()[1]


def flashinfer_layernorm(inp, ctx):
    fn = _flashinfer()[0].norm.layernorm
    x, g, b, eps = inp["input"], inp["gemma"], inp["beta"], inp["eps"]
    return lambda: fn(x, g, b, eps)


LAYERNORM = Routine(
    api=kiln.layernorm,
    backends=(
        Backend("kiln", kiln_layernorm, version=kiln_version),
        Backend("torch", torch_layernorm, version=torch_version),
        Backend("flashinfer", flashinfer_layernorm, available=flashinfer_layernorm_available,
                version=flashinfer_version),
    ),
    # ~7 FLOPs per element: sum, centre, square, accumulate, normalise, scale, shift.
    flops_per_call=lambda axes, dtype: 7 * axes["tokens"] * axes["hidden"],
)



# --- the fp8 forms: out = fp8(norm(input) / scale), a static per-tensor scale


def _poisoned_fp8(t: torch.Tensor) -> torch.Tensor:
    return torch.full(t.shape, 0x7F, dtype=torch.uint8, device=t.device).view(t.dtype)  # NaN


def _fp8_of(y: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    top = torch.finfo(dtype).max
    return (y * scale.reciprocal()).clamp(-top, top).to(dtype)


def kiln_rmsnorm_quant(inp, ctx):
    x, w, s, eps, out = inp["input"], inp["weight"], inp["scale"], inp["eps"], _poisoned_fp8(inp["out"])

    def run():
        kiln.rmsnorm_quant(out, x, w, s, eps)
        return out

    return run


def torch_rmsnorm_quant(inp, ctx):
    x, w, s, eps, dtype = inp["input"], inp["weight"], inp["scale"], inp["eps"], inp["out"].dtype
    return lambda: _fp8_of(F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps=eps), s, dtype)


def flashinfer_rmsnorm_quant(inp, ctx):
    fn = _flashinfer()[0].norm.rmsnorm_quant
    x, w, s, eps, out = inp["input"], inp["weight"], inp["scale"], inp["eps"], _poisoned_fp8(inp["out"])

    def run():
        fn(out, x, w, s, eps)
        return out

    return run


def kiln_fused_quant(inp, ctx):
    x, r, w, s, eps = inp["input"], inp["residual"], inp["weight"], inp["scale"], inp["eps"]
    out = _poisoned_fp8(inp["out"])

    def run():
        kiln.fused_add_rmsnorm_quant(out, x, r, w, s, eps)
        return out, r

    return run


def torch_fused_quant(inp, ctx):
    x, r, w, s, eps, dtype = (inp["input"], inp["residual"], inp["weight"], inp["scale"], inp["eps"],
                              inp["out"].dtype)

    def run():
        r.add_(x)
        return _fp8_of(F.rms_norm(r.float(), (x.shape[-1],), w.float(), eps=eps), s, dtype), r

    return run


def flashinfer_fused_quant(inp, ctx):
    fn = _flashinfer()[0].norm.fused_add_rmsnorm_quant
    x, r, w, s, eps = inp["input"], inp["residual"], inp["weight"], inp["scale"], inp["eps"]
    out = _poisoned_fp8(inp["out"])

    def run():
        fn(out, x, r, w, s, eps)
        return out, r

    return run


def kiln_layernorm_quant(inp, ctx):
    x, g, b, s, eps, out = (inp["input"], inp["gemma"], inp["beta"], inp["scale"], inp["eps"],
                            _poisoned_fp8(inp["out"]))

    def run():
        kiln.layernorm_quant(out, x, g, b, s, eps)
        return out

    return run


def torch_layernorm_quant(inp, ctx):
    x, g, b, s, eps = inp["input"], inp["gemma"], inp["beta"], inp["scale"], inp["eps"]
    dtype = inp["out"].dtype
    return lambda: _fp8_of(F.layer_norm(x.float(), (x.shape[-1],), g, b, eps=eps), s, dtype)


def flashinfer_layernorm_quant(inp, ctx):
    fn = _flashinfer()[0].norm.layernorm_quant
    x, g, b, s, eps, out = (inp["input"], inp["gemma"], inp["beta"], inp["scale"], inp["eps"],
                            _poisoned_fp8(inp["out"]))

    def run():
        fn(out, x, g, b, s, eps)
        return out

    return run


def quant_bytes(fused: bool):
    """Read the input (and residual) once, write one byte an element (and the residual)."""
    def count(axes, dtype):
        n = axes["tokens"] * axes["hidden"]
        elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        return n * elem * (3 if fused else 1) + n + axes["hidden"] * elem

    return count


RMSNORM_QUANT = Routine(
    api=kiln.rmsnorm_quant,
    backends=_backends(kiln_rmsnorm_quant, torch_rmsnorm_quant, flashinfer_rmsnorm_quant),
    bytes_per_call=quant_bytes(False),
    flops_per_call=lambda axes, dtype: 5 * axes["tokens"] * axes["hidden"],
)
FUSED_ADD_RMSNORM_QUANT = Routine(
    api=kiln.fused_add_rmsnorm_quant,
    backends=_backends(kiln_fused_quant, torch_fused_quant, flashinfer_fused_quant),
    bytes_per_call=quant_bytes(True),
    flops_per_call=lambda axes, dtype: 6 * axes["tokens"] * axes["hidden"],
)
LAYERNORM_QUANT = Routine(
    api=kiln.layernorm_quant,
    backends=(
        Backend("kiln", kiln_layernorm_quant, version=kiln_version),
        Backend("torch", torch_layernorm_quant, version=torch_version),
        Backend("flashinfer", flashinfer_layernorm_quant, available=flashinfer_layernorm_available,
                version=flashinfer_version),
    ),
    flops_per_call=lambda axes, dtype: 8 * axes["tokens"] * axes["hidden"],
)

ROUTINES = (RMSNORM, FUSED_ADD_RMSNORM, GEMMA_RMSNORM, GEMMA_FUSED_ADD_RMSNORM, LAYERNORM, RMSNORM_QUANT,
            FUSED_ADD_RMSNORM_QUANT, LAYERNORM_QUANT)
