"""Result files in and out: the interim bench_norm results still read, the README's headline
block is generated from results (never typed), and plot writes a PNG."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

from benchmarks import plot, readme, results, table

LEGACY = REPO / "benchmarks/results/h200-2026-11-30/norm_h200.json"


def test_bench_norm_results_read_in_the_harness_format():
    recs = results.load(LEGACY)
    assert len(recs) == 24
    assert {r["backend"] for r in recs} == {"kiln", "torch", "flashinfer"}
    assert all(r["status"] == "ok" and r["schema"] == results.SCHEMA for r in recs)
    graph = [r for r in recs if r["timing"]["cuda_graph"]]
    assert len(graph) == 12 and all(r["timing"]["mechanism"] == "cuda_events" for r in recs)
    big = [r for r in recs if r["axes"] == {"tokens": 16384, "hidden": 8192} and r["backend"] == "kiln"
           and not r["timing"]["cuda_graph"]]
    assert big[0]["median_us"] == pytest.approx(134.52, abs=0.01)
    assert "| rmsnorm | - | 16384 x 8192 (tokens x hidden) | kiln | cuda_events |" in table.render(
        recs, markdown=True)


def test_results_files_must_hold_records(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "kiln-bench/1"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not a JSON record"):
        results.load(bad)


RUN_ALL = REPO / "benchmarks/results/h200-2026-11-30-runall/results.jsonl"


def test_readme_headline_block_is_generated_from_the_results():
    path = REPO / "README.md"
    files, rows, cuda_graph, routines = readme.recorded_arguments(path)
    expected = readme.generate(files, path, rows=rows, cuda_graph=cuda_graph, routines=routines)
    text = path.read_text()
    assert expected in text, ("the README's headline block differs from its results; run the "
                              "command recorded in the block")
    # every headline row comes from the harness's `run all` results, not the interim script's
    link = f"]({RUN_ALL.relative_to(REPO).as_posix()})"
    assert f"[rmsnorm{link}" in expected and f"[batch_decode{link}" in expected
    assert "norm_h200.json" not in expected


def test_readme_block_routines_filter_order_and_compute_bound_cells(tmp_path):
    recs = [r for r in results.load(RUN_ALL) if r["routine"] in ("rmsnorm", "single_prefill", "merge_state")]
    out = readme.block(recs, REPO, "cmd", rows=1, routines=["single_prefill", "rmsnorm"])
    rows = [line for line in out.splitlines() if line.startswith("| [")]
    assert [r.split("]")[0] for r in rows] == ["| [single_prefill", "| [rmsnorm"]
    assert "TFLOP/s" in rows[0] and "of GEMM" in rows[0]  # prefill: compute-bound
    assert "TB/s" in rows[1] and "of copy" in rows[1]
    with pytest.raises(ValueError, match="no successful results of batch_decode"):
        readme.block(recs, REPO, "cmd", routines=["batch_decode"])


def test_readme_rewrite_needs_the_markers(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("# title\n")
    with pytest.raises(ValueError, match="has no <!-- benchmarks:headline:begin -->"):
        readme.rewrite(doc, "x")
    doc.write_text(f"a\n{readme.BEGIN}\nold\n{readme.END}\nb\n")
    assert readme.rewrite(doc, f"{readme.BEGIN}\nnew\n{readme.END}")
    assert doc.read_text() == f"a\n{readme.BEGIN}\nnew\n{readme.END}\nb\n"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot.plot(results.load(LEGACY), tmp_path / "norm.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=r"pip install 'kiln-kernels\[bench\]'"):
        plot.plot(results.load(LEGACY), tmp_path / "x.png")


def test_readme_rows_of_a_routine_come_from_the_last_file_holding_it():
    old = [{"routine": "single_prefill", "v": 1}, {"routine": "rmsnorm", "v": 1}]
    new = [{"routine": "single_prefill", "v": 2}]
    kept = readme.latest_per_routine([old, new])
    assert sorted((r["routine"], r["v"]) for r in kept) == [("rmsnorm", 1), ("single_prefill", 2)]
