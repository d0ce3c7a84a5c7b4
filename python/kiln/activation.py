"""Gated activations of a GLU MLP (//ops:activation), with FlashInfer's names and argument order.

    silu_and_mul(input, out=None, enable_pdl=None)       out = silu(input[..., :d]) * input[..., d:]
    gelu_and_mul(input, out=None, enable_pdl=None)       out = gelu(input[..., :d]) * input[..., d:]  (erf)
    gelu_tanh_and_mul(input, out=None, enable_pdl=None)  out = gelu_tanh(input[..., :d]) * input[..., d:]

input: [..., 2d], float32/float16/bfloat16, contiguous in its last dimension, its leading
dimensions folding into one row stride (a strided view of a wider tensor works); out: [..., d], the
dtype of input. Any d. The activation and the product are computed in float32 and rounded once.

Each function is a torch custom op (kiln::act_and_mul) with a fake implementation, so
torch.compile(fullgraph=True) traces it; launches go to the caller's current stream.

enable_pdl (FlashInfer's): programmatic dependent launch, resolved by kiln.utils.use_pdl: None (the
default) and True launch with it on sm90+ GPUs, False never; CPU tensors and older GPUs ignore it.
"""

from __future__ import annotations

import torch

from . import _pdl
from ._entries import entry_op
from .api_logging import logged_api
from .trace import activation as activation_traces
from .trace import traced

LABEL = "//ops:activation"
# kiln::act_and_mul(out, input, act, pdl): the op and its launcher, from the entry in the BUILD file
_act_and_mul_op = entry_op(LABEL, "act_and_mul")


def _act_and_mul(act: str, input, out, enable_pdl):
    api = f"kiln.{act}_and_mul"
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{api}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() < 1 or input.shape[-1] % 2:
        raise ValueError(f"{api}: input.shape[-1] must be even (2 * d), got shape {list(input.shape)}")
    if out is None:
        out = torch.empty((*input.shape[:-1], input.shape[-1] // 2), dtype=input.dtype, device=input.device)
    elif not isinstance(out, torch.Tensor):
        raise TypeError(f"{api}: out must be a torch.Tensor, got {type(out).__name__}")
    _act_and_mul_op(out, input, act, _pdl.resolve(enable_pdl, input.device))
    return out


@logged_api(mutates=("out",))
@traced(activation_traces.SILU_AND_MUL)
def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                 enable_pdl: bool | None = None) -> torch.Tensor:
    """SwiGLU's gate: ``out = silu(input[..., :d]) * input[..., d:]``, ``silu(x) = x / (1 + e^-x)``.

    Args:
        input: ``[..., 2d]``; float32, float16 or bfloat16.
        out: optional ``[..., d]`` output of ``input``'s dtype (must not overlap ``input``).
        enable_pdl: programmatic dependent launch (FlashInfer's switch): None (default) and True
            use it on sm90+ GPUs, False never; ignored on CPU tensors and older GPUs.

    Returns:
        ``out`` (a new tensor when not given).
    """
    return _act_and_mul("silu", input, out, enable_pdl)


@logged_api(mutates=("out",))
@traced(activation_traces.GELU_AND_MUL)
def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                 enable_pdl: bool | None = None) -> torch.Tensor:
    """GeGLU with the exact GELU: ``out = gelu(input[..., :d]) * input[..., d:]``,
    ``gelu(x) = x / 2 * (1 + erf(x / sqrt(2)))``. Arguments as :func:`silu_and_mul`."""
    return _act_and_mul("gelu", input, out, enable_pdl)


@logged_api(mutates=("out",))
@traced(activation_traces.GELU_TANH_AND_MUL)
def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                      enable_pdl: bool | None = None) -> torch.Tensor:
    """GeGLU with the tanh approximation: ``out = gelu_tanh(input[..., :d]) * input[..., d:]``,
    ``gelu_tanh(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``. Arguments as
    :func:`silu_and_mul`."""
    return _act_and_mul("gelu_tanh", input, out, enable_pdl)
