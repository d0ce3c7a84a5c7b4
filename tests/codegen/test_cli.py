"""`python -m codegen` (the repository root's name for `python -m kiln.codegen`): every subcommand,
exit codes, one-line failure reasons, and the notes about the arch list."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

from kiln.runtime.toolchain import available


def codegen(*args, ws, env=None, check=True):
    full = dict(os.environ, KILN_WORKSPACE_BASE=str(ws), **(env or {}))
    full.pop("KILN_CUDA_ARCH_LIST", None)
    proc = subprocess.run([sys.executable, "-m", "codegen", *args], capture_output=True, text=True,
                          cwd=REPO, env=full, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"codegen {args} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_query_shows_toolchains_families_axes_and_counts(tmp_path):
    out = codegen("query", "//ops/...", "--specs", ws=tmp_path).stdout
    assert "//ops:norm" in out
    assert "toolchains     cuda, host" in out
    assert "sm90 (9.0)" in out
    assert "axis dtype     f32, f16, bf16" in out
    assert "specialisations 3" in out
    assert "norm_dtype_bf16_cuda" in out
    assert not (tmp_path / "generated").exists()  # query writes nothing


def test_unknown_label_exits_nonzero_with_a_one_line_reason(tmp_path):
    proc = codegen("query", "//ops:nrom", ws=tmp_path, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("codegen query: error: no target matches '//ops:nrom'")
    assert "did you mean //ops:norm" in last


def test_bad_set_value_is_rejected(tmp_path):
    proc = codegen("gen", "//ops:norm", "--set", "dtype=f64", ws=tmp_path, check=False)
    assert proc.returncode != 0
    assert "dtype=f64 is not supported; dtype takes f32, f16, bf16" in proc.stderr


def test_gen_renders_and_prints_where(tmp_path):
    out = codegen("gen", "//ops:norm", "--set", "dtype=bf16", "--toolchain", "host",
                  ws=tmp_path).stdout
    line = out.strip().splitlines()[0]
    name, path = line.split()
    assert name == "norm_dtype_bf16_host"
    assert (tmp_path / "generated") in [p for p in __import__("pathlib").Path(path).parents]
    assert {p for p in os.listdir(path)} == {"spec_config.h", "norm_host.cc", "norm_binding.cc"}


def test_build_host_then_cached_then_explain_then_clean(tmp_path):
    first = codegen("build", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                    ws=tmp_path).stdout
    assert "built  norm_dtype_f32_host" in first and "summary: 1 built, 0 cached, 0 failed" in first
    again = codegen("build", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                    ws=tmp_path).stdout
    assert "summary: 0 built, 1 cached, 0 failed" in again
    explain = codegen("explain", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                      ws=tmp_path).stdout
    assert "status: up to date" in explain
    assert "compile commands:" in explain and " -c " in explain and "norm_host.cc" in explain
    assert '"kiln_version"' in explain and "spec key" in explain
    assert "parallel jobs:" in explain
    env = {"KILN_JIT_DEBUG": "1"}
    changed = codegen("explain", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                      ws=tmp_path, env=env).stdout
    assert "status: a build would happen now: not built yet" in changed
    assert "env.KILN_JIT_DEBUG: false -> true" in changed  # what changed in the key
    where = codegen("where", ws=tmp_path).stdout
    assert str(tmp_path) in where and "artifacts" in where
    codegen("clean", "//ops:norm", ws=tmp_path)
    assert not list((tmp_path / "artifacts").glob("*/.lock*"))  # no lock file left behind
    after = codegen("explain", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                    ws=tmp_path).stdout
    assert "a build would happen now" in after


def test_build_failure_is_reported_and_exits_nonzero(tmp_path):
    # An arch no family supports: a clear error before anything compiles.
    proc = codegen("build", "//ops:norm", "--set", "dtype=f32", "--arch-list", "7.5",
                   ws=tmp_path, check=False)
    if not available("cuda"):
        assert "nvcc is not available" in proc.stderr
    else:
        assert "supports none of the requested CUDA archs [7.5]" in proc.stderr
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("codegen build: error:")


@pytest.mark.skipif(not available("cuda"), reason="needs nvcc (compile only; no GPU needed)")
def test_build_cross_compiles_cuda_without_a_gpu(tmp_path):
    out = codegen("build", "//ops:norm", "--set", "dtype=bf16", "--arch-list", "9.0",
                  ws=tmp_path).stdout
    assert "with cuda for [9.0]" in out and "built  norm_dtype_bf16_cuda" in out


def test_negative_jobs_are_rejected_with_a_clear_message(tmp_path):
    """`build -j -3` was accepted."""
    proc = codegen("build", "//ops:norm", "-j", "-3", ws=tmp_path, check=False)
    assert proc.returncode == 2
    assert "-j/--jobs: must be 0 (the estimate from cores and free memory) or a positive number " \
           "of jobs, got -3" in proc.stderr
    proc = codegen("build", "//ops:norm", "-j", "two", ws=tmp_path, check=False)
    assert proc.returncode == 2 and "expects a number of jobs, got 'two'" in proc.stderr
    assert not (tmp_path / "artifacts").exists()


def test_host_toolchain_says_it_ignores_the_arch_list(tmp_path):
    """`--toolchain host --arch-list 9.0a` ignored the arch list silently."""
    proc = codegen("explain", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host",
                   "--arch-list", "9.0a", ws=tmp_path)
    assert "note: --toolchain host ignores --arch-list '9.0a'" in proc.stderr


@pytest.mark.skipif(not available("cuda"), reason="needs nvcc (compile only; no GPU needed)")
def test_archs_a_target_does_not_support_are_reported(tmp_path):
    """An arch dropped from --arch-list because the target does not support it was not reported."""
    proc = codegen("explain", "//ops:norm", "--set", "dtype=bf16", "--arch-list", "7.5 9.0",
                   ws=tmp_path)
    assert "note: //ops:norm does not support 7.5 (--arch-list '7.5 9.0')" in proc.stderr
    assert "archs       9.0 (the arch list in force, restricted" in proc.stdout


def test_build_all_force_rebuilds_every_unit(tmp_path):
    """`--force` re-ran only some units: ninja's incremental state survived."""
    from helpers import make_toy_sources, toy_spec

    from kiln.codegen.batch import build_all
    from kiln.runtime.arch import ArchContext
    from kiln.runtime.workspace import Workspace

    toy = make_toy_sources(tmp_path / "src")
    ws = Workspace(tmp_path / "ws")
    spec = toy_spec(toy, units=("toy.cc", "extra.cc"))
    ctx = ArchContext((), "host")
    assert build_all([spec], ctx, toolchain="host", workspace=ws, say=lambda s: None) == {
        "toy_module": "built"}
    objs = list(ws.artifacts.glob("toy_module/*/build/*.o"))
    before = {o: o.stat().st_mtime_ns for o in objs}
    import time

    time.sleep(0.05)
    assert build_all([spec], ctx, toolchain="host", workspace=ws, force=True,
                     say=lambda s: None) == {"toy_module": "built"}
    assert len(objs) == 2 and all(o.stat().st_mtime_ns > t for o, t in before.items())
    with pytest.raises(ValueError, match="jobs must be 0"):
        build_all([spec], ctx, toolchain="host", workspace=ws, jobs=-1, say=lambda s: None)


def test_clean_removes_lock_files_no_process_holds_and_keeps_held_ones(tmp_path):
    """`clean` left lock files behind."""
    from kiln.runtime.lock import ModuleLock

    mod = tmp_path / "artifacts" / "norm_dtype_f32_host"
    (mod / "slot").mkdir(parents=True)
    (mod / "slot" / "metadata.json").write_text("{}")
    with ModuleLock(mod / ".lock", "norm_dtype_f32_host"):
        out = codegen("clean", "//ops:norm", ws=tmp_path).stdout
        assert "kept 1 module(s) being built now (their lock is held): norm_dtype_f32_host" in out
        assert (mod / "slot" / "metadata.json").exists() and (mod / ".lock").exists()
    codegen("clean", "//ops:norm", ws=tmp_path)
    assert not mod.exists()  # slots, the lock file and its owner note
    (mod / "slot").mkdir(parents=True)
    ModuleLock(mod / ".lock", "m").__enter__().release()
    out = codegen("clean", ws=tmp_path).stdout
    assert "removed" in out and not (tmp_path / "artifacts").exists()
