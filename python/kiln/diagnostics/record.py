"""The dump format of a call's values: JSON specs for everything, tensor data in safetensors.

No pickle anywhere: a dump can be opened on another machine by anything that reads JSON and
safetensors. A tensor's spec keeps its layout (shape, strides, storage offset), so a replay rebuilds
the same view (alignment and strides select kernel paths); a tensor passed twice (out=input) is
stored once and the second use is an alias of the first.

    {"tensor": "input", "shape": [4, 4096], "dtype": "bfloat16", "device": "cuda:0",
     "strides": [4096, 1], "storage_offset": 0}
    {"alias": "input"}                  the very tensor stored under "input"
    {"value": 1e-06}                    None, bool, int, str and finite float
    {"float": "nan"}                    non-finite floats (JSON has none)
    {"dtype": "bfloat16"}, {"device": "cuda:0"}, {"list": [...]}, {"tuple": [...]}
    {"unsupported": "MyType", "repr": "..."}   recorded for the reader; a replay refuses it
"""

from __future__ import annotations

import math

import torch

_MAX_REPR = 500


class ReplayError(ValueError):
    """A recorded value cannot be rebuilt."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ReplayError(f"unknown dtype {name!r} in the dump")
    return dtype


class Encoder:
    """Encodes values to specs, collecting host copies of their tensors (taken now) by key."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._keys: dict[int, tuple[str, torch.Tensor]] = {}  # id(tensor) -> (key, tensor)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def encode(self, v: object, key: str) -> dict:
        if isinstance(v, torch.Tensor):
            return self._tensor(v, key)
        if v is None or isinstance(v, bool | int | str):
            return {"value": v}
        if isinstance(v, float):
            return {"value": v} if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, torch.dtype):
            return {"dtype": dtype_name(v)}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        if isinstance(v, list | tuple):
            kind = "list" if isinstance(v, list) else "tuple"
            return {kind: [self.encode(x, f"{key}.{i}") for i, x in enumerate(v)]}
        text = repr(v)
        return {"unsupported": type(v).__qualname__, "repr": text[:_MAX_REPR]}

    def _tensor(self, t: torch.Tensor, key: str) -> dict:
        seen = self._keys.get(id(t))
        if seen is not None and seen[1] is t:
            return {"alias": seen[0]}
        self._keys[id(t)] = (key, t)
        spec = {"shape": list(t.shape), "dtype": dtype_name(t.dtype), "device": str(t.device),
                "strides": list(t.stride()), "storage_offset": t.storage_offset(),
                "data_ptr": f"0x{t.data_ptr():x}" if t.device.type != "meta" else None}
        if t.device.type == "meta" or t.is_complex():
            return {"unsupported": f"tensor of {t.dtype} on {t.device}", **spec}
        # One contiguous host copy of the values, taken now (before the call for inputs).
        self.tensors[key] = t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
        return {"tensor": key, **spec}


def rebuild_tensor(spec: dict, values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on `device` with the recorded shape, strides and storage offset, holding `values`.

    The storage is as large as the view needs; elements outside the view are NaN (or 0), so a
    kernel that reads past its view shows it."""
    shape, strides, offset = spec["shape"], spec["strides"], spec["storage_offset"]
    dtype = dtype_of(spec["dtype"])
    if list(values.shape) != shape or values.dtype != dtype:
        raise ReplayError(f"tensor {spec.get('tensor')!r}: the stored data is {list(values.shape)} "
                          f"{values.dtype}, the record says {shape} {dtype}")
    size = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if all(shape) \
        else offset
    fill = float("nan") if dtype.is_floating_point else 0
    storage = torch.full((max(size, 1),), fill, dtype=dtype)
    if values.numel():
        try:
            storage.as_strided(shape, strides, offset).copy_(values)
        except RuntimeError:  # a view whose elements overlap (stride 0): write through the index
            # of every element in the storage; repeated indices get equal values.
            index = torch.arange(storage.numel()).as_strided(shape, strides, offset)
            storage[index.reshape(-1)] = values.reshape(-1)
    return storage.to(device).as_strided(shape, strides, offset)


class Decoder:
    """Rebuilds values from specs, taking tensor data from `tensors` and placing tensors on
    `device` (None: the recorded device of each)."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device | None):
        self.tensors = tensors
        self.device = device
        self.built: dict[str, torch.Tensor] = {}

    def decode(self, spec: dict, where: str) -> object:
        if "tensor" in spec:
            key = spec["tensor"]
            if key not in self.tensors:
                raise ReplayError(f"{where}: tensor {key!r} is missing from the dump's safetensors")
            device = self.device or torch.device(spec["device"])
            t = self.built[key] = rebuild_tensor(spec, self.tensors[key], device)
            return t
        if "alias" in spec:
            if spec["alias"] not in self.built:
                raise ReplayError(f"{where}: alias of {spec['alias']!r}, which was not rebuilt before it")
            return self.built[spec["alias"]]
        if "value" in spec:
            return spec["value"]
        if "float" in spec:
            return float(spec["float"])
        if "dtype" in spec:
            return dtype_of(spec["dtype"])
        if "device" in spec:
            return self.device or torch.device(spec["device"])
        if "list" in spec:
            return [self.decode(x, f"{where}[{i}]") for i, x in enumerate(spec["list"])]
        if "tuple" in spec:
            return tuple(self.decode(x, f"{where}[{i}]") for i, x in enumerate(spec["tuple"]))
        raise ReplayError(f"{where}: cannot rebuild {spec.get('unsupported', spec)!r} "
                          f"(recorded as {spec.get('repr', '?')})")
