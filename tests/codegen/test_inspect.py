"""`python -m codegen inspect`: generated sources, manifest, library and metadata shown together,
found by URI, module name or label; it reads and never writes."""

from __future__ import annotations

import json
import re

import pytest

from kiln.codegen.cli import main


@pytest.fixture
def built(session_workspace, capsys):
    """The host f32 norm module, built (or found) in the session workspace."""
    assert main(["build", "//ops:norm", "--set", "dtype=f32", "--toolchain", "host"]) == 0
    capsys.readouterr()
    return session_workspace


def test_a_built_module_shows_sources_manifest_library_and_metadata(built, capsys):
    assert main(["inspect", "norm_dtype_f32_host"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "== norm_dtype_f32_host  (//ops:norm, uri norm_dtype_f32, host toolchain, dtype=f32)")
    assert re.search(r"spec_config.h +\(rendered", out) and 'kUri = "norm_dtype_f32"' in out  # in full
    assert "norm_host.cc" in out and "(copied from ops/norm/norm_host.cc" in out
    assert "norm_binding.cc" in out and "void rmsnorm(" in out  # generated from the entries: in full
    assert "(current)" in out and "status           usable: the JIT loads this one" in out
    assert "library          " in out and "metadata         " in out and "spec key " in out
    assert "headers read by the compiler:" in out and "build manifest   " in out
    assert "rule cxx" in out  # the manifest itself


def test_by_uri_both_toolchains_and_json(built, capsys):
    assert main(["inspect", "norm_dtype_f32", "--json"]) == 0
    reports = {r["module"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(reports) == {"norm_dtype_f32_cuda", "norm_dtype_f32_host"}
    host = reports["norm_dtype_f32_host"]
    current = [b for b in host["builds"] if b["current"]]
    assert len(current) == 1 and current[0]["metadata"]["spec_key"] == host["plan"]["spec_key"]
    assert current[0]["library"]["exists"] and "rule link" in current[0]["manifest"]["text"]


def test_before_a_build_it_shows_what_a_build_would_write_and_writes_nothing(tmp_path, kiln_env,
                                                                            capsys):
    kiln_env.set("KILN_WORKSPACE_BASE", str(tmp_path / "ws"))
    assert main(["inspect", "//ops:norm", "--set", "dtype=bf16", "--toolchain", "host"]) == 0
    out = capsys.readouterr().out
    assert "generated sources  none yet" in out
    assert "not built yet; the build manifest a build would write:" in out and "rule cxx" in out
    assert "builds             none in the cache" in out
    assert not (tmp_path / "ws").exists()


def test_a_cuda_module_without_an_arch_list_still_shows_the_cache(tmp_path, kiln_env, capsys):
    kiln_env.set("KILN_WORKSPACE_BASE", str(tmp_path / "ws"))
    kiln_env.unset("KILN_CUDA_ARCH_LIST")
    broken = tmp_path / "ws" / "artifacts" / "norm_dtype_bf16_cuda" / "0123456789abcdef01234567"
    broken.mkdir(parents=True)
    (broken / "metadata.json").write_text("{not json")
    assert main(["inspect", "norm_dtype_bf16_cuda"]) == 0
    out = capsys.readouterr().out
    from kiln.runtime.arch import detect_devices

    if not detect_devices():
        assert "plan               none for the arch list in force: no CUDA arch to build" in out
    assert "build 0123456789abcdef01234567" in out
    assert "status           not usable:" in out and "is corrupt" in out


def test_an_unknown_name_is_one_line_with_near_matches(capsys):
    assert main(["inspect", "norm_dtype_bf61"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("codegen inspect: error: 'norm_dtype_bf61' is not a URI, module name or label")
    assert "did you mean norm_dtype_bf16" in last and re.search(r"known targets: .*//ops:norm", last)
