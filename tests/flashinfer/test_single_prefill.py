"""Re-creates FlashInfer 0.7's tests/attention/test_single_prefill.py against kiln: the same cases,
calls and tolerances, on kiln's own references.

- test_sinqle_prefill_with_paged_kv_cache (FlashInfer's name): single_prefill_with_kv_cache(...,
  backend="fa2") against kiln's float32 attention reference (python/kiln/trace/attention.py),
  where FlashInfer's reference is float16 torch.bmm. FlashInfer's own skip stays: causal with
  qo_len > kv_len, where its reference's softmax over no key is NaN (kiln gives those rows 0).
- test_single_prefill_with_kv_cache_nvfp4: an NVFP4 cache (kv_cache_sf) against the reference on
  the cache dequantised here (E2M1 table times E4M3 scale), FlashInfer's 0.1 tolerance.
- the two head_dim 512 NVFP4 tests: kiln's prefill has head_dim 64, 128 and 256 (not claimed).

On the CPU the grid shrinks to the values in CPU_CASES (one kv_len, a query count below and one
above it, GQA 7, every head_dim, both causal flags; one shape per NVFP4 dtype).
"""

from __future__ import annotations

import pytest
import torch

import kiln as flashinfer
from kiln.trace.attention import attention
from tests.flashinfer.conftest import flashinfer_skips, not_claimed

CPU_CASES = {
    "kv_len": (501, 128),
    "qo_len": (37, 577, 64),
    "num_qo_heads": (7, 1),
}


def single_prefill_with_kv_cache_ref(q, k, v, causal=False):
    """Query i at key position i + kv_len - qo_len; GQA heads share kv heads; 1/sqrt(D) scale."""
    return attention(q, k, v, causal=causal)[0]


@pytest.mark.parametrize("kv_len", [501, 2042, 3771, 4932])
@pytest.mark.parametrize("qo_len", [37, 127, 577, 1024])
@pytest.mark.parametrize("num_kv_heads", [1])
@pytest.mark.parametrize("num_qo_heads", [4, 7])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pos_encoding_mode", ["NONE"])
def test_sinqle_prefill_with_paged_kv_cache(
    device, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, causal, pos_encoding_mode
):
    torch.manual_seed(0)
    if qo_len > kv_len and causal:
        flashinfer_skips("qo_len > kv_len with causal")
    q = torch.randn(qo_len, num_qo_heads, head_dim, device=device, dtype=torch.float16)
    k = torch.randn(kv_len, num_kv_heads, head_dim, device=device, dtype=torch.float16)
    v = torch.randn(kv_len, num_kv_heads, head_dim, device=device, dtype=torch.float16)
    o = flashinfer.prefill.single_prefill_with_kv_cache(
        q, k, v, causal=causal, pos_encoding_mode=pos_encoding_mode, backend="fa2"
    )
    o_ref = single_prefill_with_kv_cache_ref(q, k, v, causal=causal)
    torch.testing.assert_close(o, o_ref.to(o.dtype), rtol=1e-3, atol=1e-3)


# E2M1 codes 0..15 (sign bit 3) as floats.
_E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def random_nvfp4(shape, device):
    """Random NVFP4 bytes of `shape` (two E2M1 codes a byte, both signs cleared) and E4M3 scales,
    one per 16 values, drawn from 1, 1/2, 1/4, 1/8 (bit patterns 56, 48, 40, 32); global scale 1."""
    packed = torch.randint(0, 256, shape, dtype=torch.uint8, device=device) & 0x77
    choices = torch.tensor([56, 48, 40, 32], dtype=torch.uint8, device=device)
    sf = choices[torch.randint(0, 4, (*shape[:-1], shape[-1] // 8), device=device)]
    return packed, sf, torch.tensor(1.0, device=device)


def nvfp4_values(packed, sf, global_scale):
    """float32 values: value 2i of a row is byte i's low nibble, 2i + 1 its high one; each 16
    values times their scale, all times the global scale."""
    table = torch.tensor(_E2M1_VALUES, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = table[codes].unflatten(-1, (-1, 16)) * sf.view(torch.float8_e4m3fn).float()[..., None]
    return values.flatten(-2) * global_scale.float()


def _run_single_prefill_with_kv_cache_nvfp4(
    device, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, causal, q_dtype, pos_encoding_mode="NONE"
):
    if head_dim not in (64, 128, 256):
        not_claimed(f"head_dim {head_dim} in single_prefill_with_kv_cache (kiln's prefill has 64, 128, 256)")
    if qo_len > kv_len and causal:
        flashinfer_skips("qo_len > kv_len with causal")
    torch.manual_seed(42)
    q = torch.randn(qo_len, num_qo_heads, head_dim, device=device, dtype=q_dtype)
    kv_shape = (kv_len, num_kv_heads, head_dim // 2)
    k_packed, k_sf, k_global_scale = random_nvfp4(kv_shape, device)
    v_packed, v_sf, v_global_scale = random_nvfp4(kv_shape, device)
    k_dq = nvfp4_values(k_packed, k_sf, k_global_scale).to(q_dtype)
    v_dq = nvfp4_values(v_packed, v_sf, v_global_scale).to(q_dtype)
    o = flashinfer.prefill.single_prefill_with_kv_cache(
        q,
        k_packed,
        v_packed,
        causal=causal,
        pos_encoding_mode=pos_encoding_mode,
        logits_soft_cap=0.0,
        k_scale=k_global_scale.item(),
        v_scale=v_global_scale.item(),
        kv_cache_sf=(k_sf, v_sf),
        backend="fa2",
    )
    o_ref = single_prefill_with_kv_cache_ref(q, k_dq, v_dq, causal=causal).to(q_dtype)
    torch.testing.assert_close(o, o_ref, rtol=1e-1, atol=1e-1)


@pytest.mark.parametrize("kv_len", [128, 256])
@pytest.mark.parametrize("qo_len", [64, 128])
@pytest.mark.parametrize("num_kv_heads", [1])
@pytest.mark.parametrize("num_qo_heads", [1])
@pytest.mark.parametrize("head_dim", [128])
@pytest.mark.parametrize("causal", [False])
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
def test_single_prefill_with_kv_cache_nvfp4(
    device, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, causal, q_dtype
):
    _run_single_prefill_with_kv_cache_nvfp4(
        device, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, causal, q_dtype
    )


def test_single_prefill_with_kv_cache_nvfp4_large_head(device):
    _run_single_prefill_with_kv_cache_nvfp4(
        device,
        kv_len=256,
        qo_len=64,
        num_kv_heads=1,
        num_qo_heads=1,
        head_dim=512,
        causal=False,
        q_dtype=torch.float16,
    )


def test_single_prefill_with_kv_cache_nvfp4_rope_large_head(device):
    _run_single_prefill_with_kv_cache_nvfp4(
        device,
        kv_len=128,
        qo_len=64,
        num_kv_heads=1,
        num_qo_heads=1,
        head_dim=512,
        causal=False,
        q_dtype=torch.float16,
        pos_encoding_mode="ROPE_LLAMA",
    )
