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

Bit packing (FlashInfer's flashinfer.quantization, target //ops/quantization:packbits):

    packbits(x, bitorder="big") -> y                                 numpy.packbits of a 1-D bool x
    segment_packbits(x, indptr, bitorder="big") -> (y, new_indptr)   the same per segment of indptr

Each function is a torch custom op (kiln::per_token_group_quant_fp8, kiln::scaled_fp8_quant_dynamic,
kiln::scaled_fp8_quant_static, kiln::packbits, kiln::segment_packbits) with a fake implementation;
launches go to the caller's stream.
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


# ---- bit packing (numpy.packbits): FlashInfer's flashinfer.quantization.packbits / segment_packbits -----

PACKBITS_LABEL = "//ops/quantization:packbits"
_BITORDERS = ("big", "little")


def _packbits_module(api: str, device: torch.device):
    return _jit.module(PACKBITS_LABEL, device, api)


@custom_op("packbits", mutates=("y",))
def _packbits_op(y: torch.Tensor, x: torch.Tensor, little: bool) -> None:
    _packbits_module("kiln.packbits", x.device).packbits(y=_jit.dl(y), x=_jit.dl(x), little=little,
                                                          stream=_jit.stream_of(x.device))


@custom_op("segment_packbits", mutates=("y",))
def _segment_packbits_op(y: torch.Tensor, x: torch.Tensor, indptr: torch.Tensor, out_indptr: torch.Tensor,
                         little: bool) -> None:
    _packbits_module("kiln.segment_packbits", x.device).segment_packbits(
        y=_jit.dl(y), x=_jit.dl(x), indptr=_jit.dl(indptr), out_indptr=_jit.dl(out_indptr), little=little,
        stream=_jit.stream_of(x.device))


def _bits(api: str, x, bitorder: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{api}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{api}: x must be 1-D, got shape {list(x.shape)}")
    if bitorder not in _BITORDERS:
        raise ValueError(f"{api}: bitorder must be 'big' or 'little', got {bitorder!r}")
    return x if x.dtype == torch.bool else x != 0


@logged_api
@traced(quant_traces.PACKBITS)
def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """Pack a 1-D boolean array into bits, as ``numpy.packbits``.

    Args:
        x: ``[n]``, bool (any other dtype: nonzero is 1), any stride.
        bitorder: ``"big"`` (element 8j + k at bit 7 - k of byte j, numpy's default) or ``"little"``
            (at bit k).

    Returns:
        ``[ceil(n / 8)]`` uint8; the bits past n are 0.
    """
    x = _bits("kiln.packbits", x, bitorder)
    y = torch.empty(((x.shape[0] + 7) // 8,), dtype=torch.uint8, device=x.device)
    _packbits_op(y, x, bitorder == "little")
    return y


@logged_api
@traced(quant_traces.SEGMENT_PACKBITS)
def segment_packbits(x: torch.Tensor, indptr: torch.Tensor,
                     bitorder: str = "big") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`packbits` of each segment ``x[indptr[i]:indptr[i + 1]]``, the packed segments concatenated.

    Args:
        x: ``[indptr[-1]]`` (or longer) bool, as for :func:`packbits`.
        indptr: ``[batch_size + 1]`` int32 or int64, non-decreasing, within ``[0, x.shape[0]]``.
        bitorder: ``"big"`` or ``"little"``.

    Returns:
        ``(y, new_indptr)``: ``y[new_indptr[i]:new_indptr[i + 1]]`` holds segment i's bytes
        (``ceil(len_i / 8)`` of them); ``new_indptr`` ``[batch_size + 1]`` int32.

    The output's size depends on indptr's values: the call synchronises with the device once to
    read it (and to check indptr), so it cannot be captured in a CUDA graph or traced by
    torch.compile (FlashInfer's function has the same limits).
    """
    api = "kiln.segment_packbits"
    x = _bits(api, x, bitorder)
    if not isinstance(indptr, torch.Tensor):
        raise TypeError(f"{api}: indptr must be a torch.Tensor, got {type(indptr).__name__}")
    if indptr.dim() != 1 or indptr.shape[0] < 1:
        raise ValueError(f"{api}: indptr must be [batch_size + 1] with at least one entry, got shape "
                         f"{list(indptr.shape)}")
    if indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{api}: indptr.dtype must be int32 or int64, got {indptr.dtype}")
    if indptr.device != x.device:
        raise ValueError(f"{api}: indptr is on {indptr.device} but x is on {x.device}")
    bounds = indptr.long()
    lengths = bounds[1:] - bounds[:-1]
    out_indptr = torch.zeros_like(bounds)
    torch.cumsum((lengths + 7) // 8, 0, out=out_indptr[1:])
    total, decreasing, first, last = torch.stack(
        [out_indptr[-1], (lengths < 0).sum(), bounds[0], bounds[-1]]).tolist()
    if decreasing or first < 0 or last > x.shape[0]:
        raise ValueError(f"{api}: indptr must be non-decreasing within [0, x.shape[0] = {x.shape[0]}], got "
                         f"indptr[0] = {first}, indptr[-1] = {last} and {decreasing} decreasing step(s)")
    y = torch.empty((total,), dtype=torch.uint8, device=x.device)
    _segment_packbits_op(y, x, bounds, out_indptr, bitorder == "little")
    return y, out_indptr.to(torch.int32)
