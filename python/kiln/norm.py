"""RMSNorm and friends (//ops:norm), with FlashInfer's names and argument order.

    rmsnorm(input, weight, eps=1e-6, out=None)          out = input * rsqrt(mean(input^2) + eps) * weight
    fused_add_rmsnorm(input, residual, weight, eps)     residual += input; input = rmsnorm(residual)
    gemma_rmsnorm(input, weight, eps=1e-6, out=None)    ... * (1 + weight)
    gemma_fused_add_rmsnorm(input, residual, weight, eps)
    layernorm(input, gemma, beta, eps=1e-6)             out = (input - mean) / sqrt(var + eps) * gemma + beta

input: [tokens, hidden] or [batch, seq, hidden], float32/float16/bfloat16, contiguous in its last
dimension (leading strides are free); weight: [hidden], same dtype (LayerNorm's gemma and beta:
[hidden], float32). CUDA tensors run the CUDA
kernels, CPU tensors the host backend. Statistics are accumulated in float32; the fused variants
round the residual sum to the input dtype before normalising it, exactly as the unfused sequence
would.

Each function is a torch custom op (kiln::rmsnorm, kiln::fused_add_rmsnorm, kiln/_ops.py) with a
fake implementation, so torch.compile(fullgraph=True) traces it; in eager mode the launcher is
called directly (no dispatcher overhead). Launches go to the caller's current stream, so CUDA-graph
capture works once the module has been loaded by an earlier call.

API logging (kiln/api_logging.py) covers both ways in: the public functions in eager mode, and the
custom ops, which is what a compiled graph calls at run time.
"""

from __future__ import annotations

import torch

from . import _jit
from ._ops import custom_op
from .api_logging import logged_api
from .trace import norm as norm_traces
from .trace import traced

LABEL = "//ops:norm"
_NAMES = {"dtype": "input.dtype"}  # how a dispatch error names the argument


def _check_tensors(api: str, **tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")


@custom_op("rmsnorm", mutates=("out",))
def _rmsnorm_op(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float,
                weight_offset: float) -> None:
    mod = _jit.module(LABEL, input.device, "kiln.rmsnorm", dtype=input.dtype, names=_NAMES)
    mod.rmsnorm(out=_jit.dl(out), input=_jit.dl(input), weight=_jit.dl(weight), eps=eps,
                weight_offset=weight_offset, stream=_jit.stream_of(input.device))


@custom_op("fused_add_rmsnorm", mutates=("input", "residual"))
def _fused_add_rmsnorm_op(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float, weight_offset: float) -> None:
    mod = _jit.module(LABEL, input.device, "kiln.fused_add_rmsnorm", dtype=input.dtype, names=_NAMES)
    mod.fused_add_rmsnorm(input=_jit.dl(input), residual=_jit.dl(residual), weight=_jit.dl(weight),
                          eps=eps, weight_offset=weight_offset, stream=_jit.stream_of(input.device))


@custom_op("layernorm", mutates=("out",))
def _layernorm_op(out: torch.Tensor, input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor,
                  eps: float) -> None:
    mod = _jit.module(LABEL, input.device, "kiln.layernorm", dtype=input.dtype, names=_NAMES)
    mod.layernorm(out=_jit.dl(out), input=_jit.dl(input), gemma=_jit.dl(gemma), beta=_jit.dl(beta), eps=eps,
                  stream=_jit.stream_of(input.device))


def _rmsnorm(input, weight, eps, out, weight_offset):
    _check_tensors("kiln.rmsnorm", input=input, weight=weight)
    if out is None:
        out = torch.empty_like(input)
    _rmsnorm_op(out, input, weight, eps, weight_offset)
    return out


def _fused_add_rmsnorm(input, residual, weight, eps, weight_offset):
    _check_tensors("kiln.fused_add_rmsnorm", input=input, residual=residual, weight=weight)
    _fused_add_rmsnorm_op(input, residual, weight, eps, weight_offset)


@logged_api(mutates=("out",))
@traced(norm_traces.RMSNORM)
def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension.

    ``out[..., j] = input[..., j] / sqrt(mean(input[..., :] ** 2) + eps) * weight[j]``

    Args:
        input: ``[tokens, hidden]`` or ``[batch, seq, hidden]``; float32, float16 or bfloat16.
        weight: ``[hidden]``, the dtype of ``input``.
        eps: added to the mean square before the square root.
        out: optional output of ``input``'s shape and dtype (may be ``input`` itself).

    Returns:
        ``out`` (a new tensor when not given).
    """
    return _rmsnorm(input, weight, eps, out, 0.0)


@logged_api(mutates=("input", "residual"))
@traced(norm_traces.FUSED_ADD_RMSNORM)
def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    ``residual`` has ``input``'s shape and dtype and must not overlap it.
    """
    _fused_add_rmsnorm(input, residual, weight, eps, 0.0)


@logged_api(mutates=("out",))
@traced(norm_traces.GEMMA_RMSNORM)
def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gemma's RMSNorm: ``input / sqrt(mean(input ** 2) + eps) * (1 + weight)``."""
    return _rmsnorm(input, weight, eps, out, 1.0)


@logged_api(mutates=("input", "residual"))
@traced(norm_traces.GEMMA_FUSED_ADD_RMSNORM)
def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6) -> None:
    """In place: ``residual += input``, then ``input = gemma_rmsnorm(residual, weight, eps)``."""
    _fused_add_rmsnorm(input, residual, weight, eps, 1.0)


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
    _check_tensors("kiln.layernorm", input=input, gemma=gemma, beta=beta)
    out = torch.empty_like(input)
    _layernorm_op(out, input, gemma, beta, eps)
    return out
