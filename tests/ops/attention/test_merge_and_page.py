"""merge_state(s) and the paged-KV append, against plain torch references, on the host backend
always and on CUDA where present; plus the identity that ties them to decode: attention over a
KV range equals the merge of attention over its two halves."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from paged import make_paged

import kiln
from kiln.trace.attention import attend as reference_decode
from kiln.trace.attention import merge_float as ref_merge


def states(seq, num, heads, d, dtype, device, gen):
    v = torch.randn(seq, num, heads, d, generator=gen).to(device=device, dtype=dtype)
    s = (4 * torch.randn(seq, num, heads, generator=gen)).to(device)
    s[0, 0, 0] = -math.inf  # an empty state contributes nothing
    return v, s


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_merge_states(device, dtype, d):
    gen = torch.Generator().manual_seed(d)
    v, s = states(37, 5, 6, d, dtype, device, gen)
    out, lse = kiln.merge_states(v, s)
    rv, rs = ref_merge(v, s)
    torch.testing.assert_close(out.float(), rv, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, rs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("num", [1, 6, 37])
def test_merge_states_state_counts(device, num):
    """State counts that do and do not fill the kernel's unrolled loop (4), over heads that do not
    fill its last block (20 heads, 16 a block at head_dim 128)."""
    gen = torch.Generator().manual_seed(num)
    v, s = states(9, num, 20, 128, torch.bfloat16, device, gen)
    out, lse = kiln.merge_states(v, s)
    rv, rs = ref_merge(v, s)
    torch.testing.assert_close(out.float(), rv, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, rs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", device_params())
def test_merge_states_rejects_unaligned_states(device):
    v, s = states(3, 2, 4, 129, torch.float16, device, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="16-byte aligned"):
        kiln.merge_states(v[..., 1:], s)


@pytest.mark.parametrize("device", device_params())
def test_merge_state_and_in_place_with_mask(device):
    gen = torch.Generator().manual_seed(11)
    v, s = states(23, 2, 4, 128, torch.bfloat16, device, gen)
    va, vb, sa, sb = v[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 0].contiguous(), s[:, 1].contiguous()
    out, lse = kiln.merge_state(va, sa, vb, sb)
    rv, rs = ref_merge(v, s)
    torch.testing.assert_close(out.float(), rv, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, rs, rtol=1e-5, atol=1e-5)
    mask = torch.rand(23, generator=gen).to(device) > 0.5
    vi, si = va.clone(), sa.clone()
    kiln.merge_state_in_place(vi, si, vb, sb, mask=mask)
    assert torch.equal(vi[~mask], va[~mask]) and torch.equal(si[~mask], sa[~mask])
    torch.testing.assert_close(vi[mask].float(), rv[mask], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(si[mask], rs[mask], rtol=1e-5, atol=1e-5)
    # a strided mask (every third flag of a larger tensor) and a broadcast one (stride 0)
    wide = torch.zeros(3 * 23, dtype=torch.bool, device=device)
    wide[::3] = mask
    vj, sj = va.clone(), sa.clone()
    kiln.merge_state_in_place(vj, sj, vb, sb, mask=wide[::3])
    assert torch.equal(vj, vi) and torch.equal(sj, si)
    for flag in (False, True):
        vk, sk = va.clone(), sa.clone()
        kiln.merge_state_in_place(vk, sk, vb, sb, mask=torch.tensor([flag], device=device).expand(23))
        assert torch.equal(vk, out if flag else va) and torch.equal(sk, lse if flag else sa)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("split", [1, 50, 333])
def test_attention_over_two_halves_merges_to_the_whole(device, split):
    gen = torch.Generator().manual_seed(split)
    q = torch.randn(8, 128, generator=gen).to(device=device, dtype=torch.float16)
    k = torch.randn(400, 2, 128, generator=gen).to(device=device, dtype=torch.float16)
    v = torch.randn(400, 2, 128, generator=gen).to(device=device, dtype=torch.float16)
    oa, sa = kiln.single_decode_with_kv_cache(q, k[:split], v[:split], return_lse=True)
    ob, sb = kiln.single_decode_with_kv_cache(q, k[split:], v[split:], return_lse=True)
    merged, lse = kiln.merge_state(oa[None], sa[None], ob[None], sb[None])
    whole, whole_lse = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)
    torch.testing.assert_close(merged[0].float(), whole.float(), rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(lse[0], whole_lse, rtol=1e-5, atol=1e-5)
    ref, ref_lse = reference_decode(q, k, v)
    torch.testing.assert_close(merged[0].float(), ref, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("device", device_params())
def test_get_seq_lens(device):
    indptr = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32, device=device)
    last = torch.tensor([5, 7, 16, 1], dtype=torch.int32, device=device)
    assert kiln.get_seq_lens(indptr, last, 16).tolist() == [2 * 16 + 5, 7, 16, 4 * 16 + 1]


def test_get_batch_indices_positions():
    append_indptr = torch.tensor([0, 3, 3, 7, 8], dtype=torch.int32)
    seq_lens = torch.tensor([5, 9, 4, 1], dtype=torch.int32)
    b, p = kiln.get_batch_indices_positions(append_indptr, seq_lens, 8)
    assert b.tolist() == [0, 0, 0, 2, 2, 2, 2, 3]
    assert p.tolist() == [2, 3, 4, 0, 1, 2, 3, 0]
    assert b.dtype == p.dtype == torch.int32


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_append_then_decode_sees_the_new_tokens(device, layout, page_size):
    gen = torch.Generator().manual_seed(page_size)
    hk, d = 4, 64
    old_lens, new = [10, 0, 33], [3, 5, 1]
    final = [a + b for a, b in zip(old_lens, new, strict=True)]
    batch = make_paged(final, page_size, hk, d, torch.bfloat16, device, layout, gen=gen)
    # Gather the final keys with the reference indexing, then overwrite the appended positions.
    expect_k = [batch.keys(b)[0].clone() for b in range(3)]
    expect_v = [batch.keys(b)[1].clone() for b in range(3)]
    append_indptr = torch.tensor([0, 3, 8, 9], dtype=torch.int32, device=device)
    key = torch.randn(9, hk, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    value = torch.randn(9, hk, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    seq_lens = torch.tensor(final, dtype=torch.int32, device=device)
    bi, pos = kiln.get_batch_indices_positions(append_indptr, seq_lens, 9)
    kiln.append_paged_kv_cache(key, value, bi, pos, (batch.k_cache, batch.v_cache), batch.indices,
                               batch.indptr, batch.last_page_len, kv_layout=layout)
    for i in range(9):
        expect_k[int(bi[i])][int(pos[i])] = key[i]
        expect_v[int(bi[i])][int(pos[i])] = value[i]
    for b in range(3):
        k, v = batch.keys(b)
        assert torch.equal(k, expect_k[b]) and torch.equal(v, expect_v[b]), b


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    gen = torch.Generator().manual_seed(0)
    v, s = states(4, 2, 3, 64, torch.float16, device, gen)
    with pytest.raises(ValueError, match=r"s.shape must be v.shape\[:3\]"):
        kiln.merge_states(v, s[:, :1])
    with pytest.raises(TypeError, match="s.dtype must be float32"):
        kiln.merge_states(v, s.half())
    with pytest.raises(ValueError, match="head_dim 48 is not supported"):
        kiln.merge_states(torch.zeros(2, 2, 3, 48, dtype=torch.float16, device=device), s[:2])
    with pytest.raises(ValueError, match=r"v_b.shape must equal v_a.shape"):
        kiln.merge_state(v[:, 0], s[:, 0], v[:3, 1], s[:3, 1])
    batch = make_paged([4], 4, 3, 64, torch.float16, device, gen=gen)
    key = torch.zeros(2, 3, 64, dtype=torch.float16, device=device)
    idx = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="batch_indices.dtype must be int32"):
        kiln.append_paged_kv_cache(key, key, idx, idx.int(), (batch.k_cache, batch.v_cache), batch.indices,
                                   batch.indptr, batch.last_page_len)
    with pytest.raises(ValueError,
                       match=r"append_key.shape\[1\] must equal the cache's kv heads \(3\), got 2"):
        k2 = torch.zeros(2, 2, 64, dtype=torch.float16, device=device)
        kiln.append_paged_kv_cache(k2, k2, idx.int(), idx.int(), (batch.k_cache, batch.v_cache),
                                   batch.indices, batch.indptr, batch.last_page_len)
