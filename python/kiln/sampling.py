"""Sampling at the end of a decode step (//ops:sampling), with FlashInfer's names and argument order.

    softmax(logits, temperature=None)                       probs = softmax(logits / T)
    sampling_from_probs(probs, ...)  sampling_from_logits(logits, ...)
    top_k_sampling_from_probs(probs, top_k, ...)            top_p_sampling_from_probs(probs, top_p, ...)
    min_p_sampling_from_probs(probs, min_p, ...)
    top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, filter_apply_order=..., ...)
    top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order=..., ...)
    top_k_renorm_probs(probs, top_k)   top_p_renorm_probs(probs, top_p)   top_k_mask_logits(logits, top_k)
    chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, ...)

probs: [batch, vocab] float32 (other float dtypes are converted, as FlashInfer does), any scale
(rows need not sum to 1); logits: [batch, vocab] float32/float16/bfloat16. Both contiguous in the
last dimension. top_k / top_p / min_p / temperature: a Python number, or a tensor of one value per
output row. indices: [rows] int32/int64, output row r drawing from input row indices[r] (the output
then has indices' dtype, else int32).

Semantics (kiln.trace.sampling holds the float64 reference):
  top-k  keeps every token whose probability is >= the k-th largest: ties at the threshold all
         stay. A per-row top_k <= 0 or >= vocab keeps every token.
  top-p  keeps the smallest prefix of the descending probabilities whose sum reaches top_p, the
         crossing token included (and every token tied with it). top_p >= 1 keeps every token.
  min-p  keeps tokens with p >= min_p * max p.
  "top_k_first" applies top-k, renormalises, then top-p; "joint" keeps the tokens that pass both,
  each computed on the original distribution.
  The draw is the inverse CDF, in vocabulary order, of the kept tokens' weights at one Philox
  uniform; weights are fixed-point (2^-40 of the row's largest probability), so a token below
  ~1e-12 of the maximum is never drawn (ops/sampling/sampling.h).

Random numbers: Philox4x32-10 keyed by `seed`, counter (`offset`, output row, draw); each a Python
int, or an int64 tensor of one value or one per output row (read on the device, so a captured CUDA
graph draws fresh numbers when the tensors change between replays). With neither given, both come
from `generator` (or torch's default generator of the device), which advances,
so a seeded generator reproduces a run. The same seed, offset and row give the same token whatever
the batch size or the other rows (`deterministic` is accepted for FlashInfer's users: kiln's
kernels are always deterministic). The host (CPU) backend draws the same tokens as the CUDA one.

NaN and infinities: NaN entries (and -inf logits, negative or infinite probabilities) are never
drawn; a row with no valid entry draws -1 (`return_valid=True` reports it); logits of +inf share
the row's mass. check_nan=True raises ValueError before the launch when the input holds a NaN (one
host synchronisation).

Each function is a torch custom op (kiln::sampling_draw, kiln::sampling_transform, kiln::softmax,
kiln::chain_speculative_sampling) with a fake implementation; launches go to the caller's stream.
"""

from __future__ import annotations

import numbers

import torch

from . import _jit, errors
from ._ops import custom_op
from .api_logging import logged_api
from .trace import sampling as sampling_traces
from .trace import traced

LABEL = "//ops:sampling"
# A filter parameter: one number for every row, or a [rows] tensor of one value per row. (The
# trace templates declare these scalars: their workloads pass one number.)
PerRowInt = int | torch.Tensor
PerRowFloat = float | torch.Tensor
_MAX_SEED = 2**63  # seeds and offsets travel as int64 through torch's custom ops
_ORDERS = ("top_k_first", "joint")


# by the argument a dispatch error names ("logits.dtype", ...): one lookup a call
_MODULES = {arg: _jit.Modules(LABEL, "dtype", names={"dtype": f"{arg}.dtype"})
            for arg in ("logits", "probs", "draft_probs")}


def _module(api: str, x: torch.Tensor, arg: str):
    return _MODULES[arg].get(api, x.device, x.dtype)


@custom_op("sampling_draw", mutates=("samples",))
def _draw_op(
    samples: torch.Tensor,
    input: torch.Tensor,
    logits: bool,
    order: str,
    indices: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_k_val: int,
    top_p: torch.Tensor | None,
    top_p_val: float,
    min_p: torch.Tensor | None,
    min_p_val: float,
    seed: int,
    offset: int,
    seeds: torch.Tensor | None,
    offsets: torch.Tensor | None,
) -> None:
    mod = _module("kiln.sampling", input, "logits" if logits else "probs")
    dl = _jit.dl
    opt = lambda t: None if t is None else dl(t)  # noqa: E731
    mod.sample_rows(
        input=dl(input),
        output=mod.outputs["sample"],
        order=mod.orders[order],
        logits=logits,
        indices=opt(indices),
        top_k=opt(top_k),
        top_k_val=top_k_val,
        top_p=opt(top_p),
        top_p_val=top_p_val,
        min_p=opt(min_p),
        min_p_val=min_p_val,
        seed=seed,
        offset=offset,
        seeds=opt(seeds),
        offsets=opt(offsets),
        samples=dl(samples),
        errors=errors.record_address(input.device),
        stream=_jit.stream_of(input.device),
    )
    errors.after_launch(input.device)


@custom_op("sampling_transform", mutates=("out",))
def _transform_op(
    out: torch.Tensor,
    input: torch.Tensor,
    output: str,
    top_k: torch.Tensor | None,
    top_k_val: int,
    top_p: torch.Tensor | None,
    top_p_val: float,
) -> None:
    # the renormalised probabilities or the masked logits (softmax has its own op, _softmax_op)
    logits = output == "masked_logits"
    mod = _module("kiln.sampling", input, "logits" if logits else "probs")
    dl = _jit.dl
    opt = lambda t: None if t is None else dl(t)  # noqa: E731
    mod.sample_rows(
        input=dl(input),
        output=mod.outputs[output],
        order=mod.orders["top_k_first"],
        logits=logits,
        top_k=opt(top_k),
        top_k_val=top_k_val,
        top_p=opt(top_p),
        top_p_val=top_p_val,
        out=dl(out),
        errors=errors.record_address(input.device),
        stream=_jit.stream_of(input.device),
    )
    errors.after_launch(input.device)


@custom_op("softmax", mutates=("out",))
def _softmax_op(out: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor | None,
                temperature_val: float) -> None:
    # the binding's own softmax entry: six arguments where sample_rows has 21 (host cost per call)
    mod = _module("kiln.softmax", logits, "logits")
    dl = _jit.dl
    t = None if temperature is None else dl(temperature)
    # by position: (logits, out, temperature, temperature_val, errors, stream)
    mod.softmax_rows(dl(logits), dl(out), t, temperature_val, errors.record_address(logits.device),
                     _jit.stream_of(logits.device))
    errors.after_launch(logits.device)


@custom_op("chain_speculative_sampling", mutates=("out_ids", "accepted", "emitted"))
def _speculative_op(
    out_ids: torch.Tensor,
    accepted: torch.Tensor,
    emitted: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    seed: int,
    offset: int,
    seeds: torch.Tensor | None,
    offsets: torch.Tensor | None,
) -> None:
    mod = _module("kiln.chain_speculative_sampling", draft_probs, "draft_probs")
    dl = _jit.dl
    opt = lambda t: None if t is None else dl(t)  # noqa: E731
    mod.chain_speculative(
        draft_probs=dl(draft_probs),
        draft_token_ids=dl(draft_token_ids),
        target_probs=dl(target_probs),
        out_ids=dl(out_ids),
        accepted=dl(accepted),
        emitted=dl(emitted),
        seed=seed,
        offset=offset,
        seeds=opt(seeds),
        offsets=opt(offsets),
        errors=errors.record_address(draft_probs.device),
        stream=_jit.stream_of(draft_probs.device),
    )
    errors.after_launch(draft_probs.device)


def _float_rows_like(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous float32 tensor of x's shape on its device (empty_like: half the host cost of
    torch.empty with a shape, dtype and device)."""
    return torch.empty_like(x, dtype=torch.float32, memory_format=torch.contiguous_format)


# --- argument checks ----------------------------------------------------------------------------


def _rows_input(api: str, x, name: str, probs: bool) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{api}: {name} must be 2-D [batch, vocab], got shape {list(x.shape)}")
    if x.shape[1] < 1:
        raise ValueError(f"{api}: {name}.shape[1] (the vocabulary) must be >= 1, got {x.shape[1]}")
    if probs:
        if not x.dtype.is_floating_point:
            raise TypeError(f"{api}: {name} must be a floating-point tensor, got {x.dtype}")
        return x.float()
    return x


def _check_nan(api: str, x: torch.Tensor, name: str, check_nan: bool) -> None:
    if check_nan and bool(torch.isnan(x).any()):
        raise ValueError(f"{api}: {name} contains NaN (check_nan=True)")


def _indices(api: str, indices, x: torch.Tensor) -> torch.Tensor | None:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{api}: indices must be a torch.Tensor or None, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64) or indices.dim() != 1:
        raise ValueError(
            f"{api}: indices must be a 1-D int32 or int64 tensor, got {indices.dtype} of shape "
            f"{list(indices.shape)}"
        )
    if indices.device != x.device:
        raise ValueError(f"{api}: indices is on {indices.device} but the input is on {x.device}")
    return indices.contiguous()


def _per_row(api: str, name: str, value, rows: int, device, dtype, lo, hi, lo_open=False, integer=False):
    """(tensor or None, scalar): a per-row tensor (converted to dtype) or a checked Python number.
    Scalars must lie in [lo, hi] ((lo, hi] when lo_open); per-row values are not checked on the
    host (that would synchronise): their meaning outside the range is documented. A tensor must
    be 1-D with one value per row (FlashInfer's wording in the errors: its tests match it); a 0-d
    tensor is refused rather than read back to the host (a synchronisation a CUDA graph cannot
    hold): pass a number."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(
                f"{api}: {name}: Expected a 1D tensor of shape (batch_size,) or scalar (batch_size "
                f"{rows}), got a 0-dimensional tensor; pass a number, or one value per row"
            )
        if value.dim() != 1:
            raise ValueError(
                f"{api}: {name}: Expected a 1D tensor or scalar (one value per row: shape ({rows},)), "
                f"got a {value.dim()}D tensor of shape {list(value.shape)}"
            )
        if value.shape[0] != rows:
            raise ValueError(
                f"{api}: {name}: Sampling parameter tensor batch size mismatch: expected shape "
                f"({rows},) (one value per row), got ({value.shape[0]},)"
            )
        if value.device != device:
            raise ValueError(f"{api}: {name} is on {value.device} but the input is on {device}")
        if integer and value.dtype not in (torch.int32, torch.int64):
            value = value.to(torch.int64)
        elif not integer and value.dtype != torch.float32:
            value = value.to(torch.float32)
        return value.contiguous(), (0 if integer else 1.0)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{api}: {name} must be a number or a tensor, got {type(value).__name__}")
    if integer and int(value) != value:
        raise TypeError(f"{api}: {name} must be an integer, got {value!r}")
    ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise ValueError(f"{api}: {name} must be in {left}{lo}, {hi}], got {value!r}")
    return None, (int(value) if integer else float(value))


def _order(api: str, filter_apply_order) -> str:
    if filter_apply_order not in _ORDERS:
        raise ValueError(
            f"{api}: filter_apply_order must be one of {list(_ORDERS)}, got {filter_apply_order!r}"
        )
    return filter_apply_order


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()
        ]
    return torch.default_generator


def _stream_value(api: str, name: str, v, rows: int, device: torch.device):
    """(int, tensor or None) of a seed or offset given as an int or an int64 tensor."""
    if isinstance(v, torch.Tensor):
        if v.dtype != torch.int64 or v.dim() != 1 or v.shape[0] not in (1, rows):
            raise ValueError(
                f"{api}: {name} as a tensor must be int64 of shape [1] or [{rows}], got {v.dtype} of "
                f"shape {list(v.shape)}"
            )
        if v.device != device:
            raise ValueError(f"{api}: {name} is on {v.device} but the input is on {device}")
        return 0, v.contiguous()
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) < _MAX_SEED:
        raise ValueError(f"{api}: {name} must be an int in [0, 2^63) or an int64 tensor, got {v!r}")
    return int(v), None


def seed_and_offset(api: str, generator, seed, offset, device: torch.device, rows: int):
    """(seed, offset, seed tensor, offset tensor) of a call: the given ones (ints, or int64 tensors of
    one value or one per output row, read on the device: what a CUDA graph replays with fresh
    values), else drawn from `generator` (torch's default generator of the device when None), which
    advances. CUDA generators advance their Philox offset by 4 (FlashInfer's get_seed_and_offset, no
    synchronisation); CPU generators give one 63-bit draw for the seed (offset 0)."""
    if seed is not None or offset is not None:
        s, s_t = _stream_value(api, "seed", 0 if seed is None else seed, rows, device)
        o, o_t = _stream_value(api, "offset", 0 if offset is None else offset, rows, device)
        return s, o, s_t, o_t
    if generator is None:
        generator = _default_generator(device)
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"{api}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type == "cuda":
        state = generator.get_state()
        s, o = (int(v) for v in state.view(torch.int64))
        generator.set_state(torch.tensor([s, o + 4], dtype=torch.int64).view(torch.uint8))
        return s % _MAX_SEED, o % _MAX_SEED, None, None
    return int(torch.randint(0, _MAX_SEED - 1, (1,), generator=generator)), 0, None, None


def _sample(
    api,
    x,
    logits,
    *,
    indices,
    top_k=None,
    top_p=None,
    min_p=None,
    order="top_k_first",
    generator=None,
    check_nan=False,
    seed=None,
    offset=None,
    return_valid=False,
):
    name = "logits" if logits else "probs"
    x = _rows_input(api, x, name, probs=not logits)
    _check_nan(api, x, name, check_nan)
    idx = _indices(api, indices, x)
    rows = x.shape[0] if idx is None else idx.shape[0]
    k_t, k_v = (
        (None, 0)
        if top_k is None
        else _per_row(api, "top_k", top_k, rows, x.device, None, 1, 2**62, integer=True)
    )
    p_t, p_v = (
        (None, 1.0)
        if top_p is None
        else _per_row(api, "top_p", top_p, rows, x.device, None, 0.0, 1.0, lo_open=True)
    )
    m_t, m_v = (None, 0.0) if min_p is None else _per_row(api, "min_p", min_p, rows, x.device, None, 0.0, 1.0)
    s, o, s_t, o_t = seed_and_offset(api, generator, seed, offset, x.device, rows)
    samples = torch.empty(rows, dtype=torch.int32 if idx is None else idx.dtype, device=x.device)
    _draw_op(samples, x, logits, order, idx, k_t, k_v, p_t, p_v, m_t, m_v, s, o, s_t, o_t)
    return (samples, samples >= 0) if return_valid else samples


# --- the public API -----------------------------------------------------------------------------


@logged_api
@traced(sampling_traces.SOFTMAX)
def softmax(
    logits: torch.Tensor, temperature: PerRowFloat | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``probs = softmax(logits / temperature)`` per row, in float32.

    Args:
        logits: ``[batch, vocab]`` float32/float16/bfloat16.
        temperature: None (1), a number > 0, or a ``[batch]`` tensor; a per-row value <= 0 is the
            T -> 0 limit (the probability split over the row's maxima).
        enable_pdl: FlashInfer's launch switch, accepted and ignored.

    NaN and -inf logits get probability 0; a row without a valid logit is all zeros.
    """
    api = "kiln.softmax"
    x = _rows_input(api, logits, "logits", probs=False)
    t_t, t_v = (
        (None, 1.0)
        if temperature is None
        else _per_row(
            api, "temperature", temperature, x.shape[0], x.device, None, 0.0, float("inf"), lo_open=True
        )
    )
    out = _float_rows_like(x)
    _softmax_op(out, x, t_t, t_v)
    return out


@logged_api
@traced(sampling_traces.SAMPLING_FROM_PROBS)
def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
):
    """Draw a token from each row of ``probs`` (``[batch, vocab]``, any scale): token i with
    probability ``probs[i] / sum(probs)``. Returns ``samples`` ``[rows]`` (int32, or indices'
    dtype), and ``(samples, valid)`` with ``return_valid``."""
    return _sample(
        "kiln.sampling_from_probs",
        probs,
        False,
        indices=indices,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@logged_api
@traced(sampling_traces.SAMPLING_FROM_LOGITS)
def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw a token from ``softmax(logits)`` per row (no probabilities are written)."""
    return _sample(
        "kiln.sampling_from_logits",
        logits,
        True,
        indices=indices,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
    )


@logged_api
@traced(sampling_traces.TOP_K_SAMPLING_FROM_PROBS)
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: PerRowInt,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
):
    """Draw from the tokens with ``p >= `` the k-th largest ``p`` of their row, renormalised.
    ``top_k``: an int >= 1 or a ``[rows]`` tensor (a value <= 0 or >= vocab keeps every token)."""
    return _sample(
        "kiln.top_k_sampling_from_probs",
        probs,
        False,
        indices=indices,
        top_k=top_k,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@logged_api
@traced(sampling_traces.TOP_P_SAMPLING_FROM_PROBS)
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: PerRowFloat,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
):
    """Draw from the top-p nucleus: the smallest prefix of the descending probabilities whose sum
    reaches ``top_p`` (in (0, 1]; a per-row value >= 1 keeps every token, <= 0 the largest)."""
    return _sample(
        "kiln.top_p_sampling_from_probs",
        probs,
        False,
        indices=indices,
        top_p=top_p,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@logged_api
@traced(sampling_traces.MIN_P_SAMPLING_FROM_PROBS)
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: PerRowFloat,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
):
    """Draw from the tokens with ``p >= min_p * max p`` (``min_p`` in [0, 1])."""
    return _sample(
        "kiln.min_p_sampling_from_probs",
        probs,
        False,
        indices=indices,
        min_p=min_p,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@logged_api
@traced(sampling_traces.TOP_K_TOP_P_SAMPLING_FROM_PROBS)
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: PerRowInt,
    top_p: PerRowFloat,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
):
    """Top-k then top-p (``"top_k_first"``: top-k, renormalise, top-p; ``"joint"``: both on the
    original distribution), then a draw."""
    api = "kiln.top_k_top_p_sampling_from_probs"
    return _sample(
        api,
        probs,
        False,
        indices=indices,
        top_k=top_k,
        top_p=top_p,
        order=_order(api, filter_apply_order),
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@logged_api
@traced(sampling_traces.TOP_K_TOP_P_SAMPLING_FROM_LOGITS)
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: PerRowInt,
    top_p: PerRowFloat,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`top_k_top_p_sampling_from_probs` of ``softmax(logits)``, fused: the logits are read a
    few times and no probabilities are written."""
    api = "kiln.top_k_top_p_sampling_from_logits"
    return _sample(
        api,
        logits,
        True,
        indices=indices,
        top_k=top_k,
        top_p=top_p,
        order=_order(api, filter_apply_order),
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
    )


@logged_api
@traced(sampling_traces.TOP_K_RENORM_PROBS)
def top_k_renorm_probs(probs: torch.Tensor, top_k: PerRowInt, is_deterministic: bool = False) -> torch.Tensor:
    """``probs`` of the top-k tokens (``p >=`` the k-th largest, ties kept) divided by their sum,
    0 elsewhere; float32 ``[batch, vocab]``."""
    api = "kiln.top_k_renorm_probs"
    x = _rows_input(api, probs, "probs", probs=True)
    k_t, k_v = _per_row(api, "top_k", top_k, x.shape[0], x.device, None, 1, 2**62, integer=True)
    out = _float_rows_like(x)
    _transform_op(out, x, "probs", k_t, k_v, None, 1.0)
    return out


@logged_api
@traced(sampling_traces.TOP_P_RENORM_PROBS)
def top_p_renorm_probs(
    probs: torch.Tensor, top_p: PerRowFloat, is_deterministic: bool = False
) -> torch.Tensor:
    """``probs`` of the top-p nucleus divided by their sum, 0 elsewhere; float32 ``[batch, vocab]``."""
    api = "kiln.top_p_renorm_probs"
    x = _rows_input(api, probs, "probs", probs=True)
    p_t, p_v = _per_row(api, "top_p", top_p, x.shape[0], x.device, None, 0.0, 1.0, lo_open=True)
    out = _float_rows_like(x)
    _transform_op(out, x, "probs", None, 0, p_t, p_v)
    return out


# FlashInfer's singular names for the two renormalisations (flashinfer.sampling.top_k_renorm_prob).
top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs


@logged_api
@traced(sampling_traces.TOP_K_MASK_LOGITS)
def top_k_mask_logits(logits: torch.Tensor, top_k: PerRowInt) -> torch.Tensor:
    """``logits`` where the token is among the top-k (ties kept), ``-inf`` elsewhere; the logits'
    dtype and shape."""
    api = "kiln.top_k_mask_logits"
    x = _rows_input(api, logits, "logits", probs=False)
    k_t, k_v = _per_row(api, "top_k", top_k, x.shape[0], x.device, None, 1, 2**62, integer=True)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _transform_op(out, x, "masked_logits", k_t, k_v, None, 1.0)
    return out


@logged_api
@traced(sampling_traces.CHAIN_SPECULATIVE_SAMPLING)
def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
):
    """Verify a chain of ``n`` draft tokens per request (Leviathan et al. / Chen et al.): draft token
    ``j`` is accepted with probability ``min(1, q_j(d_j) / p_j(d_j))``; the first rejected position
    draws from ``max(q - p, 0)`` renormalised; when all ``n`` are accepted a bonus token is drawn
    from ``q_n``.

    Args:
        draft_probs: ``[batch, n, vocab]`` float32; draft_token_ids: ``[batch, n]`` int32/int64;
        target_probs: ``[batch, n + 1, vocab]`` float32.
        maybe_output_accepted_token_num / maybe_output_emitted_draft_token_num: ``[batch]`` int32
            tensors the counts are added to (new zeroed ones when None).

    Returns:
        ``(output_token_ids [batch, n + 1] int32, -1 past the emitted tokens; accepted [batch]: the
        positions whose acceptance test passes, each considered independently; emitted [batch]:
        the draft tokens emitted, the bonus token not counted)``. A draft token id outside
        [0, vocab) is an index error (IndexError on the CPU; kiln.check_errors() on CUDA).
    """
    api = "kiln.chain_speculative_sampling"
    for name, t in (
        ("draft_probs", draft_probs),
        ("draft_token_ids", draft_token_ids),
        ("target_probs", target_probs),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if draft_probs.dim() != 3 or target_probs.dim() != 3:
        raise ValueError(
            f"{api}: draft_probs must be [batch, n, vocab] and target_probs [batch, n + 1, vocab], "
            f"got {list(draft_probs.shape)} and {list(target_probs.shape)}"
        )
    draft, target = draft_probs.float(), target_probs.float()
    batch, n = draft.shape[0], draft.shape[1]
    dev = draft.device

    def counts(t, name):
        if t is None:
            return torch.zeros(batch, dtype=torch.int32, device=dev)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (batch,):
            raise ValueError(f"{api}: {name} must be an int32 tensor of shape [{batch}] or None")
        return t

    accepted = counts(maybe_output_accepted_token_num, "maybe_output_accepted_token_num")
    emitted = counts(maybe_output_emitted_draft_token_num, "maybe_output_emitted_draft_token_num")
    s, o, s_t, o_t = seed_and_offset(api, generator, seed, offset, dev, batch)
    out = torch.empty((batch, n + 1), dtype=torch.int32, device=dev)
    _speculative_op(out, accepted, emitted, draft, draft_token_ids, target, s, o, s_t, o_t)
    return out, accepted, emitted
