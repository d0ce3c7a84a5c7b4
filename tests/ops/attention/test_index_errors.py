"""No index of any input makes an attention kernel read or write memory it does not own: page ids
past the cache or negative, page tables pointing past kv_indices, batch indices and positions out
of range, kv_last_page_len outside [1, page_size], a decreasing append_indptr, seq_lens shorter
than what is appended. The CPU backend raises IndexError before touching anything; CUDA kernels
skip the work (NaN outputs, no write) and kiln.check_errors() raises DeviceIndexError naming the
argument, the value and the range. Also the host-side checks added with them: aliasing outputs,
empty single decode, inputs that require grad."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import device_params
from paged import make_paged

import kiln

BF16 = torch.bfloat16


def ws(device):
    return torch.empty(8 << 20, dtype=torch.uint8, device=device)


def expect_index_error(device, call, message):
    """CPU: IndexError at the call. CUDA: the call completes, check_errors() raises."""
    if device == "cpu":
        with pytest.raises(IndexError, match=message):
            call()
        return None
    result = call()
    torch.cuda.synchronize()
    with pytest.raises(kiln.DeviceIndexError, match=message):
        kiln.check_errors()
    kiln.check_errors()  # each error is reported once
    return result


# --- prefill -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_prefill_with_a_page_id_past_the_cache(device, backend):
    if backend == "fa3" and (device == "cpu" or torch.cuda.get_device_capability() != (9, 0)):
        pytest.skip("fa3 runs on compute capability 9.0 only")
    gen = torch.Generator().manual_seed(5)
    batch = make_paged([40, 35], 16, 2, 128, BF16, device, gen=gen)
    pages = batch.k_cache.shape[0]
    bad = batch.indices.clone()
    bad[3] = pages + 11  # request 1's first page
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws(device), backend=backend)
    qo_indptr = torch.tensor([0, 40, 75], dtype=torch.int32)
    w.plan(qo_indptr, batch.indptr, bad, batch.last_page_len, 4, 2, 128, 16, causal=True, q_data_type=BF16)
    q = torch.randn(75, 4, 128, generator=gen).to(device, BF16)
    message = rf"kv_indices\[3\] = {pages + 11} is not a page of the cache: valid page ids are \[0, {pages}\)"
    out = expect_index_error(device, lambda: w.run(q, (batch.k_cache, batch.v_cache)), message)
    if out is not None:
        assert out[40:].isnan().all() and out[:40].isfinite().all()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_prefill_with_a_negative_page_id(device, backend):
    # The sm90a producer passes ids on to TMA unchecked (its consumers check them): a negative
    # one must poison exactly its request, and name the entry, as in the fa2 kernel.
    if backend == "fa3" and (device == "cpu" or torch.cuda.get_device_capability() != (9, 0)):
        pytest.skip("fa3 runs on compute capability 9.0 only")
    gen = torch.Generator().manual_seed(9)
    batch = make_paged([40, 35], 16, 2, 128, BF16, device, gen=gen)
    pages = batch.k_cache.shape[0]
    bad = batch.indices.clone()
    bad[1] = -7  # request 0's second page
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws(device), backend=backend)
    qo_indptr = torch.tensor([0, 40, 75], dtype=torch.int32)
    w.plan(qo_indptr, batch.indptr, bad, batch.last_page_len, 4, 2, 128, 16, causal=False, q_data_type=BF16)
    q = torch.randn(75, 4, 128, generator=gen).to(device, BF16)
    message = rf"kv_indices\[1\] = -7 is not a page of the cache: valid page ids are \[0, {pages}\)"
    out = expect_index_error(device, lambda: w.run(q, (batch.k_cache, batch.v_cache)), message)
    if out is not None:
        assert out[:40].isnan().all() and out[40:].isfinite().all()


@pytest.mark.parametrize("device", device_params())
def test_a_page_table_pointing_past_kv_indices(device):
    gen = torch.Generator().manual_seed(6)
    batch = make_paged([20], 16, 2, 64, BF16, device, gen=gen)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws(device))
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 2, 2, 64, 16, q_data_type=BF16)
    w._plan.tensors[0].fill_(5)  # the plan's own indptr copy, made inconsistent behind its back
    q = torch.randn(1, 2, 64, generator=gen).to(device, BF16)
    expect_index_error(device, lambda: w.run(q, (batch.k_cache, batch.v_cache)),
                       r"the page table of request 0 points at kv_indices\[\d+\], past its 2 entries")


@pytest.mark.parametrize("device", device_params())
def test_a_plan_keeps_its_own_copy_of_the_page_table(device):
    gen = torch.Generator().manual_seed(7)
    batch = make_paged([20, 30], 16, 2, 64, BF16, device, gen=gen)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws(device))
    indices = batch.indices.clone()
    w.plan(batch.indptr, indices, batch.last_page_len, 2, 2, 64, 16, q_data_type=BF16)
    q = torch.randn(2, 2, 64, generator=gen).to(device, BF16)
    before = w.run(q, (batch.k_cache, batch.v_cache))
    indices.fill_(1 << 30)  # the caller's tensor changes after plan: run() does not read it
    torch.testing.assert_close(w.run(q, (batch.k_cache, batch.v_cache)), before, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_later_plan_raises_a_recorded_error_without_a_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    gen = torch.Generator().manual_seed(8)
    batch = make_paged([20, 30], 16, 2, 64, BF16, "cuda", gen=gen)
    bad = batch.indices.clone()
    bad[0] = -4
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws("cuda"))
    w.plan(batch.indptr, bad, batch.last_page_len, 2, 2, 64, 16, q_data_type=BF16)
    w.run(torch.randn(2, 2, 64, generator=gen).to("cuda", BF16), (batch.k_cache, batch.v_cache))
    torch.cuda.synchronize()  # (only so the test's timing is deterministic; plan itself never waits)
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 2, 2, 64, 16, q_data_type=BF16)  # copies
    with pytest.raises(kiln.DeviceIndexError, match=r"kv_indices\[0\] = -4 is not a page of the cache"):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 2, 2, 64, 16, q_data_type=BF16)
    kiln.check_errors()  # reported once


# --- append --------------------------------------------------------------------------------------

def _append_case(device, gen):
    batch = make_paged([20, 5], 16, 2, 64, BF16, device, gen=gen)
    key = torch.randn(3, 2, 64, generator=gen).to(device, BF16)
    value = torch.randn(3, 2, 64, generator=gen).to(device, BF16)
    return batch, key, value


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("case", ["batch_high", "batch_negative", "position_past", "position_negative",
                                  "last_page_len", "page_id"])
def test_append_never_writes_through_a_bad_index(device, case):
    gen = torch.Generator().manual_seed(9)
    batch, key, value = _append_case(device, gen)
    bi = torch.tensor([0, 1, 1], dtype=torch.int32, device=device)
    pos = torch.tensor([19, 3, 4], dtype=torch.int32, device=device)
    last, indices = batch.last_page_len.clone(), batch.indices.clone()
    pages = batch.k_cache.shape[0]
    message = {
        "batch_high": r"batch_indices\[1\] = 2 is not a request of the batch: valid are \[0, 2\)",
        "batch_negative": r"batch_indices\[1\] = -1 is not a request of the batch",
        "position_past": r"positions\[2\] = 5 is not a position of its request: valid are \[0, 5\)",
        "position_negative": r"positions\[0\] = -3 is not a position of its request",
        "last_page_len": r"kv_last_page_len\[0\] = 40 is outside \[1, page_size = 16\]",
        "page_id": rf"kv_indices\[2\] = {pages} is not a page of the cache",
    }[case]
    if case == "batch_high":
        bi[1] = 2
    elif case == "batch_negative":
        bi[1] = -1
    elif case == "position_past":
        pos[2] = 5
    elif case == "position_negative":
        pos[0] = -3
    elif case == "last_page_len":
        last[0] = 40  # page_size 16
    else:
        indices[2] = pages  # request 1's page
    before_k, before_v = batch.k_cache.clone(), batch.v_cache.clone()
    expect_index_error(device, lambda: kiln.append_paged_kv_cache(
        key, value, bi, pos, (batch.k_cache, batch.v_cache), indices, batch.indptr, last), message)
    if device == "cpu":  # nothing at all was written
        assert torch.equal(batch.k_cache, before_k) and torch.equal(batch.v_cache, before_v)
    else:  # only the good tokens were: every page other than theirs is untouched
        changed = ((batch.k_cache != before_k).flatten(1).any(1)
                   | (batch.v_cache != before_v).flatten(1).any(1))
        assert int(changed.sum()) <= 2


# --- get_batch_indices_positions -----------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_positions_match_the_reference(device):
    from kiln.trace.attention import batch_indices_positions_reference

    indptr = torch.tensor([0, 3, 3, 7, 8], dtype=torch.int32, device=device)
    seq = torch.tensor([3, 9, 4, 100], dtype=torch.int32, device=device)
    bi, pos = kiln.get_batch_indices_positions(indptr, seq, 8)
    ref = batch_indices_positions_reference(indptr, seq, 8)
    assert torch.equal(bi, ref["batch_indices"]) and torch.equal(pos, ref["positions"])
    assert bi.dtype == pos.dtype == torch.int32


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("case", ["decreasing", "short_seq", "nnz_short", "not_from_zero"])
def test_positions_of_inconsistent_inputs_are_an_index_error(device, case):
    indptr, seq, nnz = [0, 3, 5], [3, 4], 5
    message = r"append_indptr must start at 0, never decrease and end at most at nnz = \d+"
    if case == "decreasing":
        indptr = [0, 4, 2]
        nnz = 2
    elif case == "short_seq":
        seq = [3, 1]
        message = r"seq_lens\[1\] = 1 is shorter than the 2 token\(s\) request 1 appends"
    elif case == "nnz_short":
        nnz = 4
    else:
        indptr = [1, 3, 5]
    args = (torch.tensor(indptr, dtype=torch.int32, device=device), torch.tensor(seq, dtype=torch.int32,
                                                                                   device=device), nnz)
    result = expect_index_error(device, lambda: kiln.get_batch_indices_positions(*args), message)
    if result is not None:
        bi, pos = result
        assert bool(((bi == -1) == (pos == -1)).all()) and bool((bi == -1).any())


@pytest.mark.parametrize("device", device_params())
def test_positions_past_the_real_tokens_are_padding(device):
    """nnz beyond append_indptr[-1] (FlashInfer's contract): those entries get batch index -1 and
    keep the position a preallocated output holds (0 when allocated here); no error."""
    from kiln.trace.attention import batch_indices_positions_reference

    indptr = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    seq = torch.tensor([3, 4], dtype=torch.int32, device=device)
    bi, pos = kiln.get_batch_indices_positions(indptr, seq, 7)
    ref = batch_indices_positions_reference(indptr, seq, 7)
    assert torch.equal(bi, ref["batch_indices"]) and torch.equal(pos, ref["positions"])
    assert bi[5:].tolist() == [-1, -1]
    pre_bi = torch.full((7,), 9, dtype=torch.int32, device=device)
    pre_pos = torch.full((7,), -2, dtype=torch.int32, device=device)
    out = kiln.get_batch_indices_positions(indptr, seq, 7, pre_bi, pre_pos)
    assert out[0] is pre_bi and out[1] is pre_pos
    assert pre_bi.tolist() == [0, 0, 0, 1, 1, -1, -1] and pre_pos.tolist() == [0, 1, 2, 2, 3, -2, -2]
    kiln.check_errors()


def test_positions_bad_arguments_are_clear_errors():
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="append_indptr must be an int32 tensor .* got torch.float32"):
        kiln.get_batch_indices_positions(indptr.float(), torch.tensor([2], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="nnz must be an int >= 0"):
        kiln.get_batch_indices_positions(indptr, torch.tensor([2], dtype=torch.int32), -1)
    with pytest.raises(ValueError, match="seq_lens has 2 entries; append_indptr's 2 entries describe"):
        kiln.get_batch_indices_positions(indptr, torch.tensor([2, 3], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match=r"positions must be an int32 tensor of shape \[2\] on cpu, got "
                                         r"torch.int64 \[2\] on cpu"):
        kiln.get_batch_indices_positions(indptr, torch.tensor([2], dtype=torch.int32), 2,
                                         positions=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="kv_last_page_len has 2 entries; kv_indptr's 2 entries"):
        kiln.get_seq_lens(indptr, torch.tensor([2, 3], dtype=torch.int32), 4)


# --- aliasing, empty inputs, autograd ------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
def test_outputs_that_alias_are_refused(device):
    x = torch.randn(4, 64).to(device, BF16)
    w = torch.randn(64).to(device, BF16)
    expanded = torch.randn(1, 64).to(device, BF16).expand(4, 64)  # stride 0: every row one row
    with pytest.raises(ValueError, match="residual has overlapping elements"):
        kiln.fused_add_rmsnorm(x, expanded, w)
    with pytest.raises(ValueError, match="input and residual overlap in memory"):
        kiln.fused_add_rmsnorm(x, x, w)
    with pytest.raises(ValueError, match="out has overlapping elements"):
        kiln.rmsnorm(x, w, out=torch.empty(1, 64, device=device, dtype=BF16).expand(4, 64))
    v = torch.randn(3, 2, 64).to(device, BF16)
    s = torch.randn(3, 2, device=device)
    with pytest.raises(ValueError, match="overlap in memory"):
        kiln.merge_state_in_place(v, s, v, s)
    kiln.merge_state_in_place(v, s, v.clone(), s.clone())  # apart: fine


@pytest.mark.parametrize("device", device_params())
def test_an_empty_single_decode_is_checked_like_any_other(device):
    q = torch.randn(4, 64).to(device, BF16)
    empty = torch.empty(0, 2, 64, device=device, dtype=BF16)
    out, lse = kiln.single_decode_with_kv_cache(q, empty, empty, return_lse=True)
    assert torch.equal(out, torch.zeros_like(q)) and bool((lse == float("-inf")).all())
    with pytest.raises(TypeError, match="float64 is not supported"):
        kiln.single_decode_with_kv_cache(q.double(), empty.double(), empty.double())
    with pytest.raises(ValueError, match="head_dim 32 is not supported"):
        kiln.single_decode_with_kv_cache(q[:, :32], empty[..., :32], empty[..., :32])
    with pytest.raises(ValueError, match=r"num_qo_heads \(3\) must be a multiple of num_kv_heads \(2\)"):
        kiln.single_decode_with_kv_cache(q[:3], empty, empty)


def test_an_input_that_requires_grad_gets_one_warning():
    from kiln import _ops

    _ops._warned.discard("kiln::rmsnorm")
    x = torch.randn(2, 64, requires_grad=True)
    w = torch.randn(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kiln.rmsnorm(x, w)
        kiln.rmsnorm(x, w)
    assert out.grad_fn is None
    texts = [str(c.message) for c in caught if "inference-only" in str(c.message)]
    assert len(texts) == 1 and "kiln::rmsnorm" in texts[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.inference_mode():
            kiln.rmsnorm(x.detach(), w)
