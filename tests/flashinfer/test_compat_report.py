"""scripts/flashinfer_compat.py: a junit run summarised per module, skips that are not declared
non-claims kept apart, and README's table equal to the one the committed summaries make."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import flashinfer_compat  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.flashinfer.test_norm" name="test_norm[cuda-1]"/>
  <testcase classname="tests.flashinfer.test_norm" name="test_norm[cuda-2]"><failure message="x"/></testcase>
  <testcase classname="tests.flashinfer.test_norm" name="test_norm[cuda-3]">
    <skipped message="Skipped: kiln does not claim the cute-dsl backend"/></testcase>
  <testcase classname="tests.flashinfer.test_norm" name="test_norm[cuda-4]">
    <skipped message="needs more memory"/></testcase>
  <testcase classname="tests.flashinfer.test_norm" name="test_norm[cuda-5]">
    <skipped message="Skipped: FlashInfer's own test skips qo_len > kv_len with causal"/></testcase>
  <testcase classname="tests.ops.norm.test_norm" name="test_other[cpu]"/>
  <testcase classname="tests.flashinfer.test_compat_report" name="test_summary"/>
</testsuite></testsuites>
"""


def test_summary_counts_each_outcome_and_keeps_undeclared_skips_apart(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    summary = flashinfer_compat.summarise(junit, "h200")
    # tests outside tests/flashinfer, and this file's own, are not counted
    assert list(summary["modules"]) == ["test_norm"]
    m = summary["modules"]["test_norm"]
    assert (m["passed"], m["failed"], m["skipped"]) == (1, 1, 3)
    assert m["not_claimed"] == {"kiln does not claim the cute-dsl backend": 1,
                                "FlashInfer's own test skips qo_len > kv_len with causal": 1}
    assert m["other_skips"] == {"needs more memory": 1}
    assert m["failures"] == ["test_norm[cuda-2]"]
    assert m["run"] == {"kiln_commit": flashinfer_compat._head(), "sample": 1, "stopped": False}
    row = flashinfer_compat.table([summary]).splitlines()[2]
    assert "1 / 2 (**1 fail**), 1 other skips" in row and "the cute-dsl backend (1)" in row


def test_a_later_run_replaces_the_modules_it_ran_and_the_footnote_says_which_run_is_which(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    sampled = tmp_path / "sampled.xml"
    sampled.write_text(JUNIT.replace('name="test_norm[cuda-1]"/>', 'name="test_norm[cuda-1]"><properties>'
                                     '<property name="sample" value="10"/></properties></testcase>'))
    full = flashinfer_compat.summarise(junit, "h200", stopped=True, commit="aaa1111")
    full["modules"]["test_rope"] = json.loads(json.dumps(full["modules"]["test_norm"]))
    again = flashinfer_compat.summarise(sampled, "h200", commit="bbb2222")
    assert again["modules"]["test_norm"]["run"]["sample"] == 10
    merged = flashinfer_compat.merge([full, again])
    assert merged["modules"]["test_norm"]["run"]["kiln_commit"] == "bbb2222"
    assert merged["modules"]["test_rope"]["run"]["kiln_commit"] == "aaa1111"
    footnote = flashinfer_compat.table([merged]).rstrip().splitlines()[-1]
    assert footnote.endswith(
        "Runs: h200: one case in 10 at bbb2222 (norm); every case at aaa1111, stopped at its "
        "time limit (the cases that finished) (rope).")
    cpu = flashinfer_compat.summarise(junit, "cpu", commit="ccc3333")
    with pytest.raises(SystemExit, match="one device"):
        flashinfer_compat.merge([full, cpu])


def test_the_skip_prefixes_are_the_ones_the_recreated_tests_use():
    from tests.flashinfer import conftest

    assert (conftest.NOT_CLAIMED, conftest.FLASHINFER_SKIP) == (
        flashinfer_compat.NOT_CLAIMED, flashinfer_compat.FLASHINFER_SKIP)


def test_every_recreated_module_names_the_flashinfer_file_it_recreates():
    here = REPO / "tests" / "flashinfer"
    modules = [p.stem for p in here.glob("test_*.py") if p.stem != "test_compat_report"]
    assert [m for m in modules if not flashinfer_compat.flashinfer_sources(m)] == []


def test_readme_table_is_the_one_the_committed_summaries_make():
    results = sorted((REPO / "tests" / "flashinfer" / "results").glob("*.json"))
    readme = (REPO / "README.md").read_text()
    assert flashinfer_compat.BEGIN in readme
    generated = readme.split(flashinfer_compat.BEGIN, 1)[1].split(flashinfer_compat.END, 1)[0]
    command = generated.splitlines()[1]
    named = [REPO / p for p in command.split("readme", 1)[1].split("-->")[0].split()]
    assert sorted(named) == results, "README's table must be made from every committed summary"
    summaries = [json.loads(p.read_text()) for p in named]
    assert generated.split("\n", 2)[2] == flashinfer_compat.table(summaries)
