"""Dumps (KILN_DUMP, KILN_DUMP_DIR) and replay: what a dump holds, its bounds and filters, its
directory, and `python -m kiln replay` reproducing (or not) the recorded outputs."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import kiln
from kiln.diagnostics import replay
from kiln.diagnostics.dump import DumpDirError
from kiln.diagnostics.record import Decoder, Encoder, rebuild_tensor


def calls(dump_dir):
    """The call directories in a dump directory, in call order."""
    return sorted(p.parent for p in dump_dir.rglob("call.json"))


def record(call_dir) -> dict:
    return json.loads((call_dir / "call.json").read_text())


def replayed(call_dir, **kw) -> tuple[int, str]:
    lines = []
    status = replay.replay(call_dir, say=lines.append, **kw)
    return status, "\n".join(lines)


@pytest.fixture
def dumping(decorate, tmp_path):
    """dumping(fn, name, mutates=(), **settings): `fn` decorated with dumps into tmp_path/dumps."""
    def make(fn, name, mutates=(), **settings):
        return decorate(fn, name, mutates, KILN_DUMP=1, KILN_DUMP_DIR=tmp_path / "dumps", **settings)
    return make


def test_a_dump_holds_inputs_before_outputs_after_and_the_record(dumping, tmp_path):
    rmsnorm = dumping(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",))
    x, w = torch.randn(3, 40), torch.randn(40)
    before = x.clone()
    rmsnorm(x, w, eps=1e-5, out=x)  # in place: out is input
    (call,) = calls(tmp_path / "dumps")
    assert call.name.endswith("-kiln.rmsnorm")
    assert stat.S_IMODE((tmp_path / "dumps").stat().st_mode) == 0o700
    r = record(call)
    assert r["api"] == "kiln.rmsnorm" and r["status"] == "completed"
    assert [a["name"] for a in r["args"]] == ["input", "weight"]
    assert r["kwargs"] == {"eps": {"value": 1e-5}, "out": {"alias": "input"}}
    assert r["args"][0]["shape"] == [3, 40] and r["args"][0]["dtype"] == "float32"
    assert r["device"]["device"] == "cpu" and r["backend"] == "host"
    (module,) = r["modules"]
    assert module["module"] == "norm_dtype_f32_host" and module["uri"] == "norm_dtype_f32"
    assert module["label"] == "//ops:norm" and len(module["spec_key"]) == 64 and module["flags"]["cxx"]
    assert r["environment"]["kiln_version"] == kiln.__version__
    assert r["environment"]["non_default"]["KILN_DUMP"] == "1"
    inputs, outputs = load_file(call / "inputs.safetensors"), load_file(call / "outputs.safetensors")
    assert set(inputs) == {"input", "weight"} and torch.equal(inputs["input"], before)
    assert list(r["outputs"]) == ["out"] and torch.equal(outputs["out"], x)


def test_in_place_apis_record_their_mutated_tensors_as_outputs(dumping, tmp_path):
    fused = dumping(kiln.norm.fused_add_rmsnorm, "kiln.fused_add_rmsnorm", mutates=("input", "residual"))
    x, r, w = torch.randn(2, 64), torch.randn(2, 64), torch.randn(64)
    x0, r0 = x.clone(), r.clone()
    fused(x, r, w)
    (call,) = calls(tmp_path / "dumps")
    inputs, outputs = load_file(call / "inputs.safetensors"), load_file(call / "outputs.safetensors")
    assert torch.equal(inputs["input"], x0) and torch.equal(inputs["residual"], r0)
    assert torch.equal(outputs["input"], x) and torch.equal(outputs["residual"], r)
    assert not torch.equal(outputs["input"], x0)


def test_the_count_bound(dumping, tmp_path, api_log):
    fn = dumping(lambda x: x + 1, "tests.inc", KILN_DUMP_MAX_COUNT=2)
    for _ in range(4):
        fn(torch.ones(2))
    assert len(calls(tmp_path / "dumps")) == 2
    log = api_log.read_text()
    assert log.count("dump count limit reached (KILN_DUMP_MAX_COUNT=2)") == 1  # announced once


def test_the_size_bound(dumping, tmp_path, api_log):
    fn = dumping(lambda x: x + 1, "tests.inc_bytes", KILN_DUMP_MAX_BYTES=3 * 400)
    fn(torch.ones(100))  # 400 bytes in, 400 out: fits
    fn(torch.ones(100))  # its input fits (800 + 400), its output does not
    fn(torch.ones(100))  # nothing fits: not dumped
    first, second = calls(tmp_path / "dumps")
    assert "outputs_file" in record(first)
    assert record(second)["notes"] == ["outputs not saved: KILN_DUMP_MAX_BYTES reached"]
    assert not (second / "outputs.safetensors").exists()
    assert api_log.read_text().count("dump size limit reached (KILN_DUMP_MAX_BYTES=1200") == 1


def test_filters_gate_dumps(dumping, tmp_path):
    a = dumping(lambda x: x, "tests.alpha", KILN_DUMP_INCLUDE="tests.*", KILN_DUMP_EXCLUDE="*beta")
    b = dumping(lambda x: x, "tests.beta", KILN_DUMP_INCLUDE="tests.*", KILN_DUMP_EXCLUDE="*beta")
    a(torch.ones(1))
    b(torch.ones(1))
    assert [c.name.split("-", 1)[1] for c in calls(tmp_path / "dumps")] == ["tests.alpha"]


def test_a_raised_call_is_recorded_as_raised(dumping, tmp_path):
    rmsnorm = dumping(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",))
    with pytest.raises(ValueError):
        rmsnorm(torch.randn(2, 8), torch.randn(7))
    (call,) = calls(tmp_path / "dumps")
    r = record(call)
    assert r["status"] == "raised" and r["error"]["type"] == "ValueError"
    status, out = replayed(call)
    assert status == replay.REPRODUCED and "raised ValueError" in out and "(as recorded)" in out


@pytest.mark.parametrize("where,match", [
    ("a file", r"KILN_DUMP_DIR=.* cannot be created"),
    ("the artifact workspace", r"is inside the JIT artifact workspace .* dedicated directory"),
])
def test_an_unusable_dump_directory_is_an_error_naming_it(decorate, tmp_path, where, match):
    if where == "a file":
        (tmp_path / "plain").write_text("")
        target = tmp_path / "plain" / "dumps"
    else:
        target = tmp_path / "ws" / "artifacts" / "dumps"
    fn = decorate(toy_identity, "tests.identity", KILN_DUMP=1, KILN_DUMP_DIR=target,
                  KILN_WORKSPACE_BASE=tmp_path / "ws")
    with pytest.raises(DumpDirError, match=match):
        fn(torch.ones(1))


def toy_identity(x):
    return x


# --- the value format ------------------------------------------------------------------------------

def test_layouts_and_aliases_are_rebuilt_exactly():
    base = torch.randn(5, 24)
    strided = base[1:, 3:11]  # storage offset 27, row stride 24
    expanded = torch.randn(1, 8).expand(4, 8)  # row stride 0
    enc = Encoder()
    specs = [enc.encode(v, k) for k, v in (("a", strided), ("b", expanded), ("c", strided),
                                           ("d", [1.5, float("inf"), None, torch.bfloat16]))]
    assert specs[2] == {"alias": "a"}
    dec = Decoder(enc.tensors, torch.device("cpu"))
    a, b, c, d = (dec.decode(s, k) for s, k in zip(specs, "abcd", strict=True))
    assert a.stride() == (24, 1) and a.storage_offset() == 27 and torch.equal(a, strided)
    assert b.stride() == (0, 1) and torch.equal(b, expanded)
    assert c is a
    assert d == [1.5, float("inf"), None, torch.bfloat16]


def test_rebuilt_storage_outside_the_view_is_poisoned():
    t = rebuild_tensor({"shape": [2, 2], "dtype": "float32", "strides": [4, 1], "storage_offset": 1},
                       torch.ones(2, 2), torch.device("cpu"))
    storage = torch.as_strided(t, (t.storage_offset() + 6,), (1,), 0)
    assert torch.isnan(storage[0]) and torch.isnan(storage[3]) and torch.equal(t, torch.ones(2, 2))


# --- replay ----------------------------------------------------------------------------------------

def test_replay_reproduces_a_call_and_notices_different_outputs(dumping, tmp_path):
    gemma = dumping(kiln.norm.gemma_rmsnorm, "kiln.gemma_rmsnorm", mutates=("out",))
    x = torch.randn(6, 100, dtype=torch.bfloat16)[::2]  # strided rows
    gemma(x, torch.randn(100, dtype=torch.bfloat16))
    (call,) = calls(tmp_path / "dumps")
    status, out = replayed(call, exact=True)
    assert status == replay.REPRODUCED and "result: identical ([3, 100] bfloat16)" in out
    tampered = load_file(call / "outputs.safetensors")
    tampered["result"][1, 7] += 1
    save_file(tampered, call / "outputs.safetensors")
    status, out = replayed(call)
    assert status == replay.DIFFERENT and "result: differs beyond tolerance ([3, 100] bfloat16)" in out
    assert "NOT reproduced" in out


def test_replay_refuses_what_it_cannot_rebuild(dumping, tmp_path):
    fn = dumping(lambda x, obj: x, "tests.takes_object")
    fn(torch.ones(1), object())
    (call,) = calls(tmp_path / "dumps")
    status, out = replayed(call)
    assert status == replay.UNUSABLE and "cannot rebuild 'object'" in out
    r = record(call)
    r["api"] = "kiln.no_such_api"
    (call / "call.json").write_text(json.dumps(r))
    status, out = replayed(call)
    assert status == replay.UNUSABLE and "no API named 'kiln.no_such_api'" in out


def test_replay_command_line(dumping, tmp_path):
    rmsnorm = dumping(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",))
    rmsnorm(torch.randn(2, 8), torch.randn(8))
    rmsnorm(torch.randn(3, 8), torch.randn(8))
    proc = kiln_cli("replay", tmp_path / "dumps")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("=> reproduced") == 2 and "2 dumps replayed; all reproduced" in proc.stdout
    proc = kiln_cli("replay", tmp_path / "nothing")
    assert proc.returncode == 2 and "holds no dump" in proc.stderr


def kiln_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                          text=True, timeout=300)
