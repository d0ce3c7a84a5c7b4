"""Every op target of the build graph has all of its layers (docs/adding-a-kernel.md lists them):
a release decision in its BUILD file, public APIs exported from `kiln` with trace templates naming
the target, a benchmark routine per API, a docs page naming the target and its APIs, and tests
under tests/ops/<family>/ that call each API. Adding a target without one of them fails here."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

import kiln
from benchmarks.routines import ROUTINES
from kiln.codegen.graph import load_graph
from kiln.trace import traced_apis

TARGETS = load_graph().targets
DOCS = {p.name: p.read_text() for p in (REPO / "docs").glob("*.md")}


def _kiln_apis():
    """kiln's own traced APIs (tests register toy templates of their own)."""
    return [t for t in traced_apis().values() if t.function.__module__.startswith("kiln.")]


def _apis(label: str):
    return [t for t in _kiln_apis() if t.template.target == label]


def _public_name(traced) -> str:
    """The name users call: rmsnorm, BatchDecodeWithPagedKVCacheWrapper (its run is traced)."""
    return traced.function.__qualname__.split(".")[0]


def test_every_trace_template_names_a_target_of_the_graph():
    labels = {t.label for t in TARGETS}
    wrong = {t.template.name: t.template.target for t in _kiln_apis() if t.template.target not in labels}
    assert wrong == {}, f"templates whose target= is not a label of the graph ({sorted(labels)})"


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.label)
def test_the_target_declares_what_ships_precompiled(target):
    assert target.release is not None, (
        f"{target.build_file}: {target.label} needs release=\"all\", a selection, or "
        "no_release(\"why\")")


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.label)
def test_the_target_has_every_layer(target):
    apis = _apis(target.label)
    assert apis, (f"{target.label}: no public API names it (a trace template with "
                  f"target={target.label!r} attached to an API exported from kiln)")
    missing = []
    for traced in apis:
        name = _public_name(traced)
        if name not in kiln.__all__:
            missing.append(f"{name} is not exported from kiln (python/kiln/__init__.py)")
        if traced.template.name not in ROUTINES:
            missing.append(f"{name}: no benchmark routine named {traced.template.name!r} "
                           "(benchmarks/routines/)")
        if not any(re.search(rf"\b{name}\b", text) for text in DOCS.values()):
            missing.append(f"{name} is not documented in docs/*.md")
        tests = REPO / "tests" / "ops" / target.family
        if not any(re.search(rf"\b{name}\b", p.read_text()) for p in tests.glob("test_*.py")):
            missing.append(f"{name}: no test under tests/ops/{target.family}/ calls it")
    if not any(target.label in text or target.full_label in text for text in DOCS.values()):
        missing.append(f"no docs/*.md page names {target.label}")
    assert missing == []
