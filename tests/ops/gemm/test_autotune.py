"""The GEMM autotuner (kiln/autotuner.py) on the host backend with fake timers, so it runs in CI:
persistence round trip, entries of another environment ignored (with one log line), blocklisted
tactics never timed nor run (launch counts), concurrent writers of one cache file, the same choice
across two tunings of one shape, nothing written without an explicit path. On a GPU (-m gpu) the
real timers (CUDA events, %globaltimer, cold L2) tune a call."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from helpers import REPO

import kiln
from kiln import _jit, autotuner
from kiln.trace import gemm as ref

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _fresh_tuner():
    autotuner.clear()
    yield
    autotuner.clear()


def mm_module(device="cpu"):
    return _jit.module(kiln.gemm.MM, torch.empty(0, device=device).device, "test", dtype=BF16)


def operands(m, n, k, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return ref.operand((m, k), k, g).to(device, BF16), ref.operand((n, k), k, g).to(device, BF16).t()


class FakeTimer:
    """times[name] (seconds) for every tactic named, else 1 ms; runs each tactic once (so the
    launch counts see what was timed) and records the names it was asked for."""

    def __init__(self, times=None, noise=None):
        self.times = times or {}
        self.noise = noise
        self.asked: list[str] = []

    def __call__(self, name, run):
        self.asked.append(name)
        run()
        t = self.times.get(name, 1e-3)
        return t * (1 + self.noise()) if self.noise else t


def test_tuning_picks_the_fastest_and_persists_it(tmp_path):
    cache = tmp_path / "tactics.json"
    a, b = operands(9, 256, 128)
    mod = mm_module()
    timer = FakeTimer({"small_m_16x64_k4": 2e-4, "sm80_128x128x64_s3": 3e-4})
    with kiln.autotune(cache=cache, timer=timer) as ctx:
        out = kiln.mm_bf16(a, b)
        again = kiln.mm_bf16(a, b)  # tuned once: the second call times nothing
    assert len(ctx.tuned) == 1 and timer.asked.count("small_m_16x64_k4") == 1
    torch.testing.assert_close(
        out.double(), ref.mm_reference_float(a, b, torch.float64), rtol=1.6e-2, atol=1e-2
    )
    assert torch.equal(out, again)
    doc = json.loads(cache.read_text())
    assert doc["format"] == "kiln-autotune-cache" and doc["version"] == 1
    ((key, entry),) = doc["entries"].items()
    assert entry["tactic"] == "small_m_16x64_k4" and entry["op"] == "mm"
    assert entry["env"] == {"gpu": "cpu", "cc": "host", "cuda": "none", "kiln": kiln.__version__}
    assert entry["shape"] == "m16 batch1 n256 k128 bf16 b:kmajor out:bf16" and entry["timer"] == "FakeTimer"
    assert set(entry["timings_us"]) == set(timer.asked) and entry["median_us"] == pytest.approx(200.0)

    # A fresh process state: the file alone serves the tactic, nothing is timed.
    autotuner.clear()
    mod.reset_launch_counts()
    untimed = FakeTimer()
    with kiln.autotune(False, cache=cache, timer=untimed):
        kiln.mm_bf16(*operands(13, 256, 128, seed=1))  # m 13: the same bucket (m16)
    assert untimed.asked == [] and mod.launch_counts() == {"small_m_16x64_k4": 1}
    mod.reset_launch_counts()
    kiln.mm_bf16(*operands(13, 256, 128, seed=1))  # after the context: what this process tuned
    assert mod.launch_counts() == {"small_m_16x64_k4": 1}
    autotuner.clear()
    mod.reset_launch_counts()
    kiln.mm_bf16(*operands(13, 256, 128, seed=1))  # nothing tuned: the default heuristic
    assert mod.launch_counts() == {"small_m_16x32_k8": 1}


def test_a_bucket_covers_smaller_rows_only(tmp_path):
    timer = FakeTimer()
    with kiln.autotune(timer=timer) as ctx:
        for m in (9, 16, 17, 32):
            kiln.mm_bf16(*operands(m, 64, 64))
    assert sorted(e.shape.split()[0] for e in ctx.tuned.values()) == ["m16", "m32"]


def test_tune_mode_false_times_nothing_and_runs_the_default():
    timer = FakeTimer()
    mod = mm_module()
    mod.reset_launch_counts()
    with kiln.autotune(False, timer=timer) as ctx:
        kiln.mm_bf16(*operands(4, 64, 64))
    assert timer.asked == [] and ctx.tuned == {}
    assert mod.launch_counts() == {"small_m_8x32_k8": 1}


def test_entries_of_another_environment_are_ignored_with_one_log_line(tmp_path, caplog):
    cache = tmp_path / "tactics.json"
    with kiln.autotune(cache=cache, timer=FakeTimer({"sm80_128x128x64_s4": 1e-4})):
        kiln.mm_bf16(*operands(4, 64, 64))
    doc = json.loads(cache.read_text())
    ((key, entry),) = doc["entries"].items()
    for gpu, cuda, version in (("NVIDIA H100 80GB HBM3", "12.8", kiln.__version__), ("cpu", "none", "0.0.0")):
        other = {
            **entry,
            "env": {"gpu": gpu, "cc": "9.0" if gpu != "cpu" else "host", "cuda": cuda, "kiln": version},
        }
        doc["entries"][autotuner.entry_key(other["op"], other["shape"], other["env"])] = other
    cache.write_text(json.dumps(doc))
    autotuner.clear()
    mod = mm_module()
    mod.reset_launch_counts()
    with caplog.at_level(logging.WARNING, logger="kiln.autotune"):
        with kiln.autotune(False, cache=cache):
            kiln.mm_bf16(*operands(4, 64, 64))
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln.autotune"]
    assert (
        len(lines) == 1 and "ignored 2 of 3 entries tuned for another GPU, CUDA or kiln version" in lines[0]
    )
    assert "NVIDIA H100 80GB HBM3/9.0/12.8" in lines[0]
    assert mod.launch_counts() == {"sm80_128x128x64_s4": 1}  # this environment's entry served
    assert len(autotuner.entries()) == 1


def test_a_file_that_is_not_a_cache_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(autotuner.AutotuneError, match="notes.json is not a kiln autotune cache"):
        with kiln.autotune(cache=bad):
            pass
    bad.write_text("{")
    with pytest.raises(autotuner.AutotuneError, match="invalid JSON"):
        with kiln.autotune(cache=bad):
            pass


def blocklist(tmp_path, *entries):
    path = tmp_path / "blocklist.json"
    path.write_text(json.dumps({"format": "kiln-tactic-blocklist", "version": 1, "blocked": list(entries)}))
    return path


def test_blocklisted_tactics_are_never_timed_or_run(tmp_path, kiln_env):
    """The default for m = 4, n = 64 is small_m_8x32_k8; with every small-M tactic blocked on this
    environment, neither the tuner nor the default path ever runs one."""
    kiln_env.set(
        "KILN_TACTIC_BLOCKLIST",
        blocklist(
            tmp_path,
            {"tactic": "small_m_*", "op": "mm", "gpu": "cpu", "why": "hangs on this stack (test)"},
            {"tactic": "sm90_*", "gpu": "NVIDIA*", "why": "another GPU's problem: not this one"},
        ),
    )
    mod = mm_module()
    a, b = operands(4, 64, 64)
    mod.reset_launch_counts()
    out = kiln.mm_bf16(a, b)  # the default, blocked: the next tactic that can serve the call
    torch.testing.assert_close(
        out.double(), ref.mm_reference_float(a, b, torch.float64), rtol=1.6e-2, atol=1e-2
    )
    timer = FakeTimer()
    with kiln.autotune(timer=timer) as ctx:
        kiln.mm_bf16(a, b)
    ran = mod.launch_counts()
    assert ran and not any(name.startswith("small_m") for name in ran), ran
    assert timer.asked and not any(name.startswith("small_m") for name in timer.asked)
    assert any(name.startswith("sm90") for name in timer.asked)  # blocked on NVIDIA GPUs only
    (entry,) = ctx.tuned.values()
    assert entry.default == "small_m_8x32_k8" and not entry.tactic.startswith("small_m")


def test_every_candidate_blocked_is_an_error(tmp_path, kiln_env):
    kiln_env.set("KILN_TACTIC_BLOCKLIST", blocklist(tmp_path, {"tactic": "*", "why": "everything (test)"}))
    with pytest.raises(ValueError, match="every tactic that can run this problem is blocklisted"):
        kiln.mm_bf16(*operands(4, 64, 64))


def test_the_shipped_blocklist_is_valid_and_a_bad_one_is_an_error(tmp_path, kiln_env):
    assert isinstance(autotuner.read_blocklist(autotuner.SHIPPED_BLOCKLIST), list)
    kiln_env.set("KILN_TACTIC_BLOCKLIST", blocklist(tmp_path, {"tactic": "fallback"}))
    with pytest.raises(autotuner.AutotuneError, match=r"blocked\[0\] must be an object with string fields"):
        kiln.mm_bf16(*operands(4, 64, 64))
    kiln_env.set("KILN_TACTIC_BLOCKLIST", str(tmp_path / "missing.json"))
    with pytest.raises(autotuner.AutotuneError, match="missing.json: no such file"):
        kiln.mm_bf16(*operands(4, 64, 64))


def test_two_tunings_of_one_shape_agree_within_noise():
    """Two tactics within 1 % of each other (0.5 % noise per sample): the default keeps its place
    unless another beats it by more than 2 %, so two tunings choose the same; a tactic that is
    clearly faster wins both times."""
    g = torch.Generator().manual_seed(3)

    def noise():
        return (torch.rand((), generator=g).item() - 0.5) * 0.01

    chosen = []
    for _ in range(2):
        autotuner.clear()
        timer = FakeTimer({"small_m_8x32_k8": 1.0e-4, "small_m_8x32_k4": 0.995e-4}, noise)
        with kiln.autotune(timer=timer) as ctx:
            kiln.mm_bf16(*operands(4, 64, 64))
        chosen.append(next(iter(ctx.tuned.values())).tactic)
    assert chosen == ["small_m_8x32_k8", "small_m_8x32_k8"]
    autotuner.clear()
    with kiln.autotune(timer=FakeTimer({"sm80_128x128x64_s3": 0.5e-4})) as ctx:
        kiln.mm_bf16(*operands(4, 64, 64))
    assert next(iter(ctx.tuned.values())).tactic == "sm80_128x128x64_s3"


def test_the_host_clock_tunes_cpu_calls():
    with kiln.autotune(repeats=3) as ctx:
        kiln.mm_bf16(*operands(3, 40, 32))
    (entry,) = ctx.tuned.values()
    assert entry.timer == "host_clock" and entry.repeats == 3 and entry.median_us > 0
    assert entry.tactic in entry.timings_us and len(entry.timings_us) > 5


def test_every_gemm_op_is_tuned_and_keyed_by_its_own_op(tmp_path):
    from test_gemm import fp8_operands, groupwise_operands

    g = torch.Generator().manual_seed(4)
    with kiln.autotune(timer=FakeTimer()) as ctx:
        A, B, sa, sb = fp8_operands(1, 5, 48, 64, torch.float8_e4m3fn, torch.float8_e4m3fn, "cpu", g)
        kiln.bmm_fp8(A, B, sa, sb, BF16)
        a, b, sa, sb = groupwise_operands(5, 128, 256, "MN", "cpu", g)
        kiln.gemm_fp8_nt_groupwise(a, b, sa, sb)
        x = ref.operand((12, 64), 64, g).to(BF16)
        w = ref.operand((3, 32, 64), 64, g).to(BF16)
        kiln.grouped_mm(x, w.transpose(1, 2), torch.tensor([2, 2, 12], dtype=torch.int32))
        kiln.SegmentGEMMWrapper(torch.empty(1)).run(x, w, 3, True, seg_lens=torch.tensor([2, 0, 10]))
    shapes = sorted((e.op, e.shape.split()[0]) for e in ctx.tuned.values())
    assert shapes == [("fp8", "MN"), ("fp8", "tensor"), ("grouped", "rows16")]  # one grouped entry: same key


def test_nothing_is_written_without_an_explicit_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with kiln.autotune(timer=FakeTimer()) as ctx:
        kiln.mm_bf16(*operands(4, 64, 64))
    assert ctx.tuned and list(tmp_path.iterdir()) == []


def test_kiln_autotune_cache_serves_calls_outside_any_context(tmp_path, kiln_env):
    cache = tmp_path / "env.json"
    kiln_env.set("KILN_AUTOTUNE_CACHE", cache)
    with kiln.autotune(timer=FakeTimer({"sm80_128x128x64_s4": 1e-5})):  # no cache=: the variable's
        kiln.mm_bf16(*operands(4, 64, 64))
    assert cache.exists()
    autotuner.clear()
    mod = mm_module()
    mod.reset_launch_counts()
    kiln.mm_bf16(*operands(4, 64, 64))
    assert mod.launch_counts() == {"sm80_128x128x64_s4": 1}


WRITER = r"""
import sys, torch, kiln
from kiln.trace import gemm as ref
path, n = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(n)
def timer(name, run):
    return 1e-4 if name == "fallback" else 1e-3
for i in range(5):  # five saves each, every process at once: each a shape of its own (n varies)
    with kiln.autotune(cache=path, timer=timer):
        kiln.mm_bf16(ref.operand((4, 64), 64, g).to(torch.bfloat16),
                     ref.operand((8 * (n * 5 + i + 1), 64), 64, g).to(torch.bfloat16).t())
"""


def test_concurrent_writers_never_corrupt_the_cache_or_lose_entries(tmp_path):
    """Four processes, five tunings each (distinct shapes: k varies), all saving to one file: every
    save merges under the file's lock and replaces it atomically, so all 20 entries survive."""
    cache = tmp_path / "shared.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(cache), str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    doc = json.loads(cache.read_text())
    assert len(doc["entries"]) == 20
    assert {e["tactic"] for e in doc["entries"].values()} == {"fallback"}


@pytest.mark.gpu
@pytest.mark.parametrize("timer", ["cuda_events", "globaltimer", "auto"])
def test_real_timers_tune_a_gpu_call(timer):
    a, b = operands(16, 4096, 4096, "cuda")
    with kiln.autotune(timer=timer, repeats=5) as ctx:
        out = kiln.mm_bf16(a, b)
    (entry,) = ctx.tuned.values()
    assert entry.median_us > 0 and entry.tactic in entry.timings_us
    assert entry.env["gpu"] == torch.cuda.get_device_name()
    torch.testing.assert_close(
        out.double(), ref.mm_reference_float(a, b, torch.float64), rtol=1.6e-2, atol=1e-2
    )


@pytest.mark.gpu
def test_cold_l2_tuning_times_one_call_per_sample():
    a, b = operands(256, 1024, 1024, "cuda")
    with kiln.autotune(cold_l2=True, repeats=3) as ctx:
        kiln.mm_bf16(a, b)
    (entry,) = ctx.tuned.values()
    assert entry.cold_l2 and entry.median_us > 0
