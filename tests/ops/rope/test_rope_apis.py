"""kiln's RoPE APIs against a float64 reference, on the host backend always and on CUDA where a
device is present: every API and its _inplace variant, NeoX and interleaved styles, partial rotary
(the dims past rotary_dim bit for bit), q and k with different head counts, strided views of a
fused qkv tensor, indptr/offsets and pos_ids (int32/int64 each), Llama 3.1 scaling, the cos/sin cache,
bad inputs and index errors, a property test, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace.rope import cos_sin_cache_float32, positions_of, rope_cos_sin_float64, rope_float64

DTYPES = [torch.float16, torch.bfloat16]
# One rounding of each output (2^-11, 2^-8 relative) after float32 arithmetic; the float32 angle
# pos * freq is off by up to ~ulp(pos) (5e-4 rad at the positions below 4096 used here) times |x|.
TOL = {torch.float16: (2e-3, 3e-3), torch.bfloat16: (1.6e-2, 1e-2)}
LLAMA31 = (1.0, 4.0, 8192)


def check(out, ref):
    assert out.isfinite().all(), "unwritten (poisoned) or non-finite elements in the output"
    rtol, atol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref.to(out.device), rtol=rtol, atol=atol)


def randn(shape, dtype, device, gen=None):
    return torch.randn(shape, dtype=torch.float32, generator=gen).to(device=device, dtype=dtype)


def make_indptr(lengths, device):
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    offsets = torch.randint(0, 3000, (len(lengths),), dtype=torch.int32)
    return indptr.to(device), offsets.to(device)


def run_api(variant, q, k, pos, rotary_dim, interleave, llama31):
    """Call one of the eight q/k APIs; returns the rotated (q, k) and the reference's positions."""
    kw = {"rotary_dim": rotary_dim, "interleave": interleave}
    if llama31:
        kw.update(rope_scale=8.0, rope_theta=5e5)
    if variant.startswith("indptr"):
        indptr, offsets = pos
        name = "apply_llama31_rope" if llama31 else "apply_rope"
        args = (indptr, offsets)
        ref_pos = positions_of(indptr, offsets, q.shape[0])
    else:
        name = "apply_llama31_rope_pos_ids" if llama31 else "apply_rope_pos_ids"
        args = (pos,)
        ref_pos = pos
    if variant.endswith("inplace"):
        getattr(kiln, name + "_inplace")(q, k, *args, **kw)
        return q, k, ref_pos
    qo, ko = getattr(kiln, name)(q, k, *args, **kw)
    return qo, ko, ref_pos


VARIANTS = ["indptr", "indptr_inplace", "pos_ids", "pos_ids_inplace"]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("llama31", [False, True], ids=["rope", "llama31"])
@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleave"])
@pytest.mark.parametrize(
    "heads,head_dim,rotary_dim",
    [((4, 2), 128, None), ((3, 1), 64, 32), ((2, 3), 80, 50)],
    ids=["full", "partial", "odd-split"],
)
def test_matches_reference(device, dtype, variant, llama31, interleave, heads, head_dim, rotary_dim):
    nnz = 37
    q, k = randn((nnz, heads[0], head_dim), dtype, device), randn((nnz, heads[1], head_dim), dtype, device)
    q0, k0 = q.clone(), k.clone()
    if variant.startswith("indptr"):
        pos = make_indptr([5, 0, 31, 1], device)
    else:
        pos = torch.randint(0, 4000, (nnz,), dtype=torch.int32).to(device)
    qo, ko, ref_pos = run_api(variant, q, k, pos, rotary_dim, interleave, llama31)
    kw = {"rope_scale": 8.0, "rope_theta": 5e5, "llama31": LLAMA31} if llama31 else {}
    eq, ek = rope_float64(q0, k0, ref_pos, rotary_dim, interleave, **kw)
    check(qo, eq)
    check(ko, ek)
    rd = rotary_dim or head_dim
    assert torch.equal(qo[..., rd:], q0[..., rd:]) and torch.equal(ko[..., rd:], k0[..., rd:]), (
        "dims past rotary_dim must be the input's bits"
    )
    if not variant.endswith("inplace"):
        assert torch.equal(q, q0) and torch.equal(k, k0), "the out-of-place APIs must not write their inputs"


@pytest.mark.parametrize("device", device_params())
def test_position_sources_agree(device):
    """indptr/offsets (int32, int64 and mixed), int32 and int64 pos_ids, and a cos/sin cache of the
    same frequencies give the same rotation."""
    dtype = torch.bfloat16
    q, k = randn((20, 4, 64), dtype, device), randn((20, 2, 64), dtype, device)
    indptr, offsets = make_indptr([7, 13], device)
    pos = positions_of(indptr, offsets, 20).to(device)
    a = kiln.apply_rope(q, k, indptr, offsets)
    b = kiln.apply_rope_pos_ids(q, k, pos.int())
    c = kiln.apply_rope_pos_ids(q, k, pos)
    wide = kiln.apply_rope(q, k, indptr.long(), offsets.long())
    mixed = kiln.apply_llama31_rope(q, k, indptr.long(), offsets)
    cache = cos_sin_cache_float32(4096, 64).to(device)
    d = kiln.apply_rope_with_cos_sin_cache(pos, q.flatten(1), k.flatten(1), 64, cache)
    for x, y in ((a, b), (b, c), (a, wide), (mixed, kiln.apply_llama31_rope_pos_ids(q, k, pos))):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
    check(d[0].unflatten(1, (4, 64)), rope_float64(q, k, pos.cpu())[0])
    check(d[1].unflatten(1, (2, 64)), rope_float64(q, k, pos.cpu())[1])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_cos_sin_cache(device, is_neox, in_place, rotary_dim):
    dtype, nnz, hs = torch.float16, 29, 128
    query, key = randn((nnz, 8 * hs), dtype, device), randn((nnz, 2 * hs), dtype, device)
    q0, k0 = query.clone(), key.clone()
    cache = randn((500, rotary_dim), torch.float32, device)  # any values: the kernel only reads them
    positions = torch.randint(0, 500, (nnz,)).to(device)
    if in_place:
        kiln.apply_rope_with_cos_sin_cache_inplace(positions, query, key, hs, cache, is_neox=is_neox)
        qo, ko = query, key
    else:
        qo, ko = kiln.apply_rope_with_cos_sin_cache(positions, query, key, hs, cache, is_neox=is_neox)
        assert torch.equal(query, q0)
    eq, ek = rope_cos_sin_float64(positions, q0, k0, hs, cache, is_neox)
    torch.testing.assert_close(qo.double(), eq, rtol=2e-3, atol=2e-2)  # |cos|, |sin| up to ~4 here
    torch.testing.assert_close(ko.double(), ek, rtol=2e-3, atol=2e-2)
    tail = qo.unflatten(1, (8, hs))[..., rotary_dim:]
    assert torch.equal(tail, q0.unflatten(1, (8, hs))[..., rotary_dim:])
    # 3-D query and key work as well.
    q3, k3 = kiln.apply_rope_with_cos_sin_cache(
        positions, q0.unflatten(1, (8, hs)), k0.unflatten(1, (2, hs)), hs, cache, is_neox=is_neox
    )
    assert torch.equal(q3.flatten(1), qo) and torch.equal(k3.flatten(1), ko)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("api", ["pos_ids", "cos_sin"])
def test_strided_views_of_a_fused_qkv(device, api):
    """q and k as views of one [nnz, (32 + 8 + 8) * 128] projection, rotated in place: v and the
    other parts of the buffer keep their bits."""
    dtype, nnz, hq, hk, d = torch.bfloat16, 19, 8, 2, 128
    qkv = randn((nnz, (hq + 2 * hk) * d), dtype, device)
    before = qkv.clone()
    q = qkv[:, : hq * d].view(nnz, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(nnz, hk, d)
    pos = torch.randint(0, 3000, (nnz,)).to(device)
    eq, ek = rope_float64(q.clone(), k.clone(), pos.cpu())
    if api == "pos_ids":
        kiln.apply_rope_pos_ids_inplace(q, k, pos)
    else:
        kiln.apply_rope_with_cos_sin_cache_inplace(
            pos,
            qkv[:, : hq * d],
            qkv[:, hq * d : (hq + hk) * d],
            d,
            cos_sin_cache_float32(3000, d).to(device),
        )
    check(q, eq)
    check(k, ek)
    assert torch.equal(qkv[:, (hq + hk) * d :], before[:, (hq + hk) * d :]), "v must be untouched"
    # Out of place from the same strided views.
    qo, ko = kiln.apply_rope_pos_ids(q, k, pos)
    assert qo.is_contiguous() and qo.shape == q.shape


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("offset", [1, 2, 4, 8])
def test_every_vector_width_by_alignment(device, offset):
    base = randn((16, 3, 64 + 8), torch.float16, device)
    q = base[..., offset : offset + 64]
    k = randn((16, 1, 64), torch.float16, device)
    pos = torch.randint(0, 3000, (16,)).to(device)
    for interleave in (False, True):
        qo, ko = kiln.apply_rope_pos_ids(q, k, pos, interleave=interleave)
        eq, ek = rope_float64(q, k, pos.cpu(), interleave=interleave)
        check(qo, eq)
        check(ko, ek)


@pytest.mark.parametrize("device", device_params())
def test_empty(device):
    q, k = (
        torch.empty((0, 4, 64), dtype=torch.float16, device=device),
        torch.empty((0, 2, 64), dtype=torch.float16, device=device),
    )
    qo, ko = kiln.apply_rope_pos_ids(q, k, torch.empty(0, dtype=torch.int32, device=device))
    assert qo.shape == q.shape and ko.shape == k.shape


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nnz=st.integers(1, 12),
    hq=st.integers(1, 5),
    hk=st.integers(0, 3),
    half=st.integers(1, 48),
    extra=st.integers(0, 9),
    interleave=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    in_place=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_host(nnz, hq, hk, half, extra, interleave, dtype, in_place, seed):
    gen = torch.Generator().manual_seed(seed)
    rd = 2 * half
    head_dim = rd + 2 * extra
    q, k = randn((nnz, hq, head_dim), dtype, "cpu", gen), randn((nnz, hk, head_dim), dtype, "cpu", gen)
    pos = torch.randint(0, 4000, (nnz,), generator=gen)
    eq, ek = rope_float64(q, k, pos, rd, interleave)
    q0 = q.clone()
    if in_place:
        kiln.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=rd, interleave=interleave)
        qo, ko = q, k
    else:
        qo, ko = kiln.apply_rope_pos_ids(q, k, pos, rotary_dim=rd, interleave=interleave)
    check(qo, eq)
    if hk:
        check(ko, ek)
    assert torch.equal(qo[..., rd:], q0[..., rd:])


@pytest.mark.gpu
@settings(max_examples=50, deadline=None)
@given(
    nnz=st.integers(1, 300),
    hq=st.integers(1, 40),
    hk=st.integers(0, 8),
    half=st.integers(1, 128),
    extra=st.integers(0, 9),
    interleave=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    in_place=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_cuda(nnz, hq, hk, half, extra, interleave, dtype, in_place, seed):
    gen = torch.Generator().manual_seed(seed)
    rd = 2 * half
    head_dim = rd + 2 * extra
    q, k = randn((nnz, hq, head_dim), dtype, "cpu", gen), randn((nnz, hk, head_dim), dtype, "cpu", gen)
    pos = torch.randint(0, 4000, (nnz,), generator=gen)
    eq, ek = rope_float64(q, k, pos, rd, interleave)
    q, k, pos = q.cuda(), k.cuda(), pos.cuda()
    q0 = q.clone()
    if in_place:
        kiln.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=rd, interleave=interleave)
        qo, ko = q, k
    else:
        qo, ko = kiln.apply_rope_pos_ids(q, k, pos, rotary_dim=rd, interleave=interleave)
    check(qo, eq)
    if hk:
        check(ko, ek)
    assert torch.equal(qo[..., rd:], q0[..., rd:])


# ---- bad inputs and bad indices ---------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    q, k = randn((4, 2, 64), torch.float16, device), randn((4, 1, 64), torch.float16, device)
    pos = torch.arange(4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"rotary_dim must be even and in \[2, head_dim = 64\], got 128"):
        kiln.apply_rope_pos_ids(q, k, pos, rotary_dim=128)
    with pytest.raises(ValueError, match=r"rotary_dim must be even and in \[2, head_dim = 64\], got 33"):
        kiln.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=33)
    with pytest.raises(
        ValueError,
        match=r"cos_sin_cache.shape\[1\] \(rotary_dim\) must be even and in "
        r"\[2, head_size = 64\], got 96",
    ):
        kiln.apply_rope_with_cos_sin_cache(
            pos.long(), q.flatten(1), k.flatten(1), 64, torch.zeros((10, 96), device=device)
        )
    with pytest.raises(ValueError, match=r"k.shape\[0\] must equal q.shape\[0\] \(nnz\) \(4\), got 3"):
        kiln.apply_rope_pos_ids(q, k[:3], pos)
    with pytest.raises(ValueError, match=r"k.shape\[2\] must equal q.shape\[2\] \(head_dim\) \(64\), got 32"):
        kiln.apply_rope_pos_ids(q, k[..., :32], pos)
    with pytest.raises(ValueError, match=r"pos_ids.shape\[0\] must equal q.shape\[0\] \(nnz\) \(4\), got 3"):
        kiln.apply_rope_pos_ids(q, k, pos[:3])
    with pytest.raises(TypeError, match="pos_ids.dtype must be int32 or int64, got float32"):
        kiln.apply_rope_pos_ids(q, k, pos.float())
    with pytest.raises(TypeError, match="indptr.dtype must be int32 or int64, got int16"):
        kiln.apply_rope(q, k, torch.tensor([0, 4], dtype=torch.int16, device=device), pos[:1])
    with pytest.raises(TypeError, match="offsets.dtype must be int32 or int64, got float32"):
        kiln.apply_rope(q, k, torch.tensor([0, 4], device=device), pos[:1].float())
    with pytest.raises(
        ValueError, match=r"offsets.shape\[0\] must equal indptr.shape\[0\] - 1 \(batch\) \(1\)"
    ):
        kiln.apply_rope(q, k, torch.tensor([0, 4], dtype=torch.int32, device=device), pos[:2])
    with pytest.raises(
        TypeError, match="q.dtype float32 is not supported; supported dtypes: float16, bfloat16"
    ):
        kiln.apply_rope_pos_ids(q.float(), k.float(), pos)
    with pytest.raises(TypeError, match="k.dtype must be float16"):
        kiln.apply_rope_pos_ids(q, k.bfloat16(), pos)
    with pytest.raises(ValueError, match="q must be contiguous in its last dimension"):
        kiln.apply_rope_pos_ids(randn((4, 64, 2), torch.float16, device).transpose(1, 2), k, pos)
    with pytest.raises(ValueError, match=r"q must be \[nnz, num_q_heads, head_dim\], got shape \[4, 128\]"):
        kiln.apply_rope_pos_ids(q.flatten(1), k, pos)
    with pytest.raises(ValueError, match="q and k overlap in memory"):
        kiln.apply_rope_pos_ids_inplace(q, q[:, :1], pos)
    with pytest.raises(ValueError, match="rope_theta must be finite and > 0, got 0"):
        kiln.apply_rope_pos_ids(q, k, pos, rope_theta=0.0)
    with pytest.raises(ValueError, match=r"high_freq_factor must be > low_freq_factor \(4\), got 4"):
        kiln.apply_llama31_rope_pos_ids(q, k, pos, low_freq_factor=4, high_freq_factor=4)
    with pytest.raises(ValueError, match=r"query must be \[nnz, num_heads \* head_size\] .*head_size = 48"):
        kiln.apply_rope_with_cos_sin_cache(
            pos.long(), q.flatten(1), k.flatten(1), 48, torch.zeros((10, 48), device=device)
        )


def test_index_errors_on_the_host_backend_write_nothing():
    q, k = randn((4, 2, 64), torch.float16, "cpu"), randn((4, 1, 64), torch.float16, "cpu")
    q0 = q.clone()
    cache = cos_sin_cache_float32(10, 64)
    with pytest.raises(
        IndexError, match=r"positions\[2\] = 10 is not a row of cos_sin_cache: valid are \[0, 10\)"
    ):
        kiln.apply_rope_with_cos_sin_cache_inplace(
            torch.tensor([0, 1, 10, 3]), q.flatten(1), k.flatten(1), 64, cache
        )
    with pytest.raises(IndexError, match=r"positions\[0\] = -1 is not a row"):
        kiln.apply_rope_with_cos_sin_cache_inplace(
            torch.tensor([-1, 1, 2, 3]), q.flatten(1), k.flatten(1), 64, cache
        )
    with pytest.raises(IndexError, match="token 3 lies in no request of indptr"):
        kiln.apply_rope_inplace(
            q, k, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
        )
    with pytest.raises(IndexError, match="token 0 lies in no request of indptr"):
        kiln.apply_rope_inplace(
            q, k, torch.tensor([1, 4], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
        )
    assert torch.equal(q, q0), "nothing is written when an index is bad"


@pytest.mark.gpu
def test_index_errors_on_cuda_are_recorded():
    q, k = randn((4, 2, 64), torch.float16, "cuda"), randn((4, 1, 64), torch.float16, "cuda")
    kiln.check_errors()
    kiln.apply_rope_with_cos_sin_cache_inplace(
        torch.tensor([0, 1, 10, 3], device="cuda"),
        q.flatten(1),
        k.flatten(1),
        64,
        cos_sin_cache_float32(10, 64).cuda(),
    )
    with pytest.raises(kiln.DeviceIndexError, match=r"positions\[2\] = 10 is not a row of cos_sin_cache"):
        kiln.check_errors()


# ---- framework integration --------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    q, k = randn((8, 4, 64), torch.bfloat16, device), randn((8, 2, 64), torch.bfloat16, device)
    pos = torch.arange(8, device=device)
    cache = cos_sin_cache_float32(16, 64).to(device)

    def block(q, k):
        a, b = kiln.apply_rope_pos_ids(q, k, pos)
        kiln.apply_llama31_rope_pos_ids_inplace(q, k, pos)
        c, d = kiln.apply_rope_with_cos_sin_cache(pos, q.flatten(1), k.flatten(1), 64, cache)
        return a, b, q, k, c, d

    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(block, fullgraph=True, backend=backend)(q.clone(), k.clone())
    want = block(q.clone(), k.clone())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_custom_ops_are_registered_with_fake_implementations():
    q, k, pos = torch.randn(3, 2, 8).half(), torch.randn(3, 1, 8).half(), torch.arange(3)
    torch.library.opcheck(
        torch.ops.kiln.rope_pos_ids.default,
        (torch.empty_like(q), torch.empty_like(k), q, k, pos, 8, False, 1.0, 1e4, 0.0, 0.0),
    )
    torch.library.opcheck(
        torch.ops.kiln.rope_pos_ids_inplace.default, (q, k, pos, 8, False, 1.0, 1e4, 0.0, 0.0)
    )
    indptr, offsets = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.kiln.rope_indptr_inplace.default, (q, k, indptr, offsets, 8, True, 1.0, 1e4, 0.0, 0.0)
    )
    torch.library.opcheck(
        torch.ops.kiln.rope_cos_sin_cache_inplace.default, (q, k, pos, cos_sin_cache_float32(4, 8), False)
    )


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    q, k = randn((64, 32, 128), torch.bfloat16, "cuda"), randn((64, 8, 128), torch.bfloat16, "cuda")
    pos = torch.randint(0, 4000, (64,), device="cuda")
    cache = cos_sin_cache_float32(4096, 128).cuda()
    qg, kg = q.clone(), k.clone()
    kiln.apply_rope_with_cos_sin_cache_inplace(pos, qg.flatten(1), kg.flatten(1), 128, cache)  # load first
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kiln.apply_rope_with_cos_sin_cache_inplace(pos, qg.flatten(1), kg.flatten(1), 128, cache)
    qg.copy_(q)
    kg.copy_(k)
    g.replay()
    torch.cuda.synchronize()
    eq, ek = rope_float64(q, k, pos.cpu())
    check(qg, eq)
    check(kg, ek)


@pytest.mark.slow
@pytest.mark.gpu
def test_large_cuda():
    q, k = randn((8192, 32, 128), torch.bfloat16, "cuda"), randn((8192, 8, 128), torch.bfloat16, "cuda")
    pos = torch.randint(0, 8192, (8192,), device="cuda")
    eq, ek = rope_float64(q, k, pos.cpu())
    kiln.apply_rope_pos_ids_inplace(q, k, pos)
    torch.testing.assert_close(q.double(), eq.cuda(), rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(k.double(), ek.cuda(), rtol=1.6e-2, atol=1.6e-2)


def test_every_api_by_name_agrees_with_its_reference():
    """Each public name once, directly (the parametrised tests reach them through getattr)."""
    q, k = randn((6, 2, 32), torch.bfloat16, "cpu"), randn((6, 1, 32), torch.bfloat16, "cpu")
    indptr, offsets = torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([9, 100], dtype=torch.int32)
    pos = positions_of(indptr, offsets, 6)
    plain, llama = (
        rope_float64(q, k, pos),
        rope_float64(q, k, pos, rope_scale=8.0, rope_theta=5e5, llama31=LLAMA31),
    )
    results = {
        "apply_rope": (kiln.apply_rope(q, k, indptr, offsets), plain),
        "apply_rope_pos_ids": (kiln.apply_rope_pos_ids(q, k, pos), plain),
        "apply_llama31_rope": (kiln.apply_llama31_rope(q, k, indptr, offsets), llama),
        "apply_llama31_rope_pos_ids": (kiln.apply_llama31_rope_pos_ids(q, k, pos), llama),
    }
    for fn, ref in ((kiln.apply_rope_inplace, plain), (kiln.apply_llama31_rope_inplace, llama)):
        qi, ki = q.clone(), k.clone()
        fn(qi, ki, indptr, offsets)
        results[fn.__name__] = ((qi, ki), ref)
    for fn, ref in (
        (kiln.apply_rope_pos_ids_inplace, plain),
        (kiln.apply_llama31_rope_pos_ids_inplace, llama),
    ):
        qi, ki = q.clone(), k.clone()
        fn(qi, ki, pos)
        results[fn.__name__] = ((qi, ki), ref)
    cache = cos_sin_cache_float32(128, 32)
    results["apply_rope_with_cos_sin_cache"] = (
        tuple(
            t.unflatten(1, (-1, 32))
            for t in kiln.apply_rope_with_cos_sin_cache(pos, q.flatten(1), k.flatten(1), 32, cache)
        ),
        plain,
    )
    qi, ki = q.clone(), k.clone()
    kiln.apply_rope_with_cos_sin_cache_inplace(pos, qi, ki, 32, cache)
    results["apply_rope_with_cos_sin_cache_inplace"] = ((qi, ki), plain)
    assert len(results) == 10
    for (qo, ko), (eq, ek) in results.values():
        check(qo, eq)
        check(ko, ek)
