"""fp8 (E4M3) quantisation of activations (//ops:quantization), with SGLang's and vLLM's names.

    per_token_group_quant_fp8(x, group_size=128, column_major_scales=False) -> (x_q, x_s)
    scaled_fp8_quant(x, scale=None) -> (x_q, scale)

    scale = absmax / 448          (float32; 448 is float8_e4m3fn's largest finite value)
    x_q   = e4m3(x / scale)       (float32 division, round to nearest even, saturated at +-448;
                                   0 where scale == 0, so an all-zero group never gives NaN)

x: [..., hidden], float32/float16/bfloat16, contiguous in its last dimension, its leading
dimensions folding into one row stride. per_token_group_quant_fp8 gives one scale per group of
group_size consecutive elements of a row (DeepSeek-V3's 1 x 128 activation scales, what
gemm_fp8_nt_groupwise reads); scaled_fp8_quant one per tensor, the tensor's own (dynamic) when
`scale` is None. The results are bit-exact against a torch evaluation of the same formula
(kiln.trace.quantization). NaN inputs give NaN outputs.

Each function is a torch custom op (kiln::per_token_group_quant_fp8, kiln::scaled_fp8_quant_dynamic,
kiln::scaled_fp8_quant_static) with a fake implementation; launches go to the caller's stream.
"""

from __future__ import annotations

import torch

from . import _jit
from ._ops import custom_op
from .api_logging import logged_api
from .trace import quantization as quant_traces
from .trace import traced

LABEL = "//ops:quantization"
_NAMES = {"dtype": "x.dtype"}
FP8 = torch.float8_e4m3fn


def _bytes(t: torch.Tensor):
    # fp8 tensors travel as uint8 views: not every torch build exports fp8 through DLPack.
    return _jit.dl(t.view(torch.uint8))


@custom_op("per_token_group_quant_fp8", mutates=("out", "scales"))
def _group_op(out: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, group_size: int) -> None:
    mod = _jit.module(LABEL, x.device, "kiln.per_token_group_quant_fp8", dtype=x.dtype, names=_NAMES)
    mod.per_token_group_quant(out=_bytes(out), scales=_jit.dl(scales), input=_jit.dl(x),
                              group_size=group_size, stream=_jit.stream_of(x.device))


@custom_op("scaled_fp8_quant_dynamic", mutates=("out", "scale"))
def _dynamic_op(out: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> None:
    mod = _jit.module(LABEL, x.device, "kiln.scaled_fp8_quant", dtype=x.dtype, names=_NAMES)
    mod.scaled_fp8_quant(out=_bytes(out), scale=_jit.dl(scale), input=_jit.dl(x), dynamic=True,
                         stream=_jit.stream_of(x.device))


@custom_op("scaled_fp8_quant_static", mutates=("out",))
def _static_op(out: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> None:
    mod = _jit.module(LABEL, x.device, "kiln.scaled_fp8_quant", dtype=x.dtype, names=_NAMES)
    mod.scaled_fp8_quant(out=_bytes(out), scale=_jit.dl(scale), input=_jit.dl(x), dynamic=False,
                         stream=_jit.stream_of(x.device))


def _check_x(api: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{api}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{api}: x must have at least 1 dimension, got a scalar")


@logged_api
@traced(quant_traces.PER_TOKEN_GROUP_QUANT_FP8)
def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = 128,
                              column_major_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each group of ``group_size`` consecutive elements of a row to float8_e4m3fn.

    Args:
        x: ``[..., hidden]``, float32, float16 or bfloat16; ``hidden % group_size == 0``.
        group_size: elements per scale (128: DeepSeek-V3).
        column_major_scales: the scales of a 2-D ``x`` stored column-major (``[tokens, groups]``
            with strides ``(1, tokens)``), the layout groupwise fp8 GEMMs read.

    Returns:
        ``(x_q, x_s)``: ``x_q`` of ``x``'s shape in float8_e4m3fn, ``x_s`` ``[..., hidden /
        group_size]`` float32 with ``x_s = absmax(group) / 448``.
    """
    api = "kiln.per_token_group_quant_fp8"
    _check_x(api, x)
    if group_size <= 0 or x.shape[-1] % group_size:
        raise ValueError(f"{api}: group_size must be > 0 and divide x.shape[-1] ({x.shape[-1]}), "
                         f"got {group_size}")
    groups = x.shape[-1] // group_size
    if column_major_scales:
        if x.dim() != 2:
            raise ValueError(f"{api}: column_major_scales needs a 2-D x, got shape {list(x.shape)}")
        scales = torch.empty((groups, x.shape[0]), dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty((*x.shape[:-1], groups), dtype=torch.float32, device=x.device)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    _group_op(out, scales, x, group_size)
    return out, scales


@logged_api
@traced(quant_traces.SCALED_FP8_QUANT)
def scaled_fp8_quant(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a tensor to float8_e4m3fn with one scale.

    Args:
        x: ``[..., hidden]``, float32, float16 or bfloat16.
        scale: a one-element float32 tensor (static quantisation), or None: the dynamic scale
            ``absmax(x) / 448`` is computed on the device.

    Returns:
        ``(x_q, scale)``: ``x_q = e4m3(x / scale)`` of ``x``'s shape, and the scale used (``[1]``
        float32; the given tensor itself when one was given).
    """
    _check_x("kiln.scaled_fp8_quant", x)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    if scale is None:
        scale = torch.empty((1,), dtype=torch.float32, device=x.device)
        _dynamic_op(out, scale, x)
    else:
        if not isinstance(scale, torch.Tensor):
            raise TypeError("kiln.scaled_fp8_quant: scale must be a torch.Tensor or None, got "
                            f"{type(scale).__name__}")
        _static_op(out, scale, x)
    return out, scale
