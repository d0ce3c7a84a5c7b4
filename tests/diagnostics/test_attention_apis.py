"""Diagnostics on the attention APIs: tuple results, in-place merges, and a plan/run wrapper's `run`
called from inside another API (logged as nested, dumped once, its planned module reported)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import kiln
from kiln.diagnostics import replay

BF16 = torch.bfloat16


def calls(dump_dir):
    return sorted(p.parent for p in dump_dir.rglob("call.json"))


def replay_lines(call_dir) -> tuple[int, str]:
    lines = []
    return replay.replay(call_dir, exact=True, say=lines.append), "\n".join(lines)


@pytest.fixture
def dump_dir(tmp_path):
    return tmp_path / "dumps"


def test_tuple_results_and_in_place_merges_are_dumped_and_replayed(decorate, dump_dir):
    dumping = {"KILN_DUMP": 1, "KILN_DUMP_DIR": dump_dir}
    merge = decorate(kiln.cascade.merge_state, "kiln.merge_state", **dumping)
    merge_in_place = decorate(kiln.cascade.merge_state_in_place, "kiln.merge_state_in_place",
                              mutates=("v", "s"), **dumping)
    va, vb = torch.randn(5, 4, 128).to(BF16), torch.randn(5, 4, 128).to(BF16)
    sa, sb = torch.randn(5, 4), torch.randn(5, 4)
    out, lse = merge(va, sa, vb, sb)
    merge_in_place(va, sa, vb, sb)
    first, second = calls(dump_dir)
    assert list(json.loads((first / "call.json").read_text())["outputs"]) == ["result"]
    assert list(json.loads((second / "call.json").read_text())["outputs"]) == ["v", "s"]
    status, text = replay_lines(first)
    assert status == replay.REPRODUCED
    assert "result[0]: identical ([5, 4, 128] bfloat16)" in text
    assert "result[1]: identical ([5, 4] float32)" in text
    status, text = replay_lines(second)
    assert status == replay.REPRODUCED and "v: identical" in text and "s: identical" in text
    assert torch.equal(va, out) and torch.equal(sa, lse)


def test_a_wrapper_run_inside_another_api_is_logged_nested_and_dumped_once(decorate, dump_dir, api_log,
                                                                          monkeypatch):
    settings = {"KILN_LOGLEVEL": 3, "KILN_DUMP": 1, "KILN_DUMP_DIR": dump_dir}
    wrapper = kiln.decode.BatchDecodeWithPagedKVCacheWrapper
    monkeypatch.setattr(wrapper, "run", decorate(wrapper.run, "kiln.BatchDecodeWithPagedKVCacheWrapper.run",
                                                 mutates=("out", "lse"), **settings))
    single = decorate(kiln.decode.single_decode_with_kv_cache, "kiln.single_decode_with_kv_cache",
                      **settings)
    q, k, v = torch.randn(8, 128).to(BF16), torch.randn(33, 2, 128).to(BF16), torch.randn(33, 2, 128).to(BF16)
    out = single(q, k, v)
    log = api_log.read_text()
    outer = re.search(r"#(\d+) kiln\.single_decode_with_kv_cache$", log, re.M)
    assert outer and re.search(rf"#\d+ kiln\.BatchDecodeWithPagedKVCacheWrapper\.run \(inside #{outer[1]}\)$",
                               log, re.M)
    uri = "attention_decode_dtype_bf16_kv_dtype_bf16_head_dim_128_soft_cap_false_rope_false"
    # the module run() got from plan()
    assert re.search(rf"using module {uri}_host \(//ops/attention:decode, host backend", log)
    (call,) = calls(dump_dir)  # the outer call only
    record = json.loads((call / "call.json").read_text())
    assert record["api"] == "kiln.single_decode_with_kv_cache"
    assert record["modules"][0]["uri"] == uri
    status, text = replay_lines(call)
    assert status == replay.REPRODUCED and "result: identical ([8, 128] bfloat16)" in text
    assert out.shape == (8, 128)


def test_replaying_a_wrapper_run_explains_why_it_cannot(decorate, dump_dir):
    wrapper_cls = kiln.decode.BatchDecodeWithPagedKVCacheWrapper
    run = decorate(wrapper_cls.run, "kiln.BatchDecodeWithPagedKVCacheWrapper.run", mutates=("out", "lse"),
                   KILN_DUMP=1, KILN_DUMP_DIR=dump_dir)
    wrapper = wrapper_cls(torch.empty(1 << 20, dtype=torch.uint8))
    k = torch.randn(3, 16, 2, 128).to(BF16)
    wrapper.plan(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32),
                 torch.tensor([5], dtype=torch.int32), 4, 2, 128, 16, q_data_type=BF16, kv_data_type=BF16)
    run(wrapper, torch.randn(1, 4, 128).to(BF16), (k, k.clone()))
    (call,) = calls(dump_dir)
    status, text = replay_lines(call)
    assert status == replay.UNUSABLE and "is a method of a plan/run wrapper" in text
