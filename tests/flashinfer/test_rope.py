"""Re-creates FlashInfer 0.7's tests/attention/test_rope.py against kiln: RoPE by indptr/offsets and
by position ids (int32 and int64 index tensors), the cos/sin-cache form, and RoPE fused with fp8
quantisation (rope_quantize_fp8, mla_rope_quantize_fp8), with FlashInfer's parametrisations,
calls, assertions and tolerances. The references (Meta's complex-number RoPE with Llama 3.1
frequency scaling, vLLM's native rotary embedding) are written here in kiln's own code.

Left out, and why:
  - test_generalized_rope_quantize_append_kv_cache, test_rope_quantize_fp8_append_paged_kv_cache_decode
    and test_rope_quantize_fp8_append_paged_kv_cache_padding: rope_quantize_fp8_append_paged_kv_cache
    (RoPE + fp8 + paged-cache append in one kernel) is not an API kiln offers.
  - the qk_rmsnorm_rope_append_paged_kv_cache_hy3 tests: that API is newer than FlashInfer 0.7.2.
Changed: test_rope_cos_sin_cache's parametrisation drops its `device` column (always "cuda"): the
device comes from this folder's conftest. test_rope_quantize_fp8_cutile_rejects_unsupported runs
without FlashInfer's cuda.tile availability check (kiln has no cuda.tile backend: it always
refuses one, which is what the test asserts). backend="cutile" cases of
test_generalized_rope_quantize are skipped as not claimed.
"""

from __future__ import annotations

import math

import pytest
import torch

import kiln as flashinfer
from tests.flashinfer.conftest import not_claimed

# ---- references ---------------------------------------------------------------------------------

LLAMA31_SCALING = (8.0, 1.0, 4.0, 8192)  # factor, low_freq_factor, high_freq_factor, old context


def llama_frequencies(dim, theta, use_scaled):
    """Meta's inverse frequencies theta^(-2i/dim) in float32; Llama 3.1 divides the long wavelengths
    by the factor, keeps the short ones and blends the band between."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    if not use_scaled:
        return freqs
    factor, low, high, old = LLAMA31_SCALING
    wavelen = 2 * math.pi / freqs
    smooth = ((old / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    return torch.where(wavelen < old / high, freqs, torch.where(wavelen > old / low, freqs / factor, blended))


def interleaved_rope_reference(x, positions, freqs, chunk=1 << 14):
    """x [tokens, heads, dim] (dim = 2 * len(freqs)) rotated pairwise (x[2i], x[2i+1]) as the complex
    number x[2i] + i x[2i+1] times e^(i pos freq_i), in float32, chunked over tokens to bound memory;
    cast back to x's dtype."""
    out = torch.empty_like(x)
    freqs = freqs.to(x.device)
    for lo in range(0, x.shape[0], chunk):
        angle = positions[lo : lo + chunk].float()[:, None] * freqs[None, :]
        rot = torch.polar(torch.ones_like(angle), angle)[:, None, :]
        xc = torch.view_as_complex(x[lo : lo + chunk].float().reshape(*x[lo : lo + chunk].shape[:-1], -1, 2))
        out[lo : lo + chunk] = torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)
    return out


class RotaryEmbedding(torch.nn.Module):
    """vLLM's native rotary embedding: a float32 cos | sin cache of max_position_embeddings rows, the
    rotation done in float32 over the first rotary_dim dims of each head, the result in `dtype`."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, device):
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style, self.dtype = (
            head_size,
            rotary_dim,
            is_neox_style,
            dtype,
        )
        inv_freq = 1.0 / (
            base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim)
        )
        t = torch.arange(max_position_embeddings, dtype=torch.float, device=device)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    def _rotate(self, x, cos, sin):
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        if self.is_neox_style:
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)

    def forward_native(self, positions, query, key):
        positions = positions.flatten()
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        outs = []
        for x in (query, key):
            shape = x.shape
            x = x.float().view(positions.shape[0], -1, self.head_size)
            rot = self._rotate(x[..., : self.rotary_dim], cos, sin)
            outs.append(torch.cat((rot, x[..., self.rotary_dim :]), dim=-1).reshape(shape).to(self.dtype))
        return tuple(outs)


class FlashInferRotaryEmbedding(RotaryEmbedding):
    def forward_cuda(self, positions, query, key, offsets=None):
        flashinfer.apply_rope_with_cos_sin_cache_inplace(
            positions=positions,
            query=query,
            key=key,
            head_size=self.head_size,
            cos_sin_cache=self.cos_sin_cache,
            is_neox=self.is_neox_style,
        )
        return query, key


def packed_qk(nnz, num_qo_heads, num_kv_heads, head_dim, device):
    qkv_packed = torch.randn(
        nnz, (num_qo_heads + 2 * num_kv_heads) * head_dim, dtype=torch.float16, device=device
    )
    q = qkv_packed[:, : num_qo_heads * head_dim].reshape(nnz, num_qo_heads, head_dim)
    k = qkv_packed[:, num_qo_heads * head_dim : (num_qo_heads + num_kv_heads) * head_dim].reshape(
        nnz, num_kv_heads, head_dim
    )
    return q, k


# ---- test_rope ----------------------------------------------------------------------------------


@pytest.mark.cpu_cases(
    batch_size=(1, 19),
    qkv_len=(4,),
    num_qo_heads=(16,),
    offset=(15,),
    head_dim=(64, 128),
    partial_rotary_factor=(0.25, 0.75, 1.0),
)
@pytest.mark.parametrize("batch_size", [1, 19, 99, 989])
@pytest.mark.parametrize("qkv_len", [1, 4, 19, 204])
@pytest.mark.parametrize("num_qo_heads", [8, 16])
@pytest.mark.parametrize("num_kv_heads", [8])
@pytest.mark.parametrize("offset", [0, 15, 99])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("llama_version", ["llama", "llama31"])
@pytest.mark.parametrize("partial_rotary_factor", [0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope(
    device,
    batch_size,
    qkv_len,
    num_qo_heads,
    num_kv_heads,
    offset,
    head_dim,
    llama_version,
    partial_rotary_factor,
    inplace,
):
    rotary_dim = int(head_dim * partial_rotary_factor)
    nnz = batch_size * qkv_len
    q, k = packed_qk(nnz, num_qo_heads, num_kv_heads, head_dim, device)
    indptr = torch.tensor([i * qkv_len for i in range(batch_size + 1)], dtype=torch.int32, device=device)
    offsets = torch.full((batch_size,), offset, dtype=torch.int32, device=device)

    # reference implementation
    if llama_version == "llama":
        freqs = llama_frequencies(rotary_dim, 10000.0, use_scaled=False)
    else:
        freqs = llama_frequencies(rotary_dim, 5e5, use_scaled=True)
    positions = (torch.arange(qkv_len, device=device) + offset).repeat(batch_size)
    q_rope_ref, k_rope_ref = q.clone(), k.clone()
    q_rope_ref[..., :rotary_dim] = interleaved_rope_reference(q[..., :rotary_dim], positions, freqs)
    k_rope_ref[..., :rotary_dim] = interleaved_rope_reference(k[..., :rotary_dim], positions, freqs)

    # flashinfer implementation
    if llama_version == "llama":
        if inplace:
            flashinfer.apply_rope_inplace(
                q, k, indptr, offsets, rotary_dim=rotary_dim, interleave=True, rope_theta=1e4
            )
            q_rope, k_rope = q, k
        else:
            q_rope, k_rope = flashinfer.apply_rope(
                q, k, indptr, offsets, rotary_dim=rotary_dim, interleave=True, rope_theta=1e4
            )
    else:
        if inplace:
            flashinfer.apply_llama31_rope_inplace(
                q, k, indptr, offsets, rotary_dim=rotary_dim, interleave=True, rope_theta=5e5
            )
            q_rope, k_rope = q, k
        else:
            q_rope, k_rope = flashinfer.apply_llama31_rope(
                q, k, indptr, offsets, rotary_dim=rotary_dim, interleave=True, rope_theta=5e5
            )

    # compare
    torch.testing.assert_close(q_rope_ref, q_rope, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(k_rope_ref, k_rope, rtol=1e-3, atol=1e-3)


# ---- test_rope_pos_ids --------------------------------------------------------------------------


@pytest.mark.cpu_cases(
    batch_size=(19,),
    qkv_len=(4,),
    num_qo_heads=(8,),
    offset=(99,),
    head_dim=(64,),
    partial_rotary_factor=(0.5, 1.0),
)
@pytest.mark.parametrize("batch_size", [1, 19, 99, 989])
@pytest.mark.parametrize("qkv_len", [1, 4, 19, 204])
@pytest.mark.parametrize("num_qo_heads", [8, 16])
@pytest.mark.parametrize("num_kv_heads", [8])
@pytest.mark.parametrize("offset", [0, 15, 99])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("llama_version", ["llama", "llama31"])
@pytest.mark.parametrize("partial_rotary_factor", [0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_rope_pos_ids(
    device,
    batch_size,
    qkv_len,
    num_qo_heads,
    num_kv_heads,
    offset,
    head_dim,
    llama_version,
    partial_rotary_factor,
    inplace,
    interleave,
    idtype,
):
    rotary_dim = int(head_dim * partial_rotary_factor)
    nnz = batch_size * qkv_len
    q, k = packed_qk(nnz, num_qo_heads, num_kv_heads, head_dim, device)
    indptr = torch.tensor([i * qkv_len for i in range(batch_size + 1)], dtype=idtype, device=device)
    offsets = torch.full((batch_size,), offset, dtype=idtype, device=device)
    pos_ids = torch.cat([torch.arange(offset, qkv_len + offset, dtype=idtype) for _ in range(batch_size)]).to(
        device
    )

    if llama_version == "llama":
        rope, rope_pos_ids, theta = flashinfer.apply_rope, flashinfer.apply_rope_pos_ids, 1e4
        rope_inplace, rope_pos_ids_inplace = (
            flashinfer.apply_rope_inplace,
            flashinfer.apply_rope_pos_ids_inplace,
        )
    else:
        rope, rope_pos_ids, theta = flashinfer.apply_llama31_rope, flashinfer.apply_llama31_rope_pos_ids, 5e5
        rope_inplace = flashinfer.apply_llama31_rope_inplace
        rope_pos_ids_inplace = flashinfer.apply_llama31_rope_pos_ids_inplace
    kw = {"rotary_dim": rotary_dim, "interleave": interleave, "rope_theta": theta}
    if inplace:
        q_clone, k_clone = q.clone(), k.clone()
        rope_inplace(q, k, indptr, offsets, **kw)
        q_rope, k_rope = q, k
        rope_pos_ids_inplace(q_clone, k_clone, pos_ids, **kw)
        q_rope_pos_ids, k_rope_pos_ids = q_clone, k_clone
    else:
        q_rope, k_rope = rope(q, k, indptr, offsets, **kw)
        q_rope_pos_ids, k_rope_pos_ids = rope_pos_ids(q, k, pos_ids, **kw)

    # compare
    torch.testing.assert_close(q_rope_pos_ids, q_rope, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(k_rope_pos_ids, k_rope, rtol=1e-3, atol=1e-3)


# ---- test_rope_cos_sin_cache --------------------------------------------------------------------


@pytest.mark.parametrize(
    "head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, batch_size, seq_len, "
    "num_q_heads, num_kv_heads",
    [
        (64, 64, 32, 8000, True, torch.bfloat16, 32, 32, 1, 1),
        (256, 128, 4096, 10000, True, torch.bfloat16, 2, 512, 4, 2),
        (64, 32, 2048, 8432, True, torch.bfloat16, 2, 199, 4, 1),
        (64, 64, 32, 8000, False, torch.bfloat16, 32, 32, 1, 1),
        (64, 64, 32, 8000, False, torch.bfloat16, 32, 32, 1, 1),
        (256, 128, 4096, 9231, False, torch.bfloat16, 3, 231, 4, 2),
        (192, 128, 4096, 9231, True, torch.bfloat16, 3, 231, 3, 2),
        (80, 64, 1024, 10000, False, torch.bfloat16, 4, 64, 2, 2),
        (112, 64, 2048, 12000, True, torch.bfloat16, 5, 77, 2, 1),
        (160, 96, 8192, 10000, False, torch.bfloat16, 2, 128, 6, 3),
    ],
)
def test_rope_cos_sin_cache(
    device,
    head_size,
    rotary_dim,
    max_position_embeddings,
    base,
    is_neox_style,
    dtype,
    batch_size,
    seq_len,
    num_q_heads,
    num_kv_heads,
):
    rope_ref = RotaryEmbedding(
        head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, device
    )
    rope_flashinfer = FlashInferRotaryEmbedding(
        head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, device
    )

    pos_ids = torch.arange(seq_len, device=device).repeat(batch_size)
    query = torch.randn(batch_size * seq_len, num_q_heads * head_size, dtype=dtype, device=device)
    key = torch.randn(batch_size * seq_len, num_kv_heads * head_size, dtype=dtype, device=device)

    query_ref, key_ref = query.clone(), key.clone()
    query_flashinfer, key_flashinfer = query.clone(), key.clone()

    query_ref_out, key_ref_out = rope_ref.forward_native(pos_ids, query_ref, key_ref)
    query_flashinfer_out, key_flashinfer_out = rope_flashinfer.forward_cuda(
        pos_ids, query_flashinfer, key_flashinfer
    )

    torch.testing.assert_close(query_ref_out, query_flashinfer_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(key_ref_out, key_flashinfer_out, atol=1e-2, rtol=1e-2)


# ---- RoPE + fp8 quantisation --------------------------------------------------------------------

ATTENTION_CONFIGS = [
    # MLA: Multiple Q heads, single shared K/V head
    ("mla", 128, 1, 64, 512),
    ("mla", 64, 1, 128, 256),
    ("mla", 128, 1, 64, 128),  # DeepSeek R1's MLA
    ("mla", 32, 1, 32, 96),
    # GQA: Multiple Q heads, fewer K/V heads (grouped)
    ("gqa", 32, 8, 64, 64),
    ("gqa", 64, 16, 128, 128),
    ("gqa", 24, 6, 32, 96),
    ("gqa", 32, 8, 128, 0),  # Llama3 8B
    ("gqa", 64, 8, 128, 0),  # Llama3 70B
    ("gqa", 64, 8, 64, 0),  # GPT-OSS-like
    # MHA: Equal Q and K/V heads
    ("mha", 32, 32, 64, 64),
    ("mha", 16, 16, 128, 128),
    ("mha", 8, 8, 32, 96),
]


@pytest.mark.cpu_cases(num_qo_heads=(32, 24, 8), num_tokens=(19,), backend=("cuda",))
@pytest.mark.parametrize("attention_type,num_qo_heads,num_kv_heads,rope_dim,no_rope_dim", ATTENTION_CONFIGS)
@pytest.mark.parametrize("num_tokens", [1, 19, 128, 199, 899, 2047])
@pytest.mark.parametrize("input_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("enable_pdl", [True, False])
@pytest.mark.parametrize("backend", ["cuda", "cutile"])
def test_generalized_rope_quantize(
    device,
    attention_type,
    num_qo_heads,
    num_kv_heads,
    rope_dim,
    no_rope_dim,
    num_tokens,
    input_dtype,
    quant_dtype,
    enable_pdl,
    backend,
):
    """Test generalized rope + quantization for MLA, GQA, and MHA architectures."""
    if backend == "cutile":
        not_claimed("rope_quantize_fp8's backend='cutile' (FlashInfer's cuda.tile kernels)")
    torch.manual_seed(0)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(0)
    total_dim = rope_dim + no_rope_dim

    q_in = torch.randn(num_tokens, num_qo_heads, total_dim, dtype=input_dtype, device=device)
    if attention_type == "mla":
        k_in = torch.randn(num_tokens, total_dim, dtype=input_dtype, device=device)
    else:
        k_in = torch.randn(num_tokens, num_kv_heads, total_dim, dtype=input_dtype, device=device)
    pos_ids = torch.arange(num_tokens, device=device)

    rope_flashinfer = FlashInferRotaryEmbedding(total_dim, rope_dim, 4096, 10000, False, input_dtype, device)

    q_out_f16_ref, k_out_f16_ref = rope_flashinfer.forward_native(pos_ids, q_in, k_in)
    q_out_f8_ref, k_out_f8_ref = (x.to(quant_dtype) for x in (q_out_f16_ref, k_out_f16_ref))

    q_out = torch.empty_like(q_in, dtype=quant_dtype)
    k_out = torch.empty_like(k_in, dtype=quant_dtype)
    flashinfer.rope.rope_quantize_fp8(
        q_in[..., :rope_dim],
        k_in[..., :rope_dim],
        q_in[..., rope_dim:],
        k_in[..., rope_dim:],
        rope_flashinfer.cos_sin_cache,
        pos_ids,
        is_neox=False,
        q_rope_out=q_out[..., :rope_dim],
        k_rope_out=k_out[..., :rope_dim],
        q_nope_out=q_out[..., rope_dim:],
        k_nope_out=k_out[..., rope_dim:],
        quant_scale_q=1.0,
        quant_scale_kv=1.0,
        enable_pdl=enable_pdl,
        backend=backend,
    )

    where = f"{attention_type} with {num_qo_heads}/{num_kv_heads} heads, {rope_dim}/{no_rope_dim} dims"
    torch.testing.assert_close(
        q_out_f8_ref.float(), q_out.float(), atol=1e-2, rtol=2e-1, msg=f"Q output mismatch for {where}"
    )
    torch.testing.assert_close(
        k_out_f8_ref.float(), k_out.float(), atol=1e-2, rtol=2e-1, msg=f"K output mismatch for {where}"
    )


@pytest.mark.cpu_cases(num_tokens=(19,))
@pytest.mark.parametrize("num_tokens", [1, 19, 128, 199, 899, 2047])
@pytest.mark.parametrize("input_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_mla_rope_quantize(device, num_tokens, input_dtype, quant_dtype, enable_pdl):
    torch.manual_seed(0)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(0)
    num_qo_heads = 128
    q_in = torch.randn(num_tokens, num_qo_heads, 576, dtype=input_dtype, device=device)
    k_in = torch.randn(num_tokens, 576, dtype=input_dtype, device=device)
    pos_ids = torch.arange(num_tokens, device=device)

    rope_flashinfer = FlashInferRotaryEmbedding(576, 64, 4096, 10000, False, input_dtype, device)
    q_out_f16_ref, k_out_f16_ref = rope_flashinfer.forward_native(pos_ids, q_in, k_in)
    q_out_f8_ref, k_out_f8_ref = (x.to(quant_dtype) for x in (q_out_f16_ref, k_out_f16_ref))

    q_out = torch.empty_like(q_in, dtype=quant_dtype)
    k_out = torch.empty_like(k_in, dtype=quant_dtype)
    flashinfer.rope.mla_rope_quantize_fp8(
        q_in[..., :64],
        k_in[..., :64],
        q_in[..., 64:],
        k_in[..., 64:],
        rope_flashinfer.cos_sin_cache,
        pos_ids,
        is_neox=False,
        q_rope_out=q_out[..., :64],
        k_rope_out=k_out[..., :64],
        q_nope_out=q_out[..., 64:],
        k_nope_out=k_out[..., 64:],
        quant_scale_q=1.0,
        quant_scale_kv=1.0,
        enable_pdl=enable_pdl,
    )

    torch.testing.assert_close(q_out_f8_ref.float(), q_out.float(), atol=1e-2, rtol=2e-1)
    torch.testing.assert_close(k_out_f8_ref.float(), k_out.float(), atol=1e-2, rtol=2e-1)


@pytest.mark.parametrize("unsupported", ["neox", "multi_head_key", "bad_backend"])
def test_rope_quantize_fp8_cutile_rejects_unsupported(device, unsupported):
    """A cuda.tile request must raise, never fall through to another implementation; a misspelled
    backend is a ValueError."""
    dt = torch.bfloat16
    num_tokens, rope_dim, no_rope_dim, num_qo_heads = 4, 64, 512, 8
    kv_heads = 2

    q_rope = torch.randn(num_tokens, num_qo_heads, rope_dim, dtype=dt, device=device)
    q_nope = torch.randn(num_tokens, num_qo_heads, no_rope_dim, dtype=dt, device=device)
    k_rope_2d = torch.randn(num_tokens, rope_dim, dtype=dt, device=device)
    k_nope_2d = torch.randn(num_tokens, no_rope_dim, dtype=dt, device=device)
    k_rope_3d = torch.randn(num_tokens, kv_heads, rope_dim, dtype=dt, device=device)
    k_nope_3d = torch.randn(num_tokens, kv_heads, no_rope_dim, dtype=dt, device=device)
    cos_sin_cache = torch.randn(num_tokens, rope_dim, dtype=torch.float32, device=device)
    pos_ids = torch.arange(num_tokens, dtype=torch.int32, device=device)

    k_rope = k_rope_3d if unsupported == "multi_head_key" else k_rope_2d
    k_nope = k_nope_3d if unsupported == "multi_head_key" else k_nope_2d

    kwargs = dict(
        q_rope=q_rope,
        k_rope=k_rope,
        q_nope=q_nope,
        k_nope=k_nope,
        cos_sin_cache=cos_sin_cache,
        pos_ids=pos_ids,
        quant_scale_q=1.0,
        quant_scale_kv=1.0,
        is_neox=(unsupported == "neox"),
        backend="cuitle" if unsupported == "bad_backend" else "cutile",
    )
    expected = ValueError if unsupported == "bad_backend" else NotImplementedError
    with pytest.raises(expected):
        flashinfer.rope.rope_quantize_fp8(**kwargs)
