"""The prefill variants (FlashInfer's): custom masks (booleans, packed bits, multi-item scoring),
RoPE inside the kernel (pos_encoding_mode="ROPE_LLAMA") and ALiBi, on the paged, ragged and single
APIs, against the float32 reference from their definitions (kiln.trace.attention.prefill_attention)
on fresh random inputs: random masks (not only causal ones), requests whose mask bits do not fill
whole bytes, fully masked rows, windows, soft-caps, GQA and head counts that are not powers of two,
RoPE's scale and theta; then bad inputs (each error names the argument), and a compile-only CUDA
build of the variant modules that holds their stack frames near the plain kernel's."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged import make_paged

import kiln
from kiln._prefill_mask import byte_indptr
from kiln.trace.attention import alibi_slopes, prefill_attention

# The kernel rounds P (and, for RoPE, the rotated q and k) to the dtype, the output once; the
# reference is float32 (RoPE: rotated in float64, rounded to the dtype as the kernel keeps it).
TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2.5e-2, 2.5e-2)}
WS = 8 << 20


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def check(out, lse, ref_out, ref_lse, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref_out, rtol=rtol, atol=atol)
    if lse is not None:
        finite = ref_lse.isfinite()
        assert torch.equal(lse.isfinite(), finite)
        torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-3, atol=1e-3)


def packbits_little(bits: torch.Tensor) -> torch.Tensor:
    """numpy.packbits(bits, bitorder="little") in torch (the test's own, from numpy's definition)."""
    bits = bits.reshape(-1).to(torch.uint8).cpu()
    pad = (-bits.numel()) % 8
    bits = torch.cat([bits, torch.zeros(pad, dtype=torch.uint8)]).view(-1, 8)
    return (bits * (2 ** torch.arange(8))).sum(1).to(torch.uint8)


def random_masks(qo_lens, kv_lens, gen, density=0.6):
    """One random boolean block per request, and a fully masked row in each block of 3+ rows."""
    masks = []
    for qo, kv in zip(qo_lens, kv_lens, strict=True):
        m = torch.rand(qo, kv, generator=gen) < density
        if qo >= 3:
            m[1] = False
        masks.append(m)
    return masks


def _batch(device, dtype, gen, qo_lens, kv_lens, hq, hk, d, page):
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = rand((int(qo_indptr[-1]), hq, d), dtype, device, gen)
    paged = make_paged(kv_lens, page, hk, d, dtype, device, gen=gen)
    return qo_indptr, q, paged


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    "pos,packed", [("NONE", False), ("NONE", True), ("ROPE_LLAMA", False), ("ALIBI", True)],
    ids=["bools", "packed", "rope", "alibi-packed"],
)
def test_paged_and_ragged_custom_masks(device, dtype, pos, packed):
    """Random masks over a mixed batch (an empty request, one of one query, bit counts that end
    mid-byte, qo_len > kv_len), with a window on the paged call and a soft-cap on the ragged one."""
    gen = torch.Generator().manual_seed(11)
    qo_lens, kv_lens = [5, 0, 1, 200, 130, 9], [77, 13, 1, 300, 129, 3]
    hq, hk, d, page = 6, 2, 64, 16
    qo_indptr, q, paged = _batch(device, dtype, gen, qo_lens, kv_lens, hq, hk, d, page)
    masks = random_masks(qo_lens, kv_lens, gen)
    flat = torch.cat([m.reshape(-1) for m in masks]).to(device)
    arg = {"custom_mask": flat}
    if packed:  # FlashInfer's segment_packbits layout: each request from a byte of its own
        arg = {"packed_custom_mask": torch.cat([packbits_little(m) for m in masks]).to(device)}
    ws = torch.empty(WS, dtype=torch.uint8, device=device)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(
        qo_indptr,
        paged.indptr,
        paged.indices,
        paged.last_page_len,
        hq,
        hk,
        d,
        page,
        causal=True,
        pos_encoding_mode=pos,
        window_left=40,
        q_data_type=dtype,
        **arg,
    )
    out, lse = w.run(q, (paged.k_cache, paged.v_cache), return_lse=True)
    k_all, v_all = zip(*(paged.keys(b) for b in range(len(qo_lens))), strict=True)
    r = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    r.plan(
        qo_indptr, kv_indptr, hq, hk, d, pos_encoding_mode=pos, logits_soft_cap=20.0, q_data_type=dtype, **arg
    )
    out_r, lse_r = r.run(q, torch.cat(k_all), torch.cat(v_all), return_lse=True)
    for b in range(len(qo_lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if lo == hi:
            continue
        ref = prefill_attention(q[lo:hi], k_all[b], v_all[b], True, 40, mask=masks[b], pos_encoding_mode=pos)
        check(out[lo:hi], lse[lo:hi], ref[0], ref[1], dtype)
        ref = prefill_attention(
            q[lo:hi], k_all[b], v_all[b], mask=masks[b], soft_cap=20.0, pos_encoding_mode=pos
        )
        check(out_r[lo:hi], lse_r[lo:hi], ref[0], ref[1], dtype)
    row = int(qo_indptr[3]) + 1  # a fully masked row: out 0, lse -inf
    assert torch.equal(out[row], torch.zeros_like(out[row])) and bool((lse[row] == -torch.inf).all())


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("pos", ["NONE", "ROPE_LLAMA", "ALIBI"])
def test_single_prefill_variants(device, head_dim, pos):
    """Single prefill with a mask (booleans and packed give the same), RoPE with a non-default
    scale and theta, ALiBi over 12 heads (slopes past the largest power of two), causal, HND."""
    gen = torch.Generator().manual_seed(head_dim)
    qo, kv, hq, hk = 70, 150, 12, 4
    q = rand((qo, hq, head_dim), torch.float16, device, gen)
    k, v = (rand((kv, hk, head_dim), torch.float16, device, gen) for _ in range(2))
    mask = random_masks([qo], [kv], gen, 0.3)[0]
    rope = dict(rope_scale=2.0, rope_theta=5e5) if pos == "ROPE_LLAMA" else {}
    out, lse = kiln.single_prefill_with_kv_cache(
        q, k, v, custom_mask=mask.to(device), pos_encoding_mode=pos, return_lse=True, **rope
    )
    ref = prefill_attention(q, k, v, mask=mask, pos_encoding_mode=pos, **rope)
    check(out, lse, ref[0], ref[1], torch.float16)
    again = kiln.single_prefill_with_kv_cache(
        q, k, v, packed_custom_mask=packbits_little(mask).to(device), pos_encoding_mode=pos, **rope
    )
    assert torch.equal(again, out)
    out, lse = kiln.single_prefill_with_kv_cache(
        q,
        k.transpose(0, 1).contiguous(),
        v.transpose(0, 1).contiguous(),
        causal=True,
        kv_layout="HND",
        pos_encoding_mode=pos,
        return_lse=True,
        **rope,
    )
    ref = prefill_attention(q, k, v, causal=True, pos_encoding_mode=pos, **rope)
    check(out, lse, ref[0], ref[1], torch.float16)


def test_alibi_slopes_are_the_published_ones():
    """8 heads: 2^-1 .. 2^-8 (Press et al.); 12 heads: the 8 then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1, 9, dtype=torch.float64))
    extra = 2.0 ** -(torch.arange(4, dtype=torch.float64) + 0.5)
    torch.testing.assert_close(alibi_slopes(12)[8:], extra)


def _multi_item_reference(qo, kv, prefix, pos_in_items):
    """FlashInfer's multi-item scoring mask from its definition, per query position s = i + kv - qo:
    a prefix query (s < prefix) sees keys <= s; an item query sees the prefix and its own item's
    keys up to itself (t = its position in the item: keys s - t + 1 .. s)."""
    mask = torch.zeros(qo, kv, dtype=torch.bool)
    for i in range(qo):
        s = i + kv - qo
        for j in range(min(s + 1, kv)):
            if s < prefix:
                mask[i, j] = True
            else:
                t = int(pos_in_items[s - prefix])
                mask[i, j] = j < prefix or j > s - t
    return mask


@pytest.mark.parametrize("device", device_params())
def test_multi_item_scoring_two_requests(device):
    """Two requests, token_pos_in_items_len padding between their item lists, queries that start
    inside the prefix (qo_len > kv_len - prefix_len), soft-cap; paged and ragged."""
    gen = torch.Generator().manual_seed(3)
    qo_lens, kv_lens, prefix = [30, 26], [50, 40], [25, 10]
    items = [[0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0], [0, 1, 2] * 10]
    stride = 40
    table = torch.zeros(2 * stride, dtype=torch.int64)
    for r, its in enumerate(items):
        table[r * stride : r * stride + len(its)] = torch.tensor(its)
    hq, hk, d, page = 4, 4, 128, 5
    qo_indptr, q, paged = _batch(device, torch.float16, gen, qo_lens, kv_lens, hq, hk, d, page)
    ws = torch.empty(WS, dtype=torch.uint8, device=device)
    multi = dict(
        prefix_len_ptr=torch.tensor(prefix, dtype=torch.int32).to(torch.uint32).to(device),
        token_pos_in_items_ptr=table.to(torch.uint16).to(device),
        token_pos_in_items_len=stride,
        max_item_len_ptr=torch.tensor([12, 3], dtype=torch.int32).to(torch.uint16).to(device),
    )
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(
        qo_indptr,
        paged.indptr,
        paged.indices,
        paged.last_page_len,
        hq,
        hk,
        d,
        page,
        causal=True,
        logits_soft_cap=30.0,
        **multi,
    )
    out = w.run(q, (paged.k_cache, paged.v_cache))
    k_all, v_all = zip(*(paged.keys(b) for b in range(2)), strict=True)
    kv_indptr = torch.tensor([0, kv_lens[0], sum(kv_lens)], dtype=torch.int32)
    r = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    r.plan(qo_indptr, kv_indptr, hq, hk, d, logits_soft_cap=30.0, **multi)
    out_r = r.run(q, torch.cat(k_all), torch.cat(v_all))
    for b in range(2):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        mask = _multi_item_reference(qo_lens[b], kv_lens[b], prefix[b], table[b * stride :])
        ref = prefill_attention(q[lo:hi], k_all[b], v_all[b], mask=mask, soft_cap=30.0)[0]
        check(out[lo:hi], None, ref, None, torch.float16)
        check(out_r[lo:hi], None, ref, None, torch.float16)


@pytest.mark.parametrize("device", device_params())
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lens=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 90)), min_size=1, max_size=4),
    density=st.floats(0.0, 1.0),
    page=st.sampled_from([1, 3, 16]),
    seed=st.integers(0, 2**16),
)
def test_property_random_masks(device, lens, density, page, seed):
    gen = torch.Generator().manual_seed(seed)
    qo_lens, kv_lens = [a for a, _ in lens], [b for _, b in lens]
    qo_indptr, q, paged = _batch(device, torch.float16, gen, qo_lens, kv_lens, 2, 1, 64, page)
    masks = random_masks(qo_lens, kv_lens, gen, density)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8, device=device))
    w.plan(
        qo_indptr,
        paged.indptr,
        paged.indices,
        paged.last_page_len,
        2,
        1,
        64,
        page,
        custom_mask=torch.cat([m.reshape(-1) for m in masks]).to(device),
    )
    out = w.run(q, (paged.k_cache, paged.v_cache))
    for b in range(len(lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if lo < hi:
            k, v = paged.keys(b)
            check(out[lo:hi], None, prefill_attention(q[lo:hi], k, v, mask=masks[b])[0], None, torch.float16)


def test_byte_indptr_gives_each_request_whole_bytes():
    assert byte_indptr(torch.tensor([3, 0, 2]), torch.tensor([3, 5, 8])).tolist() == [0, 2, 2, 4]


@pytest.mark.parametrize("device", device_params())
def test_bad_inputs(device):
    gen = torch.Generator().manual_seed(0)
    q = rand((5, 2, 64), torch.float16, device, gen)
    k = rand((7, 2, 64), torch.float16, device, gen)
    single = kiln.single_prefill_with_kv_cache
    with pytest.raises(ValueError, match=r"custom_mask has 30 elements .* sum to 35"):
        single(q, k, k, custom_mask=torch.ones(5, 6, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="packed_custom_mask has 4 bytes; the requests' masks take 5"):
        single(q, k, k, packed_custom_mask=torch.zeros(4, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError, match="packed_custom_mask must be a 1-D uint8 tensor"):
        single(q, k, k, packed_custom_mask=torch.zeros(5, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="pos_encoding_mode must be one of 'NONE', 'ROPE_LLAMA', 'ALIBI'"):
        single(q, k, k, pos_encoding_mode="ROPE")
    with pytest.raises(ValueError, match="rope_theta must be None or a finite number > 0"):
        single(q, k, k, pos_encoding_mode="ROPE_LLAMA", rope_theta=0.0)
    with pytest.raises(ValueError, match="scale_q, scale_k and scale_v are FlashInfer's per-head fp8"):
        single(q, k, k, scale_q=torch.ones(2))
    with pytest.raises(ValueError, match="o_dtype torch.bfloat16 must be None or q's dtype"):
        single(q, k, k, o_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"k's scales must be \[7, 2, 4\]"):
        packed = torch.zeros(7, 2, 32, dtype=torch.uint8, device=device)
        single(q, packed, packed, kv_cache_sf=(torch.zeros(7, 2, 3, dtype=torch.uint8, device=device),) * 2)
    with pytest.raises(ValueError, match="backend='fa3' has no custom mask"):
        single(q, k, k, custom_mask=torch.ones(5, 7, dtype=torch.bool, device=device), backend="fa3")
    ws = torch.empty(WS, dtype=torch.uint8, device=device)
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws)
    table = (
        torch.tensor([0, 5], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32),
        torch.arange(1, dtype=torch.int32),
        torch.tensor([7], dtype=torch.int32),
    )
    with pytest.raises(ValueError, match=r"request 0's items read token_pos_in_items_ptr\[0:5\]"):
        w.plan(
            *table,
            2,
            2,
            64,
            16,
            prefix_len_ptr=torch.tensor([2]),
            token_pos_in_items_ptr=torch.zeros(4, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="token_pos_in_items_ptr must be a 1-D .* integer tensor"):
        w.plan(*table, 2, 2, 64, 16, prefix_len_ptr=torch.tensor([2]), token_pos_in_items_ptr=torch.zeros(9))
    with pytest.raises(ValueError, match="multi-item scoring .* pass no custom_mask"):
        w.plan(
            *table,
            2,
            2,
            64,
            16,
            prefix_len_ptr=torch.tensor([2]),
            token_pos_in_items_ptr=torch.zeros(9, dtype=torch.int32),
            custom_mask=torch.ones(35, dtype=torch.bool),
        )
    with pytest.raises(ValueError, match="o_data_type torch.bfloat16 must be None or q's dtype"):
        w.plan(*table, 2, 2, 64, 16, o_data_type=torch.bfloat16)


# ---- compile-only: the variant modules build, and spill about as much as the plain kernel -------


def _stack_frames(lib) -> dict[str, int]:
    from release.verify import cuobjdump

    listing = subprocess.run(
        [cuobjdump(), "-res-usage", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"Function (\S*prefill_paged_kernel\S*):\n\s*REG:\d+ STACK:(\d+)", listing)
    }


@pytest.mark.slow
def test_variant_modules_compile_with_about_the_plain_kernels_stack(tmp_path):
    pytest.importorskip("release.verify")
    from kiln.codegen.dispatch import specialisation
    from kiln.codegen.graph import load_graph
    from kiln.codegen.specs import compile_spec
    from kiln.runtime import jit, metadata, toolchain
    from kiln.runtime.arch import ArchContext, parse_arch_list
    from kiln.runtime.workspace import Workspace
    from release.verify import cuobjdump

    if not toolchain.available("cuda") or not cuobjdump():
        pytest.skip("needs nvcc and cuobjdump")
    graph = load_graph()
    target = graph.target("//ops/attention:prefill")
    ctx = ArchContext(parse_arch_list("9.0a"), "the H200's build")
    stacks = {}
    for mask, pos in (("false", "none"), ("true", "rope"), ("false", "alibi")):
        params = {
            "dtype": "bf16",
            "head_dim": "128",
            "soft_cap": "false",
            "custom_mask": mask,
            "pos_encoding": pos,
        }
        spec = compile_spec(specialisation(target, params), "cuda", graph)
        status, plan = jit.build(spec, ctx, workspace=Workspace(tmp_path), quiet=True)
        assert status == "built"
        (stack,) = _stack_frames(plan.key_dir / metadata.read(plan.key_dir).library).values()
        stacks[(mask, pos)] = stack
    # Built for 9.0a at bf16 x 128 (the H200's build, the most registers: 2 row tiles a warp): the
    # plain kernel has a 48-byte frame (unchanged by the variants); ALiBi 40, the custom mask 48,
    # the mask with RoPE 64 (measured; the 16 bytes more are the one variant above the plain one).
    plain = stacks[("false", "none")]
    assert plain <= 48 and all(s <= plain + 16 for s in stacks.values()), stacks
