"""API logging (KILN_LOGLEVEL, KILN_LOGDEST): the zero-cost default, coverage of the public API,
what each level writes and when, destinations, filters, bad settings, and CUDA-graph capture."""

from __future__ import annotations

import inspect
import os
import re
import timeit
import types

import pytest
import torch
from helpers import run_python

import kiln
from kiln import api_logging
from kiln.api_logging import is_logged, logged_api
from kiln.diagnostics.settings import Settings
from kiln.runtime.env import EnvError


def text(path) -> str:
    return path.read_text() if path.exists() else ""


def toy(x, scale=2.0):
    return x * scale


# --- level 0: nothing per call -------------------------------------------------------------------

def test_level_0_returns_the_function_itself(decorate):
    assert decorate(toy, "tests.toy") is toy
    assert is_logged(toy) and api_logging.registered()["tests.toy"].fn is toy
    # kiln itself was imported with diagnostics off: its APIs are the functions in norm.py.
    for fn in (kiln.rmsnorm, kiln.fused_add_rmsnorm, kiln.gemma_rmsnorm, kiln.gemma_fused_add_rmsnorm):
        assert not hasattr(fn, "__wrapped__") and fn.__code__.co_filename.endswith("norm.py")


def _per_call(fn) -> float:
    """Seconds per call of fn(1.0): the best of several batches, so load spikes cannot inflate it."""
    return min(timeit.repeat(lambda: fn(1.0), number=20_000, repeat=7)) / 20_000


def test_level_0_has_no_measurable_overhead_and_the_benchmark_would_see_one(decorate, tmp_path):
    def undecorated(x):
        return x

    def to_decorate(x):
        return x

    off = decorate(to_decorate, "tests.bench_off")
    on = decorate(lambda x: x, "tests.bench_on", KILN_LOGLEVEL=1, KILN_LOGDEST=os.devnull)
    base, level0, level1 = _per_call(undecorated), _per_call(off), _per_call(on)
    # Same code object, so the only difference is noise; the bound is far above it.
    assert off is to_decorate and level0 < 1.5 * base, (base, level0)
    # The same measurement does see a wrapper (level 1 formats and writes a record per call).
    assert level1 > 3 * base, (base, level1)


# --- coverage of the public API ------------------------------------------------------------------

def test_every_public_api_is_logged():
    public = api_logging.public_api(kiln)
    assert {"rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"} <= set(public)
    assert api_logging.uncovered(kiln) == []
    # The custom ops a compiled graph calls at run time are logged too.
    assert {"kiln::rmsnorm", "kiln::fused_add_rmsnorm"} <= set(api_logging.registered())


def test_the_coverage_check_finds_undecorated_functions_and_wrapper_runs():
    class Wrapper:
        def plan(self):  # only the executing method must be logged
            pass

        @logged_api("tests.Wrapper.run")
        def run(self):
            pass

    class ForgottenWrapper:
        def run(self):
            pass

    def forgotten():
        pass

    mod = types.ModuleType("fake_kiln")
    mod.__all__ = ["logged", "forgotten", "Wrapper", "ForgottenWrapper", "CONSTANT", "sub"]
    mod.logged, mod.forgotten, mod.Wrapper, mod.ForgottenWrapper = toy, forgotten, Wrapper, ForgottenWrapper
    mod.CONSTANT, mod.sub = 3, types.ModuleType("sub")
    logged_api("tests.toy")(toy)
    assert set(api_logging.public_api(mod)) == {"logged", "forgotten", "Wrapper.run", "ForgottenWrapper.run"}
    assert api_logging.uncovered(mod) == ["ForgottenWrapper.run", "forgotten"]


def test_names_come_from_the_qualname_or_are_given():
    def run(self):
        pass

    run.__module__, run.__qualname__ = "kiln.fake", "FakeWrapper.run"
    logged_api(run)
    assert api_logging.registered()["kiln.FakeWrapper.run"].fn is run

    @logged_api
    def helper():
        pass

    assert f"{__name__}.{helper.__qualname__}" in api_logging.registered()


def test_two_functions_cannot_share_an_api_name():
    def other(x):
        return x

    logged_api("tests.toy")(toy)
    with pytest.raises(ValueError, match=r"'tests.toy' already names .*toy; give .*other a name of its own"):
        logged_api("tests.toy")(other)


# --- what each level writes, and when ------------------------------------------------------------

def test_level_1_writes_the_call_name_before_the_call_runs(decorate, api_log):
    seen_during_call = []

    def probe(x):
        seen_during_call.append(text(api_log))
        return x

    fn = decorate(probe, "tests.probe", KILN_LOGLEVEL=1)
    assert fn(torch.ones(3)).sum() == 3
    assert re.search(r"^\[kiln \S+ \S+ pid \d+\] #\d+ tests\.probe$", seen_during_call[0], re.M)
    assert text(api_log) == seen_during_call[0]  # level 1: nothing about arguments or outputs


def test_level_3_logs_arguments_the_module_then_the_outputs(decorate, api_log):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_LOGLEVEL=3)
    base = torch.randn(4, 16)
    x, w = base[:, :8], torch.randn(8)  # strided rows
    rmsnorm(x, w, eps=1e-5)
    log = text(api_log)
    assert "input  = Tensor(shape=[4, 8], dtype=float32, device=cpu, strides=[16, 1], non-contiguous" in log
    assert "weight = Tensor(shape=[8], dtype=float32, device=cpu, strides=[1], contiguous" in log
    assert "eps    = 1e-05" in log
    assert re.search(r"using module norm_dtype_f32_host \(//ops:norm, host backend, spec key [0-9a-f]{16}\)",
                     log)
    assert "stats:" not in log  # statistics only at level 5
    lines = log.splitlines()
    module = next(i for i, ln in enumerate(lines) if "using module" in ln)
    done = next(i for i, ln in enumerate(lines) if "returned after" in ln)
    assert module < done and "result = Tensor(shape=[4, 8]" in lines[done + 1]


def test_level_3_reports_mutated_arguments_as_outputs(decorate, api_log):
    fused = decorate(kiln.norm.fused_add_rmsnorm, "kiln.fused_add_rmsnorm",
                     mutates=("input", "residual"), KILN_LOGLEVEL=3)
    x, r, w = torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
    fused(x, r, w)
    after = text(api_log).split("returned after")[1]
    assert "input    = Tensor(shape=[2, 8]" in after and "residual = Tensor(shape=[2, 8]" in after
    assert "result" not in after  # it returns None


def test_level_5_adds_statistics_of_inputs_and_outputs(decorate, api_log):
    fn = decorate(toy, "tests.toy", KILN_LOGLEVEL=5)
    fn(torch.tensor([1.0, 2.0, float("nan"), float("inf"), -3.0]), scale=2.0)
    log = text(api_log)
    assert "stats: min=-3 max=2 mean=0 nan=1 inf=1" in log  # of the finite values
    assert "stats: min=-6 max=4 mean=0 nan=1 inf=1" in log  # the result
    assert "scale = 2.0" in log


def test_level_5_statistics_of_fp8_tensors(decorate, api_log):
    # torch has no isnan/isinf for the fp8 dtypes: the statistics widen them first (this crashed).
    def passthrough(x):
        return x

    fn = decorate(passthrough, "tests.passthrough", KILN_LOGLEVEL=5)
    fn(torch.tensor([1.0, -448.0, float("nan"), 2.0]).to(torch.float8_e4m3fn))
    assert "stats: min=-448 max=2 mean=-148.333 nan=1 inf=0" in text(api_log)


def test_level_5_skips_statistics_and_dumps_while_a_cuda_graph_is_captured(decorate, api_log,
                                                                          monkeypatch, tmp_path):
    fn = decorate(toy, "tests.toy", KILN_LOGLEVEL=5, KILN_DUMP=1, KILN_DUMP_DIR=tmp_path / "dumps")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fn(torch.ones(4))
    log = text(api_log)
    assert log.count("stats: skipped: a CUDA graph is being captured") == 2  # input and result
    assert "min=" not in log
    assert "not dumped: a CUDA graph is being captured" in log
    assert not (tmp_path / "dumps").exists()


def test_exceptions_are_logged_and_propagate(decorate, api_log):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_LOGLEVEL=1)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(torch.randn(2, 8), torch.randn(7))
    assert re.search(r"#\d+ kiln\.rmsnorm raised ValueError: .*weight", text(api_log))


# --- destinations ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dest", ["stdout", "stderr", "file with %p"])
def test_destinations(decorate, capsys, tmp_path, dest):
    path = tmp_path / "kiln-%p.log"
    fn = decorate(toy, "tests.toy", KILN_LOGLEVEL=1,
                  KILN_LOGDEST=str(path) if dest.startswith("file") else dest)
    fn(torch.ones(1))
    out, err = capsys.readouterr()
    where = {"stdout": out, "stderr": err}.get(dest) or text(tmp_path / f"kiln-{os.getpid()}.log")
    assert re.search(r"#\d+ tests\.toy$", where, re.M)
    assert "tests.toy" not in ({"stdout": err, "stderr": out}.get(dest, out + err))


def test_an_unusable_destination_is_an_error_naming_it(decorate, tmp_path):
    fn = decorate(toy, "tests.toy", KILN_LOGLEVEL=1, KILN_LOGDEST=tmp_path / "missing" / "api.log")
    with pytest.raises(EnvError, match=r"KILN_LOGDEST=.*missing/api.log.*cannot open"):
        fn(torch.ones(1))


# --- filters ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("include,exclude,expected", [
    ("", "", {"kiln.rmsnorm", "kiln.fused_add_rmsnorm", "kiln::rmsnorm"}),
    ("kiln.rmsnorm", "", {"kiln.rmsnorm"}),
    ("rmsnorm", "", {"kiln.rmsnorm"}),  # without the "kiln." prefix
    ("*rmsnorm", "", {"kiln.rmsnorm", "kiln.fused_add_rmsnorm", "kiln::rmsnorm"}),
    ("*rmsnorm", "*fused*", {"kiln.rmsnorm", "kiln::rmsnorm"}),  # exclude wins
    ("", "kiln::*, kiln.fused*", {"kiln.rmsnorm"}),
])
def test_filter_patterns(include, exclude, expected):
    s = Settings(include=tuple(p.strip() for p in include.split(",") if p.strip()),
                 exclude=tuple(p.strip() for p in exclude.split(",") if p.strip()))
    names = ("kiln.rmsnorm", "kiln.fused_add_rmsnorm", "kiln::rmsnorm")
    assert {a for a in names if s.selected(a)} == expected


def test_filters_gate_level_3_details_but_not_call_names(decorate, api_log):
    def alpha(x):
        return x

    def beta(x):
        return x

    a = decorate(alpha, "tests.alpha", KILN_LOGLEVEL=3, KILN_DUMP_INCLUDE="*alpha")
    b = decorate(beta, "tests.beta", KILN_LOGLEVEL=3, KILN_DUMP_INCLUDE="*alpha")
    a(torch.ones(2))
    b(torch.ones(3))
    log = text(api_log)
    assert "tests.alpha" in log and "x = Tensor(shape=[2]" in log
    assert re.search(r"#\d+ tests\.beta$", log, re.M) and "shape=[3]" not in log


# --- settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("env,match", [
    ({"KILN_LOGLEVEL": "7"}, r"KILN_LOGLEVEL=7 is not a level; use 0 \(off\), 1 \(call names\)"),
    ({"KILN_LOGLEVEL": "debug"}, r"KILN_LOGLEVEL='debug' is not an integer"),
    ({"KILN_DUMP": "1"}, r"KILN_DUMP=1 needs KILN_DUMP_DIR"),
    ({"KILN_FORCE_BACKEND": "gpu"}, r"KILN_FORCE_BACKEND='gpu' is not a backend; use 'host' or 'cuda'"),
])
def test_bad_settings_are_errors_naming_the_variable(decorate, env, match):
    with pytest.raises(EnvError, match=match):
        decorate(toy, "tests.toy", **env)


def test_the_decorated_signature_is_the_original():
    assert inspect.signature(logged_api("tests.toy")(toy)) == inspect.signature(toy)


# --- independence from the JIT's logger -----------------------------------------------------

CALL = "import torch, kiln; kiln.rmsnorm(torch.randn(2, 8), torch.randn(8))"


def test_api_logging_and_jit_logging_are_independent():
    kiln.rmsnorm(torch.randn(2, 8), torch.randn(8))  # built in the session workspace: both runs load it
    api_only = run_python(CALL, env={"KILN_LOGLEVEL": "1", "KILN_JIT_LOGLEVEL": "ERROR"})
    assert re.search(r"#1 kiln\.rmsnorm$", api_only.stderr, re.M)
    assert "kiln: loaded" not in api_only.stderr
    jit_only = run_python(CALL, env={"KILN_LOGLEVEL": "0", "KILN_JIT_LOGLEVEL": "DEBUG"})
    assert "kiln: loaded norm_dtype_f32_host" in jit_only.stderr  # the cache hit, logged at DEBUG
    assert "kiln.rmsnorm" not in jit_only.stderr


@pytest.mark.gpu
def test_level_5_during_a_real_cuda_graph_capture(decorate, api_log):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_LOGLEVEL=5)
    x, w = torch.randn(4, 256, device="cuda"), torch.randn(256, device="cuda")
    out = torch.empty_like(x)
    rmsnorm(x, w, out=out)  # loads the module before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm(x, w, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, kiln.rmsnorm(x, w), rtol=0, atol=0)
    log = api_log.read_text()
    assert "stats: skipped: a CUDA graph is being captured" in log
    assert "device=cuda:0" in log and "min=" in log  # the eager call before it has statistics
