"""RMSNorm and friends (//ops:norm), with FlashInfer's names and argument order.

    rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)
                                                out = input * rsqrt(mean(input^2) + eps) * weight
    fused_add_rmsnorm(input, residual, weight, eps, enable_pdl)
                                                residual += input; input = rmsnorm(residual)
    gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)    ... * (1 + weight)
    gemma_fused_add_rmsnorm(input, residual, weight, eps, enable_pdl)
    layernorm(input, gemma, beta, eps=1e-6)     out = (input - mean) / sqrt(var + eps) * gemma + beta
    rmsnorm_quant(out, input, weight, scale, eps=1e-6, enable_pdl=None)
                                                out = fp8(rmsnorm(input, weight) / scale)
    fused_add_rmsnorm_quant(out, input, residual, weight, scale, eps=1e-6, enable_pdl=None)
                                                residual += input; out = fp8(rmsnorm(residual) / scale)
    layernorm_quant(out, input, gemma, beta, scale, eps=1e-6)
                                                out = fp8(layernorm(input, gemma, beta) / scale)

input: [tokens, hidden] or [batch, seq, hidden], float32/float16/bfloat16, contiguous in its last
dimension (leading strides are free); weight: [hidden], same dtype (LayerNorm's gemma and beta:
[hidden], float32). CUDA tensors run the CUDA
kernels, CPU tensors the host backend. Statistics are accumulated in float32; the fused variants
round the residual sum to the input dtype before normalising it, exactly as the unfused sequence
would.

The *_quant ops write an fp8 `out` (float8_e4m3fn or float8_e5m2, input's shape): the float32
result times 1 / scale, rounded to nearest even and saturated to the format's largest finite value
(+-448, +-57344; NaN stays NaN). `scale` is a one-element tensor (shape () or (1,), read by the
kernel, so a CUDA graph replays whatever it holds) or a Python float.

enable_pdl (FlashInfer's): programmatic dependent launch, resolved by kiln.utils.use_pdl: None (the
default) and True launch with it on sm90+ GPUs, False never; CPU tensors and older GPUs ignore it.

Each function is a torch custom op (kiln::rmsnorm, kiln::fused_add_rmsnorm, kiln/_ops.py) with a
fake implementation, so torch.compile(fullgraph=True) traces it; in eager mode the launcher is
called directly (no dispatcher overhead). Launches go to the caller's current stream, so CUDA-graph
capture works once the module has been loaded by an earlier call.

API logging (kiln/api_logging.py) covers both ways in: the public functions in eager mode, and the
custom ops, which is what a compiled graph calls at run time.
"""

from __future__ import annotations

import numbers

import torch

from . import _pdl
from ._entries import entry_op
from .api_logging import logged_api
from .trace import norm as norm_traces
from .trace import traced

LABEL = "//ops:norm"


def _check_tensors(api: str, names: str, *tensors) -> None:
    """Each of `tensors` is a torch.Tensor, else a TypeError naming it (`names`: theirs, comma-
    separated; split only on failure: this runs on every call)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            for name, value in zip(names.split(", "), tensors, strict=True):
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(value).__name__}")


# The ops and their launchers, from the entries in ops/norm/BUILD.py (the binding's signatures):
#   kiln::rmsnorm(out, input, weight, eps, weight_offset, pdl)
#   kiln::fused_add_rmsnorm(input, residual, weight, eps, weight_offset, pdl)   (input, residual written)
#   kiln::layernorm(out, input, gemma, beta, eps)
#   kiln::rmsnorm_quant(out, input, weight, scale, scale_value, eps, pdl)
#   kiln::fused_add_rmsnorm_quant(out, input, residual, weight, scale, scale_value, eps, pdl)
#   kiln::layernorm_quant(out, input, gemma, beta, scale, scale_value, eps)
_rmsnorm_op = entry_op(LABEL, "rmsnorm")
_fused_add_rmsnorm_op = entry_op(LABEL, "fused_add_rmsnorm")
_layernorm_op = entry_op(LABEL, "layernorm")
_rmsnorm_quant_op = entry_op(LABEL, "rmsnorm_quant")
_fused_add_rmsnorm_quant_op = entry_op(LABEL, "fused_add_rmsnorm_quant")
_layernorm_quant_op = entry_op(LABEL, "layernorm_quant")


def _rmsnorm(input, weight, eps, out, weight_offset, enable_pdl):
    _check_tensors("kiln.rmsnorm", "input, weight", input, weight)
    if out is None:
        out = torch.empty_like(input)
    _rmsnorm_op(out, input, weight, eps, weight_offset, _pdl.resolve(enable_pdl, input.device))
    return out


def _fused_add_rmsnorm(input, residual, weight, eps, weight_offset, enable_pdl):
    _check_tensors("kiln.fused_add_rmsnorm", "input, residual, weight", input, residual, weight)
    _fused_add_rmsnorm_op(input, residual, weight, eps, weight_offset, _pdl.resolve(enable_pdl, input.device))


def _scale(api: str, scale, input: torch.Tensor) -> tuple[torch.Tensor | None, float]:
    """(tensor, 1.0) for a one-element scale tensor (as float32 on input's device, as FlashInfer
    converts it), (None, value) for a Python number."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dim() > 1:
            raise ValueError(
                f"{api}: scale must be a tensor of shape () or (1,), got shape {list(scale.shape)}")
        if scale.dtype != torch.float32 or scale.device != input.device:
            scale = scale.to(device=input.device, dtype=torch.float32)
        return scale, 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"{api}: scale must be a tensor of one element or a number, got {type(scale).__name__}")
    return None, float(scale)


@logged_api(mutates=("out",))
@traced(norm_traces.RMSNORM)
def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension.

    ``out[..., j] = input[..., j] / sqrt(mean(input[..., :] ** 2) + eps) * weight[j]``

    Args:
        input: ``[tokens, hidden]`` or ``[batch, seq, hidden]``; float32, float16 or bfloat16.
        weight: ``[hidden]``, the dtype of ``input``.
        eps: added to the mean square before the square root.
        out: optional output of ``input``'s shape and dtype (may be ``input`` itself).
        enable_pdl: programmatic dependent launch (FlashInfer's switch): None (default) and True
            use it on sm90+ GPUs, False never; ignored on CPU tensors and older GPUs.

    Returns:
        ``out`` (a new tensor when not given).
    """
    return _rmsnorm(input, weight, eps, out, 0.0, enable_pdl)


@logged_api(mutates=("input", "residual"))
@traced(norm_traces.FUSED_ADD_RMSNORM)
def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    ``residual`` has ``input``'s shape and dtype and must not overlap it. ``enable_pdl`` as
    :func:`rmsnorm`.
    """
    _fused_add_rmsnorm(input, residual, weight, eps, 0.0, enable_pdl)


@logged_api(mutates=("out",))
@traced(norm_traces.GEMMA_RMSNORM)
def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """Gemma's RMSNorm: ``input / sqrt(mean(input ** 2) + eps) * (1 + weight)``. Arguments as
    :func:`rmsnorm`."""
    return _rmsnorm(input, weight, eps, out, 1.0, enable_pdl)


@logged_api(mutates=("input", "residual"))
@traced(norm_traces.GEMMA_FUSED_ADD_RMSNORM)
def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """In place: ``residual += input``, then ``input = gemma_rmsnorm(residual, weight, eps)``."""
    _fused_add_rmsnorm(input, residual, weight, eps, 1.0, enable_pdl)


@logged_api(mutates=("out",))
@traced(norm_traces.RMSNORM_QUANT)
def rmsnorm_quant(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | float,
                  eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """RMSNorm quantised to fp8, in one pass: ``out = fp8(rmsnorm(input, weight, eps) / scale)``.

    The float32 result is multiplied by ``1 / scale`` and rounded to ``out``'s format (nearest
    even), saturating at its largest finite value (+-448 for E4M3, +-57344 for E5M2); NaN stays NaN.

    Args:
        out: the output, written: ``input``'s shape, ``torch.float8_e4m3fn`` or
            ``torch.float8_e5m2``, contiguous in its last dimension.
        input: ``[tokens, hidden]`` or ``[batch, seq, hidden]``; float32, float16 or bfloat16.
        weight: ``[hidden]``, the dtype of ``input``.
        scale: the quantisation scale: a one-element tensor (shape ``()`` or ``(1,)``, converted to
            float32 on ``input``'s device; the kernel reads it, so a CUDA graph replays its current
            value), or a number (FlashInfer deprecates numbers; kiln takes them as they are).
        eps: added to the mean square before the square root.
        enable_pdl: as :func:`rmsnorm`.
    """
    api = "kiln.rmsnorm_quant"
    _check_tensors(api, "out, input, weight", out, input, weight)
    scale_t, scale_v = _scale(api, scale, input)
    _rmsnorm_quant_op(out, input, weight, scale_t, scale_v, eps, _pdl.resolve(enable_pdl, input.device))


@logged_api(mutates=("out", "residual"))
@traced(norm_traces.FUSED_ADD_RMSNORM_QUANT)
def fused_add_rmsnorm_quant(out: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,
                            weight: torch.Tensor, scale: torch.Tensor | float, eps: float = 1e-6,
                            enable_pdl: bool | None = None) -> None:
    """``residual += input`` in place (rounded to the dtype, as :func:`fused_add_rmsnorm`), then
    ``out = fp8(rmsnorm(residual, weight, eps) / scale)``; ``input`` is left as it is.

    ``out``, ``scale`` and ``enable_pdl`` as :func:`rmsnorm_quant`; ``residual`` has ``input``'s
    shape and dtype and must not overlap it or ``out``.
    """
    api = "kiln.fused_add_rmsnorm_quant"
    _check_tensors(api, "out, input, residual, weight", out, input, residual, weight)
    scale_t, scale_v = _scale(api, scale, input)
    _fused_add_rmsnorm_quant_op(out, input, residual, weight, scale_t, scale_v, eps,
                                _pdl.resolve(enable_pdl, input.device))


@logged_api
@traced(norm_traces.LAYERNORM)
def layernorm(input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor,
              eps: float = 1e-6) -> torch.Tensor:
    """Layer normalisation over the last dimension.

    ``out[..., j] = (input[..., j] - mean) / sqrt(var + eps) * gemma[j] + beta[j]``, with the mean
    and the biased (population) variance of each row, accumulated in float32.

    Args:
        input: ``[tokens, hidden]`` or ``[batch, seq, hidden]``; float32, float16 or bfloat16,
            contiguous in its last dimension (leading strides are free).
        gemma: ``[hidden]`` float32, the scale.
        beta: ``[hidden]`` float32, the shift.
        eps: added to the variance before the square root.

    Returns:
        A new tensor of ``input``'s shape and dtype.
    """
    _check_tensors("kiln.layernorm", "input, gemma, beta", input, gemma, beta)
    out = torch.empty_like(input)
    _layernorm_op(out, input, gemma, beta, eps)
    return out


@logged_api(mutates=("out",))
@traced(norm_traces.LAYERNORM_QUANT)
def layernorm_quant(out: torch.Tensor, input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor,
                    scale: torch.Tensor | float, eps: float = 1e-6) -> None:
    """LayerNorm quantised to fp8, in one pass: ``out = fp8(layernorm(input, gemma, beta, eps) /
    scale)``, rounded and saturated as :func:`rmsnorm_quant` (from the float32 result: kiln does
    not round to ``input``'s dtype first).

    ``input``, ``gemma``, ``beta`` and ``eps`` as :func:`layernorm`; ``out`` and ``scale`` as
    :func:`rmsnorm_quant`.
    """
    api = "kiln.layernorm_quant"
    _check_tensors(api, "out, input, gemma, beta", out, input, gemma, beta)
    scale_t, scale_v = _scale(api, scale, input)
    _layernorm_quant_op(out, input, gemma, beta, scale_t, scale_v, eps)
