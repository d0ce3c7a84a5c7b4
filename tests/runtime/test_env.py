"""The environment-knob registry: strict booleans, typed values, and docs that list every knob."""

import re
from pathlib import Path

import pytest

from kiln.runtime import env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("on", True),
                                       ("0", False), ("False", False), ("off", False), ("", False)])
def test_booleans(monkeypatch, raw, value):
    monkeypatch.setenv("KILN_DISABLE_JIT", raw)
    assert env.get("KILN_DISABLE_JIT") is value


@pytest.mark.parametrize("raw", ["2", "y", "enabled", "truee"])
def test_anything_else_is_an_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("KILN_NO_CACHE", raw)
    with pytest.raises(env.EnvError, match=f"KILN_NO_CACHE={raw!r} is not a boolean"):
        env.get("KILN_NO_CACHE")


def test_integers(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "3")
    assert env.get("MAX_JOBS") == 3
    monkeypatch.setenv("MAX_JOBS", "three")
    with pytest.raises(env.EnvError, match="MAX_JOBS='three' is not an integer"):
        env.get("MAX_JOBS")
    monkeypatch.setenv("MAX_JOBS", "-1")
    with pytest.raises(env.EnvError, match=">= 0"):
        env.get("MAX_JOBS")


def test_defaults_and_paths(monkeypatch):
    monkeypatch.delenv("KILN_WORKSPACE_BASE", raising=False)
    assert env.get("KILN_WORKSPACE_BASE").endswith(".cache/kiln")
    monkeypatch.setenv("KILN_WORKSPACE_BASE", "~/x")
    assert not env.get("KILN_WORKSPACE_BASE").startswith("~")


def test_build_affecting_knobs_are_in_the_key_set(monkeypatch):
    monkeypatch.setenv("KILN_JIT_DEBUG", "1")
    assert env.build_affecting()["KILN_JIT_DEBUG"] is True
    assert "KILN_JIT_VERBOSE" not in env.build_affecting()  # verbosity never changes a build


def test_docs_list_every_knob_with_its_default():
    doc = (REPO / "docs" / "env.md").read_text()
    for knob in env.KNOBS.values():
        row = re.search(rf"^\| `{knob.name}` \|([^|]*)\|", doc, re.M)
        assert row, f"docs/env.md has no row for {knob.name}"
        assert row.group(1).strip(), f"docs/env.md gives no default for {knob.name}"
