"""The benchmark harness on the CPU: statistics, timers, the reference check that keeps failing
backends out of the tables, the records, JSON lines, the table, repro lines, --shapes."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest
import torch

import kiln
from benchmarks import cli, harness, results, selection, table, timing
from benchmarks.routine import Backend, Routine
from benchmarks.routines import ROUTINES

FAST = timing.Settings(measurements=3, target_s=2e-4, warmup_s=0.0)
CPU = torch.device("cpu")


def test_summarize_reports_median_mean_std_min_max_in_us():
    s = timing.summarize([1e-6, 2e-6, 3e-6, 10e-6])
    assert s == pytest.approx({"median_us": 2.5, "mean_us": 4.0, "std_us": 3.5355339, "min_us": 1.0,
                               "max_us": 10.0})
    with pytest.raises(ValueError, match="no measurements"):
        timing.summarize([])


def test_cupti_busy_time_counts_overlapping_kernels_once():
    assert timing._busy_ns([(20, 25), (0, 10), (5, 15)]) == 20
    assert timing._busy_ns([]) == 0


def test_rotation_continues_across_batches():
    seen = []
    rot = timing.Rotation([lambda i=i: seen.append(i) for i in range(3)])
    rot.batch(2)
    rot.batch(2)
    assert seen == [0, 1, 2, 0]


def test_calls_per_measurement_follow_the_target_and_stay_bounded():
    assert timing.calls_for(2e-3, 1e-5, 10_000) == 200
    assert timing.calls_for(2e-3, 1.0, 10_000) == 1
    assert timing.calls_for(2e-3, 0.0, 50) == 50


def test_host_timer_measures_wall_clock_per_call():
    m = timing.measure([lambda: time.sleep(2e-3)], CPU, FAST)
    assert m.mechanism == "host_wall_clock" and not m.cuda_graph
    assert len(m.per_call_s) == 3 and m.calls_per_measurement == 1
    assert all(2e-3 <= t < 50e-3 for t in m.per_call_s)


def test_cuda_only_timing_modes_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match="--cuda-graph needs a CUDA device"):
        timing.measure([lambda: None], CPU, timing.Settings(cuda_graph=True))
    with pytest.raises(ValueError, match="timer cupti needs a CUDA device"):
        timing.measure([lambda: None], CPU, timing.Settings(timer="cupti"))


def test_rotating_sets_exceed_the_cache_within_the_cap():
    assert harness.rotating_sets(1 << 20, 32 << 20, 4096) == 96
    assert harness.rotating_sets(1 << 30, 32 << 20, 4096) == 1
    assert harness.rotating_sets(1, 32 << 20, 16) == 16


# A routine over kiln.rmsnorm's template with one correct and several broken backends.
def _good(inp, ctx):
    x, w, eps = inp["input"], inp["weight"], inp["eps"]
    return lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=eps)


def _wrong(inp, ctx):
    x = inp["input"]
    return lambda: x * 2


def _raises(inp, ctx):
    def run():
        raise RuntimeError("boom")

    return run


def _unwritten(inp, ctx):
    out = torch.full_like(inp["input"], float("nan"))
    return lambda: out


TOY = Routine(api=kiln.rmsnorm, backends=(
    Backend("good", _good), Backend("wrong", _wrong), Backend("raises", _raises),
    Backend("unwritten", _unwritten), Backend("absent", _good, available=lambda d, t: "not installed")))


def _run(routine, shapes, backends=None, **kw):
    emitted = []
    opts = harness.Options(CPU, "float32", backends, FAST, measure_ceilings=False, **kw)
    runner = harness.Runner(opts, emitted.append)
    recs = [rec for case in selection.select(routine, [], shapes) for rec in runner.run_case(case)]
    assert recs == emitted
    return recs


def test_failing_backends_are_reported_and_never_timed():
    recs = {r["backend"]: r for r in _run(TOY, ["tokens=5,hidden=64"])}
    assert recs["good"]["status"] == "ok" and recs["good"]["median_us"] > 0
    assert recs["wrong"]["status"] == "failed"
    assert "elements outside rtol=2e-05, atol=2e-05" in recs["wrong"]["error"]
    assert "raised RuntimeError: boom" in recs["raises"]["error"]
    assert "NaN/Inf where the reference is finite" in recs["unwritten"]["error"]
    assert recs["absent"] == {**recs["absent"], "status": "unavailable", "error": "not installed"}
    for name in ("wrong", "raises", "unwritten", "absent"):
        assert not any(k in recs[name] for k in results.STATS), f"{name} must not be timed"
    text = table.render(list(recs.values()))
    assert "FAILED: reference check" in text and "UNAVAILABLE: not installed" in text
    for line in text.splitlines():
        if "FAILED" in line or "UNAVAILABLE" in line:
            assert " - " in line and "host_wall_clock" not in line


def test_in_place_backends_are_each_checked_on_pristine_inputs():
    """Regression: the timed input sets of an in-place API are mutated; the next backend's
    reference check must still see the inputs the reference was computed from."""
    recs = _run(ROUTINES["fused_add_rmsnorm"], ["tokens=3,hidden=256"], ("kiln", "torch"))
    assert [r["status"] for r in recs] == ["ok", "ok"]


REQUIRED = {  # what every timed result records
    "routine", "backend", "axes", "dtype", "device", "software", "timing", "median_us", "mean_us",
    "std_us", "min_us", "max_us", "bytes_per_call", "gbps", "repro", "check"}


def test_cli_run_writes_records_table_and_repro_lines(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = cli.main(["run", "rmsnorm", "--device", "cpu", "--backends", "kiln,torch", "--shapes",
                   "llama-3.1-8b-decode:tokens=2", "--repeats", "3", "--target-ms", "0.2",
                   "--output", str(out), "--repro"])
    assert rc == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["backend"] for r in recs] == ["kiln", "torch"]
    for r in recs:
        assert REQUIRED <= set(r), f"missing {REQUIRED - set(r)}"
        assert r["axes"] == {"tokens": 2, "hidden": 4096} and r["scalars"] == {"eps": 1e-5}
        assert r["definition"] == "rmsnorm/llama-3.1-8b-decode" and r["dtype"] == "bfloat16"
        assert r["device"]["type"] == "cpu" and r["device"]["arch"]
        assert r["software"]["kiln_version"] == kiln.__version__ and r["software"]["git_commit"]
        assert r["timing"]["mechanism"] == "host_wall_clock" and r["timing"]["measurements"] == 3
        assert r["check"]["status"] == "passed"
        assert r["min_us"] <= r["median_us"] <= r["max_us"]
        assert r["bytes_per_call"] == (2 * 2 * 4096 + 4096) * 2
        assert r["gbps"] == pytest.approx(r["bytes_per_call"] / r["median_us"] / 1e3)
        assert r["tflops"] == pytest.approx(4 * 2 * 4096 / r["median_us"] / 1e6)
        assert r["fraction_of_copy_bandwidth"] > 0 and r["ceilings"]["copy_gbps"] > 0
    printed = capsys.readouterr().out
    assert "host_wall_clock" in printed and recs[0]["repro"] in printed
    assert printed.splitlines()[0].startswith(recs[0]["device"]["name"])

    # The repro line runs the same workload again.
    again = tmp_path / "again.jsonl"
    args = shlex.split(recs[0]["repro"])[3:]
    assert cli.main(args + ["--repeats", "2", "--output", str(again), "--no-ceilings"]) == 0
    (rec,) = [json.loads(line) for line in again.read_text().splitlines()]
    for key in ("routine", "definition", "backend", "axes", "scalars", "dtype", "repro"):
        assert rec[key] == recs[0][key]


def test_cli_exit_status_and_errors(capsys):
    assert cli.main(["run", "rmsnorm", "--device", "cpu", "--backends", "nope"]) == 2
    assert "routine rmsnorm has no backend 'nope'" in capsys.readouterr().err
    assert cli.main(["run", "nosuch"]) == 2
    assert "no routine named 'nosuch'" in capsys.readouterr().err
    assert cli.main(["run", "rmsnorm,nosuch", "--device", "cpu"]) == 2  # before measuring anything
    assert "no routine named 'nosuch'" in capsys.readouterr().err


def test_cli_run_takes_a_list_of_routines_in_order(tmp_path):
    out = tmp_path / "r.jsonl"
    assert cli.main(["run", "merge_state, rmsnorm", "--device", "cpu", "--backends", "kiln", "--shapes",
                     "small", "--repeats", "1", "--target-ms", "0.1", "--no-ceilings",
                     "--output", str(out)]) == 0
    routines = [json.loads(line)["routine"] for line in out.read_text().splitlines()]
    assert routines[0] == "merge_state" and routines[-1] == "rmsnorm"
    assert set(routines) == {"merge_state", "rmsnorm"}


def test_shapes_presets_examples_and_ad_hoc():
    r = ROUTINES["rmsnorm"]
    defs = cli.defs_mod.load("rmsnorm")
    every = selection.select(r, defs, [])
    assert len(every) == sum(len(d.workloads) for d in defs)
    small = selection.select(r, defs, ["small"])
    # decode and prefill of one model share their small workloads: each runs once
    assert len(small) == len({d.model for d in defs}) * len(r.template.small)
    one = selection.select(r, defs, ["llama-3.1-70b-prefill:tokens=8192"])
    assert [(c.axes, c.scalars, c.selector) for c in one] == [
        ({"tokens": 8192, "hidden": 8192}, {"eps": 1e-5}, "llama-3.1-70b-prefill:tokens=8192")]
    model = selection.select(r, defs, ["qwen3-32b"])
    assert {c.definition.name for c in model} == {"rmsnorm/qwen3-32b-decode", "rmsnorm/qwen3-32b-prefill"}
    (ad_hoc,) = selection.select(r, defs, ["tokens=16384,hidden=8192"])
    assert ad_hoc.definition is None and ad_hoc.scalars == {"eps": 1e-6}
    with pytest.raises(ValueError, match="has no example or model 'llama'"):
        selection.select(r, defs, ["llama"])
    with pytest.raises(ValueError, match="is not axis=integer"):
        selection.select(r, defs, ["tokens=x"])


class FakeCupti:
    """Stands in for cupti.cupti: a clock, buffer callbacks, and kernel records that `launch`
    places inside the current measurement window."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME = 10, 1, 2, 5

    class Record:
        def __init__(self, kind, start, end):
            self.kind, self.start, self.end = kind, start, end

    def __init__(self):
        self.clock, self.pending, self.log = 0, [], []

    def activity_register_callbacks(self, requested, completed):
        assert requested() == (8 * 1024 * 1024, 0)
        self.completed = completed

    def activity_enable(self, kind):
        self.log.append(("enable", kind))

    def activity_disable(self, kind):
        self.log.append(("disable", kind))

    def get_timestamp(self):
        self.clock += 1000
        return self.clock

    def launch(self, offset, length, kind=10):
        self.pending.append(self.Record(kind, self.clock + offset, self.clock + offset + length))

    def activity_flush_all(self, flag):
        self.completed(self.pending)

    def finalize(self):
        self.log.append("finalize")


def test_cupti_samples_are_busy_time_per_call_within_each_window(monkeypatch):
    import types

    fake = FakeCupti()
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=fake))

    def step():  # two calls: kernels of 100 and 50 ns overlapping by 20, a 30 ns memcpy, and an
        fake.launch(10, 100)  # API record that is not GPU work
        fake.launch(90, 50)
        fake.launch(400, 30, kind=1)
        fake.launch(500, 999, kind=5)

    samples = timing._cupti_samples(step, 2, 3, lambda: None)
    assert samples == pytest.approx([(130 + 30) * 1e-9 / 2] * 3)
    assert fake.log[-1] == "finalize" and sum(1 for e in fake.log if e[0] == "disable") == 3

    fake2 = FakeCupti()
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=fake2))
    with pytest.raises(timing.CuptiUnusable, match="1 activity records in a measurement of 2 calls"):
        timing._cupti_samples(lambda: fake2.launch(10, 5), 2, 1, lambda: None)
    assert fake2.log[-1] == "finalize"


def test_a_case_whose_inputs_cannot_be_made_fails_and_the_run_goes_on(monkeypatch):
    def broken(*a, **k):
        raise MemoryError("no room for the inputs")

    r = ROUTINES["rmsnorm"]
    monkeypatch.setattr(type(r.template), "build_inputs", broken)
    recs = _run(r, ["tokens=1,hidden=8"], ("kiln", "torch"))
    assert [x["status"] for x in recs] == ["failed", "failed"]
    assert "making the inputs or the reference raised MemoryError: no room" in recs[0]["error"]
    assert "failed" in table.render(recs).lower()


def test_kiln_fa3_backends_name_their_own_requirement():
    """kiln's sm90a prefill backends report kiln's reason off 9.0 devices (not a peer's: a later
    definition with the same function name once shadowed it)."""
    from benchmarks.routines import ROUTINES

    for name in ("single_prefill", "batch_prefill", "batch_prefill_ragged"):
        fa3 = [b for b in ROUTINES[name].backends if b.name == "kiln_fa3"]
        assert len(fa3) == 1, name
        assert fa3[0].available(torch.device("cpu"), "bfloat16") == (
            "the fa3 kernel needs a compute capability 9.0 GPU"
        )
