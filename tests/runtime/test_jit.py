"""The build-and-load template on a toy module that compiles in a second."""

import json
import os
import stat
import time

import pytest
from helpers import make_toy_sources, run_python, toy_spec

from kiln.runtime import build, jit, metadata
from kiln.runtime.workspace import Workspace, WorkspaceError


@pytest.fixture
def toy(tmp_path):
    return make_toy_sources(tmp_path / "src")


@pytest.fixture
def ws(tmp_path, kiln_env):
    base = tmp_path / "ws"
    kiln_env.set("KILN_WORKSPACE_BASE", str(base))
    jit.clear_memory_cache()
    yield Workspace(base)
    jit.clear_memory_cache()


def _counts():
    return (jit.stats.compiled, jit.stats.disk_hits, jit.stats.memory_hits)


def test_one_compile_for_many_loads(toy, ws):
    c0, d0, m0 = _counts()
    mods = [jit.load(toy_spec(toy)) for _ in range(5)]
    assert all(m.answer() == 42 for m in mods)
    c1, d1, m1 = _counts()
    assert (c1 - c0, d1 - d0, m1 - m0) == (1, 0, 4)
    jit.clear_memory_cache()
    assert jit.load(toy_spec(toy)).answer() == 42
    assert _counts()[:2] == (c1, d1 + 1)  # a fresh process would hit the disk cache


def test_layout_permissions_and_metadata(toy, ws):
    jit.load(toy_spec(toy))
    p = build.plan(toy_spec(toy))
    assert p.key_dir.is_relative_to(ws.artifacts / "toy_module")
    assert p.gen_dir.is_relative_to(ws.generated / "toy_module")
    assert (p.gen_dir / "toy.cc").is_file()
    for d in (ws.base, ws.artifacts, ws.generated, p.key_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    md = metadata.read(p.key_dir)
    assert md.spec_key == p.spec_key and md.module == "toy_module"
    assert (p.key_dir / md.library).is_file()
    assert any(d.path.endswith("toy_value.h") for d in md.deps)  # headers from the depfile
    assert not any(d.path.startswith(str(ws.generated)) for d in md.deps)
    assert md.commands and "toy.cc" in " ".join(md.commands)


def test_editing_an_included_header_rebuilds_with_a_new_action_key(toy, ws):
    assert jit.load(toy_spec(toy)).answer() == 42
    key_dir = build.plan(toy_spec(toy)).key_dir
    first = metadata.read(key_dir)
    (toy / "include" / "toy_value.h").write_text("#pragma once\n#define TOY_VALUE 7\n")
    jit.clear_memory_cache()
    c0 = jit.stats.compiled
    assert jit.load(toy_spec(toy)).answer() == 7
    assert jit.stats.compiled == c0 + 1
    second = metadata.read(key_dir)
    assert second.spec_key == first.spec_key  # the header is not a declared input...
    assert second.action_key != first.action_key  # ...but it is part of the action key
    assert not (key_dir / first.library).exists()  # the superseded library was removed


def test_nothing_is_written_on_a_cache_hit(toy, ws):
    jit.load(toy_spec(toy))

    def snapshot():
        return {str(p): p.stat().st_mtime_ns for p in ws.base.rglob("*")}

    before = snapshot()
    time.sleep(0.01)
    proc = run_python(
        "from helpers import toy_spec; from kiln.runtime import jit; from pathlib import Path\n"
        f"m = jit.load(toy_spec(Path({str(toy)!r})))\n"
        "print(m.answer(), jit.stats.compiled, jit.stats.disk_hits)",
        env={"KILN_WORKSPACE_BASE": str(ws.base)})
    assert proc.stdout.split() == ["42", "0", "1"]
    assert snapshot() == before


def test_nothing_is_created_before_a_miss(toy, ws):
    build.plan(toy_spec(toy))
    jit.check(build.plan(toy_spec(toy)))
    assert not ws.base.exists()


def test_workspace_override_is_honoured(toy, tmp_path, kiln_env):
    other = tmp_path / "elsewhere"
    kiln_env.set("KILN_WORKSPACE_BASE", str(other))
    jit.clear_memory_cache()
    jit.load(toy_spec(toy, name="toy_override"))
    assert list((other / "artifacts").iterdir())[0].name == "toy_override"


def test_disable_jit_refuses_to_compile_and_names_the_module(toy, ws, kiln_env):
    kiln_env.set("KILN_DISABLE_JIT", "1")
    with pytest.raises(jit.JITDisabledError) as e:
        jit.load(toy_spec(toy))
    msg = str(e.value)
    assert "toy_module" in msg and "KILN_DISABLE_JIT=1" in msg and "not built yet" in msg
    # a command that works wherever kiln is installed (python -m codegen works only in a checkout)
    assert "'python -m kiln.codegen build //tests:toy'" in msg
    assert not ws.base.exists()
    kiln_env.unset("KILN_DISABLE_JIT")
    jit.load(toy_spec(toy))
    jit.clear_memory_cache()
    kiln_env.set("KILN_DISABLE_JIT", "1")
    assert jit.load(toy_spec(toy)).answer() == 42  # a valid cached artifact is fine


def test_corrupt_metadata_is_rebuilt(toy, ws):
    jit.load(toy_spec(toy))
    key_dir = build.plan(toy_spec(toy)).key_dir
    (key_dir / "metadata.json").write_text("{ not json")
    jit.clear_memory_cache()
    c0 = jit.stats.compiled
    assert jit.load(toy_spec(toy)).answer() == 42
    assert jit.stats.compiled == c0 + 1
    assert metadata.read(key_dir) is not None


def test_corrupt_or_truncated_library_is_rebuilt_not_loaded(toy, ws):
    jit.load(toy_spec(toy))
    key_dir = build.plan(toy_spec(toy)).key_dir
    lib = key_dir / metadata.read(key_dir).library
    # Corrupt the file on disk as a crash or a bad copy would: a new file in its place (this
    # process still has the old one mapped; truncating that in place would crash it).
    tmp = key_dir / "corrupt.tmp"
    tmp.write_bytes(lib.read_bytes()[:100])
    os.replace(tmp, lib)
    jit.clear_memory_cache()
    md, reason = jit.check(build.plan(toy_spec(toy)))
    assert "has 100 bytes, its metadata records" in reason
    c0 = jit.stats.compiled
    assert jit.load(toy_spec(toy)).answer() == 42
    assert jit.stats.compiled == c0 + 1


def test_metadata_from_another_kiln_version_is_not_used(toy, ws):
    jit.load(toy_spec(toy))
    key_dir = build.plan(toy_spec(toy)).key_dir
    data = json.loads((key_dir / "metadata.json").read_text())
    data["kiln_version"] = "0.0.1"
    (key_dir / "metadata.json").write_text(json.dumps(data))
    _, reason = jit.check(build.plan(toy_spec(toy)))
    assert reason == f"built by kiln 0.0.1, this is kiln {data['key_parts']['kiln_version']}"


def test_refuses_to_load_from_a_directory_others_can_write(toy, ws):
    jit.load(toy_spec(toy))
    key_dir = build.plan(toy_spec(toy)).key_dir
    os.chmod(key_dir, 0o777)
    jit.clear_memory_cache()
    try:
        with pytest.raises(WorkspaceError, match=r"writable by other users \(mode 777\).*chmod go-w"):
            jit.load(toy_spec(toy))
    finally:
        os.chmod(key_dir, 0o700)
    os.chmod(ws.base, 0o775)
    try:
        with pytest.raises(WorkspaceError, match=str(ws.base)):
            jit.load(toy_spec(toy))
    finally:
        os.chmod(ws.base, 0o700)


def test_no_cache_builds_in_a_temporary_directory(toy, ws, kiln_env):
    kiln_env.set("KILN_NO_CACHE", "1")
    c0 = jit.stats.compiled
    assert jit.load(toy_spec(toy)).answer() == 42
    jit.clear_memory_cache()
    assert jit.load(toy_spec(toy)).answer() == 42
    assert jit.stats.compiled == c0 + 2  # nothing reused
    assert not ws.artifacts.exists()  # nothing kept


def test_compile_error_carries_the_compiler_message_and_the_command(toy, ws):
    (toy / "toy.cc").write_text("this is not C++;\n")
    with pytest.raises(build.CompileError) as e:
        jit.load(toy_spec(toy))
    msg = str(e.value)
    assert "compiling toy_module" in msg
    assert "error" in msg.lower() and "this is not" in msg  # the compiler's own words
    assert "FAILED" in msg and "-c " in msg and "toy.cc" in msg  # the failing command
    assert "'python -m kiln.codegen explain //tests:toy'" in msg
    # Nothing half-published: no metadata, so the next attempt compiles again.
    assert metadata.read(build.plan(toy_spec(toy)).key_dir) is None


def test_verbose_streams_compiler_output_without_changing_the_key(toy, ws, capfd, kiln_env):
    quiet_key = build.plan(toy_spec(toy)).spec_key
    kiln_env.set("KILN_JIT_VERBOSE", "1")
    jit.load(toy_spec(toy))
    err = capfd.readouterr().err
    assert "toy.cc" in err and "-c" in err  # ninja -v echoes each command as it runs
    assert build.plan(toy_spec(toy)).spec_key == quiet_key


def test_long_compiles_report_progress(toy, ws, monkeypatch, caplog):
    from kiln.runtime import ninja

    real_run = ninja.run

    def slow_tick_run(build_dir, jobs, verbose, on_tick=None, tick_s=15.0):
        return real_run(build_dir, jobs, verbose, on_tick=on_tick, tick_s=0.01)

    monkeypatch.setattr(ninja, "run", slow_tick_run)
    import logging

    with caplog.at_level(logging.INFO, logger="kiln.jit"):
        logging.getLogger("kiln.jit").propagate = True
        try:
            jit.load(toy_spec(toy))
        finally:
            logging.getLogger("kiln.jit").propagate = False
    text = caplog.text
    assert "compiling toy_module [host]" in text
    assert "still compiling toy_module" in text
    assert "compiled toy_module" in text
