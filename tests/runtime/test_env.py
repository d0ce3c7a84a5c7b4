"""The environment table: strict booleans, typed and checked values, parsed once for every variable
(a malformed value is an error on every path), reload(), warnings for unknown KILN_* names, and
docs that list every knob."""

import re
import warnings
from pathlib import Path

import pytest
from helpers import make_toy_sources, run_python

from kiln.runtime import env
from kiln.runtime.arch import ArchError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("on", True),
                                       ("0", False), ("False", False), ("off", False), ("", False)])
def test_booleans(kiln_env, raw, value):
    kiln_env.set("KILN_DISABLE_JIT", raw)
    assert env.get("KILN_DISABLE_JIT") is value


@pytest.mark.parametrize("raw", ["2", "y", "enabled", "truee"])
def test_anything_else_is_an_error_naming_the_variable(kiln_env, raw):
    kiln_env.set("KILN_NO_CACHE", raw)
    with pytest.raises(env.EnvError, match=f"KILN_NO_CACHE={raw!r} is not a boolean"):
        env.get("KILN_NO_CACHE")


def test_integers(kiln_env):
    kiln_env.set("MAX_JOBS", "3")
    assert env.get("MAX_JOBS") == 3
    kiln_env.set("MAX_JOBS", "three")
    with pytest.raises(env.EnvError, match="MAX_JOBS='three' is not an integer"):
        env.get("MAX_JOBS")
    kiln_env.set("MAX_JOBS", "-1")
    with pytest.raises(env.EnvError, match=">= 0"):
        env.get("MAX_JOBS")
    kiln_env.set(MAX_JOBS="2", KILN_DOWNLOAD_DEADLINE="0")
    with pytest.raises(env.EnvError, match="KILN_DOWNLOAD_DEADLINE='0' must be >= 1"):
        env.get("MAX_JOBS")


def test_values_with_a_fixed_set_are_checked_and_normalised(kiln_env):
    kiln_env.set("KILN_JIT_LOGLEVEL", "debug")
    assert env.get("KILN_JIT_LOGLEVEL") == "DEBUG"
    kiln_env.set("KILN_JIT_LOGLEVEL", "loud")
    with pytest.raises(env.EnvError, match="KILN_JIT_LOGLEVEL='loud' is not a level; use 'DEBUG'"):
        env.get("KILN_WORKSPACE_BASE")
    kiln_env.unset("KILN_JIT_LOGLEVEL")
    kiln_env.set("KILN_FORCE_BACKEND", "HOST")
    assert env.get("KILN_FORCE_BACKEND") == "host"


def test_an_arch_list_that_does_not_parse_is_refused_on_every_path(kiln_env):
    kiln_env.set("KILN_CUDA_ARCH_LIST", "9.0 banana")
    for name in ("KILN_CUDA_ARCH_LIST", "KILN_WORKSPACE_BASE"):  # a host-only read too
        with pytest.raises(ArchError, match="KILN_CUDA_ARCH_LIST='9.0 banana': cannot parse CUDA "
                                            "arch 'banana'"):
            env.get(name)
    with pytest.raises(env.EnvError):
        env.get("KILN_WORKSPACE_BASE")


def test_defaults_and_paths(kiln_env):
    kiln_env.unset("KILN_WORKSPACE_BASE")
    assert env.get("KILN_WORKSPACE_BASE").endswith(".cache/kiln")
    kiln_env.set("KILN_WORKSPACE_BASE", "~/x")
    assert not env.get("KILN_WORKSPACE_BASE").startswith("~")


def test_build_affecting_knobs_are_in_the_key_set(kiln_env):
    kiln_env.set("KILN_JIT_DEBUG", "1")
    assert env.build_affecting()["KILN_JIT_DEBUG"] is True
    assert env.build_affecting()["KILN_JIT_ASAN"] is False
    assert "KILN_JIT_VERBOSE" not in env.build_affecting()  # verbosity never changes a build


def test_one_malformed_variable_fails_every_read_naming_all_of_them(kiln_env):
    kiln_env.set(KILN_DISABLE_JIT="maybe", MAX_JOBS="lots")
    with pytest.raises(env.EnvError) as e:
        env.get("KILN_WORKSPACE_BASE")  # a read that does not ask for either
    assert "KILN_DISABLE_JIT='maybe' is not a boolean" in str(e.value)
    assert "MAX_JOBS='lots' is not an integer" in str(e.value)
    snap = env.snapshot()  # reports still see every variable, valid or not
    assert snap.value("KILN_JIT_DEBUG") is False and set(snap.errors) == {"KILN_DISABLE_JIT",
                                                                           "MAX_JOBS"}


def test_the_environment_is_read_once_until_reload(monkeypatch):
    monkeypatch.setenv("KILN_NVCC_THREADS", "2")
    env.reload()
    assert env.get("KILN_NVCC_THREADS") == 2
    monkeypatch.setenv("KILN_NVCC_THREADS", "3")
    assert env.get("KILN_NVCC_THREADS") == 2  # parsed once
    env.reload()
    assert env.get("KILN_NVCC_THREADS") == 3


def test_malformed_disable_jit_is_refused_on_a_warm_cache_too(tmp_path):
    """KILN_DISABLE_JIT=maybe was refused on a cold cache (where the JIT reads it) and accepted on
    a warm one (where nothing does)."""
    toy = make_toy_sources(tmp_path / "src")
    ws = {"KILN_WORKSPACE_BASE": str(tmp_path / "ws")}
    load = ("from helpers import toy_spec; from kiln.runtime import jit; from pathlib import Path\n"
            f"print(jit.load(toy_spec(Path({str(toy)!r}))).answer())")
    assert run_python(load, env=ws).stdout.split() == ["42"]  # warm now
    proc = run_python(load, env={**ws, "KILN_DISABLE_JIT": "maybe"}, check=False)
    assert proc.returncode != 0
    assert "EnvError: KILN_DISABLE_JIT='maybe' is not a boolean" in proc.stderr


def test_an_unknown_kiln_variable_is_warned_about_once(kiln_env):
    kiln_env.set("KILN_DISABLE_JTI", "1")
    with pytest.warns(env.EnvWarning, match="KILN_DISABLE_JTI is set but is not a kiln variable.*"
                                            "did you mean KILN_DISABLE_JIT"):
        env.get("KILN_DISABLE_JIT")
    env.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.get("KILN_DISABLE_JIT")  # once per process
    kiln_env.set("KILN_TEST_ANYTHING", "1")  # test-only variables are not warned about
    kiln_env.set("KILN_TORCH_SPEC", "torch")  # nor the scripts' own
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.get("KILN_DISABLE_JIT")


def test_nothing_is_read_at_import_time():
    proc = run_python("import os; os.environ['KILN_NO_CACHE'] = 'maybe'\n"
                      "import kiln.runtime.env, kiln.runtime.jit, kiln.codegen.cli\n"
                      "os.environ['KILN_NO_CACHE'] = '1'\n"
                      "from kiln.runtime import env; print(env.get('KILN_NO_CACHE'))")
    assert proc.stdout.split() == ["True"]


def test_docs_list_every_knob_with_its_default():
    doc = (REPO / "docs" / "env.md").read_text()
    for name in [*env.KNOBS, *env.SCRIPT_VARIABLES]:
        row = re.search(rf"^\| `{name}` \|([^|]*)\|", doc, re.M)
        assert row, f"docs/env.md has no row for {name}"
        assert row.group(1).strip(), f"docs/env.md gives no default for {name}"
