"""kiln.rope_quantize_fp8 and kiln.mla_rope_quantize_fp8 (RoPE from a cos/sin cache fused with fp8
quantisation) against the float64 reference, on the host backend always and on CUDA where a device
is present: MLA, GQA and MHA layouts, NeoX and interleaved pairs, both fp8 formats, both input
dtypes, scales, no non-rotary part (None), outputs as column bands of one tensor, every vector
width, saturation, both fp8 encoders over every float16 value, int32/int64 positions, bad inputs
and index errors, programmatic dependent launch, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import device_params

import kiln
from kiln.trace.rope import cos_sin_cache_float32, rope_quantize_float64, rope_quantize_reference_fp8

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.float16, torch.bfloat16]
# Half an fp8 step around the exact value: 2^-4 (E4M3) or 2^-3 (E5M2) relative for normal values,
# half the subnormal step absolute (2^-10, 2^-17); the float32 arithmetic adds ~1e-7 relative.
TOL = {torch.float8_e4m3fn: (0.063, 1e-3), torch.float8_e5m2: (0.126, 8e-6)}


def randn(shape, dtype, device, gen=None, scale=1.0):
    return (scale * torch.randn(shape, dtype=torch.float32, generator=gen)).to(device=device, dtype=dtype)


def check(outs, exact, refs, qdtype):
    """Within half an fp8 step of the exact values, and the same bits as the rounded reference but
    where the float32 arithmetic lands a tie on the other side (adjacent codes, rare)."""
    rtol, atol = TOL[qdtype]
    for o, e, r in zip(outs, exact, refs, strict=True):
        assert o.dtype == qdtype and o.shape == e.shape
        torch.testing.assert_close(o.double().cpu(), e.cpu(), rtol=rtol, atol=atol)
        differ = (o.view(torch.uint8).cpu() != r.view(torch.uint8).cpu()).sum()
        assert differ <= max(1, o.numel() // 1000), f"{int(differ)} of {o.numel()} fp8 values differ"


def make(layout, nnz, heads, kv_heads, rope_dim, nope_dim, dtype, device, gen=None):
    q = randn((nnz, heads, rope_dim + nope_dim), dtype, device, gen)
    k_shape = (nnz, rope_dim + nope_dim) if layout == "mla" else (nnz, kv_heads, rope_dim + nope_dim)
    k = randn(k_shape, dtype, device, gen)
    return q, k


LAYOUTS = [("mla", 16, 1, 64, 128), ("gqa", 8, 2, 64, 64), ("mha", 4, 4, 32, 96), ("gqa", 8, 2, 128, 0)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("qdtype", FP8, ids=lambda d: str(d).removeprefix("torch.float8_"))
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "interleave"])
@pytest.mark.parametrize("layout,heads,kv_heads,rope_dim,nope_dim", LAYOUTS, ids=lambda v: str(v))
def test_matches_reference(device, dtype, qdtype, is_neox, layout, heads, kv_heads, rope_dim, nope_dim):
    nnz = 37
    q, k = make(layout, nnz, heads, kv_heads, rope_dim, nope_dim, dtype, device)
    cache = cos_sin_cache_float32(4096, rope_dim).to(device)
    pos = torch.randint(0, 4096, (nnz,), device=device)
    args = (
        q[..., :rope_dim],
        k[..., :rope_dim],
        q[..., rope_dim:] if nope_dim else None,
        k[..., rope_dim:] if nope_dim else None,
        cache,
        pos,
    )
    fn = kiln.mla_rope_quantize_fp8 if layout == "mla" else kiln.rope_quantize_fp8
    outs = fn(*args, is_neox=is_neox, quantize_dtype=qdtype, quant_scale_q=0.75, quant_scale_kv=1.5)
    exact = rope_quantize_float64(*args, is_neox, 0.75, 1.5)
    refs = rope_quantize_reference_fp8(*args, is_neox, 0.75, 1.5, quantize_dtype=qdtype)
    check(outs, exact, refs, qdtype)
    if not nope_dim:
        assert outs[2].shape == (nnz, heads, 0) and outs[3].shape == (*k.shape[:-1], 0)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("offset", [0, 1, 2, 4])
def test_column_bands_of_one_output_and_every_vector_width(device, offset):
    """Outputs as the rotary / non-rotary column bands of one [nnz, heads, rope + nope] tensor (how
    FlashInfer's tests and engines call it), at element offsets that force 8-, 4-, 2- and 1-wide
    vectors; the quantised dtype inferred from the outputs."""
    nnz, heads, r, n = 9, 4, 32, 96
    base = randn((nnz, heads, r + n + 8), torch.bfloat16, device)
    q = base[..., offset : offset + r + n]
    k = randn((nnz, r + n + 8), torch.bfloat16, device)[:, offset : offset + r + n]
    out_q = torch.empty((nnz, heads, r + n + 8), dtype=torch.float8_e5m2, device=device)[
        ..., offset : offset + r + n
    ]
    out_k = torch.empty((nnz, r + n + 8), dtype=torch.float8_e5m2, device=device)[:, offset : offset + r + n]
    cache = cos_sin_cache_float32(64, r).to(device)
    pos = torch.randint(0, 64, (nnz,), dtype=torch.int32, device=device)
    args = (q[..., :r], k[..., :r], q[..., r:], k[..., r:], cache, pos)
    got = kiln.mla_rope_quantize_fp8(
        *args,
        q_rope_out=out_q[..., :r],
        k_rope_out=out_k[..., :r],
        q_nope_out=out_q[..., r:],
        k_nope_out=out_k[..., r:],
        is_neox=False,
    )
    assert got[0].data_ptr() == out_q.data_ptr() and got[3].data_ptr() == out_k[..., r:].data_ptr()
    check(
        (out_q[..., :r], out_k[..., :r], out_q[..., r:], out_k[..., r:]),
        rope_quantize_float64(*args, False),
        rope_quantize_reference_fp8(*args, False, quantize_dtype=torch.float8_e5m2),
        torch.float8_e5m2,
    )


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("qdtype", FP8, ids=lambda d: str(d).removeprefix("torch.float8_"))
def test_every_float16_value_rounds_as_torch(device, qdtype):
    """The non-rotary part at scale 1 is a plain cast: every finite float16 value against torch's
    conversion (clamped to the largest finite value: the kernels saturate, torch's cast overflows)."""
    every = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every[every.isfinite()]
    nnz = 8
    finite = finite[: finite.numel() // nnz * nnz].reshape(nnz, 1, -1).to(device)
    rope = randn((nnz, 1, 2), torch.float16, device)
    cache = cos_sin_cache_float32(8, 2).to(device)
    pos = torch.arange(nnz, device=device)
    big = torch.finfo(qdtype).max
    _, _, qn, kn = kiln.rope_quantize_fp8(
        rope, rope, finite, finite.flip(-1), cache, pos, quantize_dtype=qdtype
    )
    want = finite.float().clamp(-big, big).to(qdtype)
    assert torch.equal(qn.view(torch.uint8).cpu(), want.view(torch.uint8).cpu())
    assert torch.equal(kn.view(torch.uint8).cpu(), want.view(torch.uint8).flip(-1).cpu())


@pytest.mark.parametrize("device", device_params())
def test_saturation(device):
    q, k = make("gqa", 4, 2, 1, 16, 16, torch.float16, device)
    cache = cos_sin_cache_float32(8, 16).to(device)
    pos = torch.arange(4, device=device)
    for qdtype in FP8:
        outs = kiln.rope_quantize_fp8(
            q[..., :16],
            k[..., :16],
            q[..., 16:],
            k[..., 16:],
            cache,
            pos,
            quantize_dtype=qdtype,
            quant_scale_q=1e6,
            quant_scale_kv=-1e6,
        )
        big = torch.finfo(qdtype).max
        for o in outs:
            v = o.float()
            assert not v.isnan().any() and v.abs().max() == big


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    q, k = make("gqa", 4, 2, 1, 16, 16, torch.bfloat16, device)
    cache = cos_sin_cache_float32(8, 16).to(device)
    pos = torch.arange(4, device=device)
    qr, kr, qn, kn = q[..., :16], k[..., :16], q[..., 16:], k[..., 16:]
    with pytest.raises(ValueError, match="cos_sin_cache should be float32, got torch.float64"):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cache.double(), pos)
    with pytest.raises(NotImplementedError, match="kiln has no cuda.tile backend"):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cache, pos, backend="cutile")
    with pytest.raises(ValueError, match="unsupported backend 'cuitle'; expected 'cuda'"):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cache, pos, backend="cuitle")
    with pytest.raises(
        TypeError, match="the quantised dtype must be torch.float8_e4m3fn or torch.float8_e5m2"
    ):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cache, pos, quantize_dtype=torch.float16)
    with pytest.raises(
        TypeError, match=r"k_rope_out.dtype must be torch.float8_e4m3fn .*got torch.float8_e5m2"
    ):
        kiln.rope_quantize_fp8(
            qr,
            kr,
            qn,
            kn,
            cache,
            pos,
            q_rope_out=torch.empty_like(qr, dtype=torch.float8_e4m3fn),
            k_rope_out=torch.empty_like(kr, dtype=torch.float8_e5m2),
        )
    with pytest.raises(
        ValueError,
        match=r"cos_sin_cache.shape\[1\] must equal q_rope.shape\[-1\] \(rope_dim\) "
        r"\(16\), got 32",
    ):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cos_sin_cache_float32(8, 32).to(device), pos)
    with pytest.raises(ValueError, match=r"k_nope.shape\[-1\] must equal q_nope.shape\[-1\] \(no_rope_dim\)"):
        kiln.rope_quantize_fp8(qr, kr, qn, kn[..., :8], cache, pos)
    with pytest.raises(ValueError, match=r"q_nope.shape\[1\] must equal q_rope.shape\[1\] \(num_qo_heads\)"):
        kiln.rope_quantize_fp8(qr, kr, qn[:, :1], kn, cache, pos)
    with pytest.raises(
        ValueError, match=r"pos_ids.shape\[0\] must equal q_rope.shape\[0\] \(nnz\) \(4\), got 3"
    ):
        kiln.rope_quantize_fp8(qr, kr, qn, kn, cache, pos[:3])
    with pytest.raises(TypeError, match="k_rope.dtype must be bfloat16"):
        kiln.rope_quantize_fp8(qr, kr.half(), qn, kn, cache, pos)
    with pytest.raises(ValueError, match=r"rope_dim\) must be even"):
        kiln.rope_quantize_fp8(
            q[..., :15], k[..., :15], qn, kn, cos_sin_cache_float32(8, 16)[:, :15].to(device), pos
        )
    out = torch.empty_like(q, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="q_nope_out and q_rope_out overlap in memory"):
        kiln.rope_quantize_fp8(
            qr, kr, qn, kn, cache, pos, q_rope_out=out[..., :16], q_nope_out=out[..., 8:24]
        )
    with pytest.raises(ValueError, match=r"q_rope must be \[nnz, num_qo_heads, rope_dim\]"):
        kiln.rope_quantize_fp8(qr.flatten(1), kr, qn, kn, cache, pos)


def test_index_errors_on_the_host_backend_write_nothing():
    q, k = make("mla", 4, 2, 1, 16, 16, torch.bfloat16, "cpu")
    out_q = torch.zeros_like(q, dtype=torch.float8_e4m3fn)
    with pytest.raises(
        IndexError, match=r"positions\[1\] = 8 is not a row of cos_sin_cache: valid are \[0, 8\)"
    ):
        kiln.mla_rope_quantize_fp8(
            q[..., :16],
            k[..., :16],
            q[..., 16:],
            k[..., 16:],
            cos_sin_cache_float32(8, 16),
            torch.tensor([0, 8, 1, 2]),
            q_rope_out=out_q[..., :16],
        )
    assert out_q.view(torch.uint8).eq(0).all()


@pytest.mark.gpu
def test_index_errors_on_cuda_are_recorded():
    q, k = make("mla", 4, 2, 1, 16, 16, torch.bfloat16, "cuda")
    kiln.check_errors()
    kiln.mla_rope_quantize_fp8(
        q[..., :16],
        k[..., :16],
        q[..., 16:],
        k[..., 16:],
        cos_sin_cache_float32(8, 16).cuda(),
        torch.tensor([0, 8, 1, 2], device="cuda"),
    )
    with pytest.raises(kiln.DeviceIndexError, match=r"positions\[1\] = 8 is not a row of cos_sin_cache"):
        kiln.check_errors()


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_programmatic_dependent_launch(graph):
    """enable_pdl=True (sm90+: launched with programmatic stream serialisation) gives the same bits
    as without, right after the kernel that writes its input, eagerly and replayed from a graph."""
    nnz, heads, r, n = 512, 32, 64, 64
    src = randn((nnz, heads, r + n), torch.bfloat16, "cuda")
    k = randn((nnz, r + n), torch.bfloat16, "cuda")
    cache = cos_sin_cache_float32(4096, r).cuda()
    pos = torch.randint(0, 4096, (nnz,), device="cuda")
    q = torch.empty_like(src)
    outs = [torch.empty((nnz, heads, r + n), dtype=torch.float8_e4m3fn, device="cuda") for _ in range(2)]

    def step(out, pdl):
        torch.mul(src, 2.0, out=q)  # the producer: rope_quantize must wait for it
        kiln.mla_rope_quantize_fp8(
            q[..., :r],
            k[..., :r],
            q[..., r:],
            k[..., r:],
            cache,
            pos,
            is_neox=False,
            q_rope_out=out[..., :r],
            q_nope_out=out[..., r:],
            enable_pdl=pdl,
        )

    step(outs[0], False)
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(outs[1], True)
        g.replay()
    else:
        step(outs[1], True)
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))


@pytest.mark.parametrize("device", device_params())
def test_torch_compile_fullgraph(device):
    q, k = make("gqa", 8, 4, 2, 32, 32, torch.bfloat16, device)
    cache = cos_sin_cache_float32(16, 32).to(device)
    pos = torch.arange(8, device=device)

    def block(q, k):
        return kiln.rope_quantize_fp8(
            q[..., :32], k[..., :32], q[..., 32:], k[..., 32:], cache, pos, quant_scale_q=0.5
        )

    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(block, fullgraph=True, backend=backend)(q, k)
    for g, w in zip(got, block(q, k), strict=True):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_custom_op_is_registered_with_a_fake_implementation():
    q, k = torch.randn(3, 2, 16).half(), torch.randn(3, 16).half()
    outs = [
        torch.empty(t.shape, dtype=torch.float8_e4m3fn)
        for t in (q[..., :8], k[..., :8], q[..., 8:], k[..., 8:])
    ]
    torch.library.opcheck(
        torch.ops.kiln.rope_quantize.default,
        (
            *outs,
            q[..., :8].contiguous(),
            k[..., :8].contiguous(),
            q[..., 8:].contiguous(),
            k[..., 8:].contiguous(),
            cos_sin_cache_float32(4, 8),
            torch.arange(3),
            1.0,
            1.0,
            False,
            False,
        ),
        # test_schema compares the mutated fp8 outputs with arithmetic torch lacks for fp8 on CPU.
        test_utils=("test_faketensor", "test_autograd_registration"),
    )


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    q, k = make("gqa", 64, 32, 8, 128, 0, torch.bfloat16, "cuda")
    pos = torch.randint(0, 4000, (64,), device="cuda")
    cache = cos_sin_cache_float32(4096, 128).cuda()
    out_q, out_k = (
        torch.empty_like(q, dtype=torch.float8_e4m3fn),
        torch.empty_like(k, dtype=torch.float8_e4m3fn),
    )
    kiln.rope_quantize_fp8(q, k, None, None, cache, pos, q_rope_out=out_q, k_rope_out=out_k)  # load first
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kiln.rope_quantize_fp8(q, k, None, None, cache, pos, q_rope_out=out_q, k_rope_out=out_k)
    out_q.zero_()
    g.replay()
    torch.cuda.synchronize()
    exact = rope_quantize_float64(q, k, None, None, cache, pos)
    refs = rope_quantize_reference_fp8(q, k, None, None, cache, pos)
    check((out_q, out_k), exact[:2], refs[:2], torch.float8_e4m3fn)
