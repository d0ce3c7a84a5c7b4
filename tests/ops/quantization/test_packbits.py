"""kiln.packbits and kiln.segment_packbits (//ops/quantization:packbits) against numpy.packbits, on
the host backend always and on CUDA where a device is present: both bit orders, lengths around
every multiple of 8 and the 8-byte fast path, strided and non-bool inputs, segments of every
length (empty ones too) with int32 and int64 indptr, bad inputs, the kernel's own bounds for any
index values, torch.compile and CUDA graphs."""

from __future__ import annotations

import numpy
import pytest
import torch
from helpers import device_params

import kiln
from kiln.trace.quantization import packbits_reference

ORDERS = ["big", "little"]


def numpy_packbits(x, bitorder):
    return torch.from_numpy(numpy.packbits(x.cpu().numpy().astype(bool), bitorder=bitorder))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("bitorder", ORDERS)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099])
def test_packbits_matches_numpy(device, bitorder, n):
    x = torch.rand(n) < 0.5
    y = kiln.packbits(x.to(device), bitorder)
    assert y.dtype == torch.uint8 and y.shape == ((n + 7) // 8,)
    assert torch.equal(y.cpu(), numpy_packbits(x, bitorder))
    assert torch.equal(packbits_reference(x, bitorder), numpy_packbits(x, bitorder))


@pytest.mark.parametrize("device", device_params())
def test_strided_unaligned_and_non_bool_inputs(device):
    base = torch.rand(3000) < 0.5
    for x in (base[1:], base[::3], base[5:2001]):
        for order in ORDERS:
            assert torch.equal(kiln.packbits(x.to(device), order).cpu(), numpy_packbits(x, order))
    counts = torch.randint(-2, 3, (77,))
    assert torch.equal(kiln.packbits(counts.to(device)).cpu(), numpy_packbits(counts != 0, "big"))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("bitorder", ORDERS)
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_segment_packbits_matches_numpy(device, bitorder, idtype):
    lengths = torch.tensor([0, 1, 8, 9, 0, 17, 64, 3, 0])
    indptr = torch.zeros(len(lengths) + 1, dtype=idtype)
    indptr[1:] = lengths.cumsum(0)
    x = torch.rand(int(indptr[-1]) + 5) < 0.5  # longer than the segments: the tail is ignored
    y, new = kiln.segment_packbits(x.to(device), indptr.to(device), bitorder)
    assert new.dtype == torch.int32 and new.device == y.device
    assert torch.equal(new.cpu()[1:] - new.cpu()[:-1], (lengths + 7) // 8)
    for i in range(len(lengths)):
        seg = x[int(indptr[i]) : int(indptr[i + 1])]
        assert torch.equal(y.cpu()[int(new[i]) : int(new[i + 1])], numpy_packbits(seg, bitorder))


@pytest.mark.parametrize("device", device_params())
def test_segment_packbits_offset_start(device):
    """indptr need not start at 0: the segments are x[indptr[i]:indptr[i+1]]."""
    x = torch.rand(100) < 0.5
    indptr = torch.tensor([10, 30, 31, 95])
    y, new = kiln.segment_packbits(x.to(device), indptr.to(device))
    assert new.tolist() == [0, 3, 4, 12]
    assert torch.equal(
        y.cpu(),
        torch.cat(
            [
                numpy_packbits(x[10:30], "big"),
                numpy_packbits(x[30:31], "big"),
                numpy_packbits(x[31:95], "big"),
            ]
        ),
    )


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    x = (torch.rand(40) < 0.5).to(device)
    with pytest.raises(ValueError, match=r"bitorder must be 'big' or 'little', got 'middle'"):
        kiln.packbits(x, "middle")
    with pytest.raises(ValueError, match=r"x must be 1-D, got shape \[5, 8\]"):
        kiln.packbits(x.reshape(5, 8))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        kiln.packbits([1, 0])
    with pytest.raises(
        ValueError,
        match=r"indptr must be non-decreasing within \[0, x.shape\[0\] = 40\], got "
        r"indptr\[0\] = 0, indptr\[-1\] = 41",
    ):
        kiln.segment_packbits(x, torch.tensor([0, 41], device=device))
    with pytest.raises(ValueError, match="and 1 decreasing step"):
        kiln.segment_packbits(x, torch.tensor([0, 20, 10], device=device))
    with pytest.raises(ValueError, match="indptr.0. = -1"):
        kiln.segment_packbits(x, torch.tensor([-1, 10], device=device))
    with pytest.raises(TypeError, match="indptr.dtype must be int32 or int64, got torch.float32"):
        kiln.segment_packbits(x, torch.tensor([0.0, 8.0], device=device))
    with pytest.raises(ValueError, match=r"indptr must be \[batch_size \+ 1\] with at least one entry"):
        kiln.segment_packbits(x, torch.empty(0, dtype=torch.int64, device=device))


@pytest.mark.parametrize("device", device_params())
def test_the_launcher_stays_in_bounds_for_any_indices(device):
    """The binding takes int64 segment bounds that the Python API validated; given inconsistent ones
    directly, every byte of y is still written once and x read only inside [0, n)."""
    mod = kiln._jit.module(kiln.quantization.PACKBITS_LABEL, torch.device(device), "test")
    x = torch.ones(10, dtype=torch.bool, device=device)
    y = torch.full((6,), 7, dtype=torch.uint8, device=device)
    indptr = torch.tensor([-50, 4, 1000], device=device)
    out = torch.tensor([0, 1, 4], device=device)  # segment 0: 1 byte; segment 1: 3 bytes; y has 6
    mod.segment_packbits(
        y=kiln._jit.dl(y),
        x=kiln._jit.dl(x),
        indptr=kiln._jit.dl(indptr),
        out_indptr=kiln._jit.dl(out),
        little=False,
        stream=kiln._jit.stream_of(x.device),
    )
    # Segment 0 covers x[-50:4] (clipped to x[0:4]): its first byte holds elements -50..-43, none
    # in x. Segment 1: x[4:10] = six ones, then nothing. Bytes 4 and 5 belong to no segment.
    assert y.cpu().tolist() == [0, 0b11111100, 0, 0, 0, 0]


@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    x = (torch.rand(1000) < 0.5).to(device)

    def block(x):
        return kiln.packbits(x), kiln.packbits(x, "little")

    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(block, fullgraph=True, backend=backend)(x)
    for g, w in zip(got, block(x), strict=True):
        assert torch.equal(g, w)


def test_custom_ops_are_registered_with_fake_implementations():
    x = torch.rand(20) < 0.5
    torch.library.opcheck(torch.ops.kiln.packbits.default, (torch.empty(3, dtype=torch.uint8), x, True))
    torch.library.opcheck(
        torch.ops.kiln.segment_packbits.default,
        (torch.empty(3, dtype=torch.uint8), x, torch.tensor([0, 4, 20]), torch.tensor([0, 1, 3]), False),
    )


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x = torch.rand(4097, device="cuda") < 0.5
    kiln.packbits(x)  # load first
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kiln.packbits(x)
    x.copy_(torch.rand(4097, device="cuda") < 0.5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), numpy_packbits(x, "big"))
