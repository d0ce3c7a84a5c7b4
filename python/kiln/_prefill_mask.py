"""The custom masks of the prefill APIs, as the packed bits the prefill kernels read.

FlashInfer's forms, all turned into one layout (ops/attention/attention.h, PrefillParams):

- ``custom_mask``: booleans, request b's ``qo_len[b] x kv_len[b]`` block row-major, the requests
  one after another (``sum(qo_len * kv_len)`` elements; single prefill: ``[qo_len, kv_len]``).
  True: the query sees the key. Packed here, each request from a byte of its own.
- ``packed_custom_mask``: that packing already done, FlashInfer's ``segment_packbits(custom_mask,
  indptr, bitorder="little")`` (``packbits(..., bitorder="little")`` for one request): request b's
  ``ceil(qo_len * kv_len / 8)`` bytes follow request b - 1's, bit i * kv_len + j of them
  (little-endian within a byte) for query i and key j.
- multi-item scoring (``prefix_len_ptr``, ``token_pos_in_items_ptr``, ``token_pos_in_items_len``,
  ``max_item_len_ptr``): request r's sequence is a shared prefix of ``prefix_len[r]`` tokens
  followed by items, each led by a delimiter; query i sits at position s = i + kv_len - qo_len
  and key j at j. A query in the prefix (s < prefix_len) sees keys j <= s (causal); a query in the
  items sees the whole prefix and the keys of its own item up to itself: j < prefix_len or
  s - t < j <= s, where t = token_pos_in_items[r * token_pos_in_items_len + s - prefix_len] is its
  position in its item (0 for a delimiter, which so sees the prefix alone). The mask is built as
  bits once, at plan; ``max_item_len_ptr`` (FlashInfer's bound on the tiles it may skip) is checked
  and not needed: the bits are exact.

Every tensor is checked against the batch (sizes, dtypes), so the bits the kernels read always
cover each request's block: the bytes of request b are [mask_indptr[b], mask_indptr[b + 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _jit, _persistent


@dataclass
class PrefillMask:
    """Packed bits on the kernels' device and each request's first byte (int32 [batch + 1])."""

    packed: torch.Tensor
    indptr: torch.Tensor

    def capsules(self) -> dict:
        return {"custom_mask": _jit.dl(self.packed), "mask_indptr": _jit.dl(self.indptr)}


def byte_indptr(qo_len: torch.Tensor, kv_len: torch.Tensor) -> torch.Tensor:
    """Each request's first byte of the packed mask (int64, host): ceil(qo_len * kv_len / 8) bytes
    a request."""
    nbytes = (qo_len.to(torch.int64) * kv_len.to(torch.int64) + 7) // 8
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(nbytes, 0)])


_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}  # kept: made on kiln's worker (kiln/_persistent.py)


def _bit_weights(device: torch.device) -> torch.Tensor:
    return (1 << torch.arange(8, dtype=torch.int32)).to(device, torch.uint8)


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """Booleans (a multiple of 8 of them) -> bytes, little-endian within a byte."""
    dev = bits.device
    w = _BIT_WEIGHTS.get(dev)
    if w is None:
        w = _BIT_WEIGHTS[dev] = _persistent.outside_graph_pools(dev, _bit_weights, dev)
    return (bits.view(-1, 8).to(torch.uint8) * w).sum(-1, dtype=torch.uint8)


def pack(custom_mask: torch.Tensor, qo_len: torch.Tensor, kv_len: torch.Tensor, api: str) -> torch.Tensor:
    """custom_mask (FlashInfer's flattened booleans) packed per request from a byte of its own."""
    if not isinstance(custom_mask, torch.Tensor):
        raise TypeError(f"{api}: custom_mask must be a torch.Tensor of booleans, got "
                        f"{type(custom_mask).__name__}")
    bits = (qo_len.to(torch.int64) * kv_len.to(torch.int64)).tolist()
    total = sum(bits)
    if custom_mask.numel() != total:
        raise ValueError(f"{api}: custom_mask has {custom_mask.numel()} elements (shape "
                         f"{list(custom_mask.shape)}); the requests' qo_len * kv_len sum to {total}")
    flat = custom_mask.reshape(-1)
    flat = flat if flat.dtype == torch.bool else flat != 0
    if all(n % 8 == 0 for n in bits):  # every request starts on a byte: one packing of the whole
        return _pack(flat)
    pieces, at = [], 0
    for n in bits:
        pieces.append(flat[at:at + n])
        if n % 8:
            pieces.append(torch.zeros(8 - n % 8, dtype=torch.bool, device=flat.device))
        at += n
    return _pack(torch.cat(pieces))


def check_packed(packed: torch.Tensor, nbytes: int, api: str) -> torch.Tensor:
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{api}: packed_custom_mask must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype not in (torch.uint8, torch.int8) or packed.dim() != 1:
        raise ValueError(f"{api}: packed_custom_mask must be a 1-D uint8 tensor (FlashInfer's "
                         f"segment_packbits output, bitorder='little'), got {packed.dtype} of shape "
                         f"{list(packed.shape)}")
    if packed.numel() != nbytes:
        raise ValueError(f"{api}: packed_custom_mask has {packed.numel()} bytes; the requests' masks take "
                         f"{nbytes} (ceil(qo_len * kv_len / 8) each, every request from a byte of its own)")
    return packed.view(torch.uint8)


def _host_ints(t, name: str, api: str) -> torch.Tensor:
    """A 1-D integer tensor of any integer dtype (FlashInfer passes uint16 and uint32) as int64 on
    the host."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() > 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{api}: {name} must be a 1-D (or 0-D) integer tensor, got {t.dtype} of shape "
                         f"{list(t.shape)}")
    return t.to("cpu").reshape(-1).to(torch.int64)


def multi_item_mask(qo_len: torch.Tensor, kv_len: torch.Tensor, prefix_len_ptr, token_pos_in_items_ptr,
                    token_pos_in_items_len, max_item_len_ptr, api: str) -> torch.Tensor:
    """The flattened booleans of FlashInfer's multi-item scoring (see the module docstring), built
    on the device of token_pos_in_items_ptr."""
    batch = qo_len.numel()
    prefix = _host_ints(prefix_len_ptr, "prefix_len_ptr", api)
    if token_pos_in_items_ptr is None:
        raise ValueError(f"{api}: prefix_len_ptr (multi-item scoring) needs token_pos_in_items_ptr")
    device = token_pos_in_items_ptr.device if isinstance(token_pos_in_items_ptr, torch.Tensor) else None
    pos_in_items = _host_ints(token_pos_in_items_ptr, "token_pos_in_items_ptr", api).to(device)
    stride = token_pos_in_items_len
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 0:
        raise ValueError(f"{api}: token_pos_in_items_len must be an int >= 0, got {stride!r}")
    if prefix.numel() != batch:
        raise ValueError(f"{api}: prefix_len_ptr has {prefix.numel()} entries, the batch {batch} requests")
    if bool((prefix < 0).any()):
        raise ValueError(f"{api}: prefix_len_ptr must be >= 0, got {prefix.tolist()}")
    if max_item_len_ptr is not None:
        count = _host_ints(max_item_len_ptr, "max_item_len_ptr", api).numel()
        if count != batch:
            raise ValueError(f"{api}: max_item_len_ptr has {count} entries, the batch {batch} requests")
    pieces = []
    for r in range(batch):
        qo, kv, p = int(qo_len[r]), int(kv_len[r]), int(prefix[r])
        s = torch.arange(qo, device=device)[:, None] + (kv - qo)  # each query's position
        j = torch.arange(kv, device=device)[None, :]
        visible = j <= s
        first = max(p, kv - qo)  # the first query position inside the items
        if first < kv:
            lo, hi = r * stride + first - p, r * stride + kv - p  # the entries the queries read
            if hi > pos_in_items.numel():
                raise ValueError(f"{api}: request {r}'s items read token_pos_in_items_ptr[{lo}:{hi}] "
                                 f"(token_pos_in_items_len {stride}), past its {pos_in_items.numel()} "
                                 "entries")
            t = torch.zeros(qo, dtype=torch.int64, device=device)
            t[first - (kv - qo):] = pos_in_items[lo:hi]
            in_items = s >= p
            visible &= ~in_items | (j < p) | (j > s - t[:, None])
        pieces.append(visible.reshape(-1))
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.bool, device=device)


def resolve(api: str, qo_len: torch.Tensor, kv_len: torch.Tensor, device: torch.device, custom_mask=None,
            packed_custom_mask=None, multi_item=None) -> PrefillMask | None:
    """The mask of a plan (None: no custom mask). packed_custom_mask wins over custom_mask, as in
    FlashInfer; multi_item is (prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
    max_item_len_ptr) or None."""
    if multi_item is not None:
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(f"{api}: multi-item scoring (prefix_len_ptr) builds the mask itself; pass no "
                             "custom_mask or packed_custom_mask with it")
        custom_mask = multi_item_mask(qo_len, kv_len, *multi_item, api)
    if custom_mask is None and packed_custom_mask is None:
        return None
    indptr = byte_indptr(qo_len, kv_len)
    if packed_custom_mask is not None:
        packed = check_packed(packed_custom_mask, int(indptr[-1]), api)
    else:
        packed = pack(custom_mask, qo_len, kv_len, api)
    if int(indptr[-1]) >= 2**31:
        raise ValueError(f"{api}: the custom mask takes {int(indptr[-1])} bytes; at most 2^31 - 1 are "
                         "supported")
    return PrefillMask(packed.to(device=device, copy=True),
                       indptr.to(device=device, dtype=torch.int32))
