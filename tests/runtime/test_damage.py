"""A damaged, planted or tampered disk cache ends in a correct module or a clear error, never in a
crash or in code that kiln did not build: truncated, bit-flipped and planted libraries in the
cache slot and in its build directory, metadata edited field by field or missing, files and
directories that are links or that other users own or can write, and a disk that fills up during
a compile. On the toy module (compiles in well under a second).

Anything that loads a damaged library runs in a child process (damage to a file this process has
mapped would crash the test run itself); the rest checks `jit.verify` in-process. The planted
library's constructor writes a marker file: the marker must never appear."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from helpers import build_planted, make_toy_sources, run_python, toy_spec

from kiln.runtime import cache, jit, metadata
from kiln.runtime.workspace import Workspace, WorkspaceError

ROOT = os.getuid() == 0
NOBODY = 65534


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


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(a planted library of the toy's name, the marker its constructor would write)."""
    d = tmp_path_factory.mktemp("planted")
    marker = d / "MARKER"
    return build_planted(d / "planted.so", marker), marker


def _built(toy, units=("toy.cc",)):
    """Build the toy into the cache without loading it here; (plan, metadata)."""
    status, p = jit.build(toy_spec(toy, units=units), quiet=True)
    md = metadata.read(p.key_dir)
    return p, md


LOAD = """
from pathlib import Path
from helpers import toy_spec
from kiln.runtime import jit
m = jit.load(toy_spec(Path({toy!r}), units={units!r}))
print("answer", m.answer(), "compiled", jit.stats.compiled)
"""


def _load_child(toy, ws, units=("toy.cc",), check=True, **env):
    return run_python(LOAD.format(toy=str(toy), units=units), check=check,
                      env={"KILN_WORKSPACE_BASE": str(ws.base), **env})


def _answer(proc) -> tuple[int, int]:
    words = proc.stdout.split()
    return int(words[words.index("answer") + 1]), int(words[words.index("compiled") + 1])


def _quarantined(p) -> list[Path]:
    q = p.module_dir / cache.QUARANTINE
    return sorted(q.iterdir()) if q.is_dir() else []


def _resign(p, lib: Path, name: str | None = None):
    """An edit that makes the metadata describe `lib` consistently (as a same-user editor could)."""
    size, sha = lib.stat().st_size, metadata.files.verified_digest(lib)

    def edit(d):
        d.update(library_size=size, library_sha256=sha, library=name or d["library"])
        d["outputs"][f"{d['module']}.so"] = [size, sha]
    return edit


def _edit_metadata(p, edit) -> None:
    path = p.key_dir / metadata.METADATA
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


# --- the library: truncated, bit-flipped, planted, in the slot and in the build directory ------

def test_truncated_library_and_build_copy_rebuild_from_scratch(toy, ws):
    """Truncating the cached library and its copy in build/ made the next process "recompile" in
    0.0 s (ninja saw outputs newer than inputs), republish the truncated file and SIGBUS on
    loading it, and so every process after it."""
    p, md = _built(toy)
    for lib in (p.key_dir / md.library, p.key_dir / "build" / p.output):
        os.truncate(lib, 100)
    proc = _load_child(toy, ws)
    assert _answer(proc) == (42, 1)
    assert "has 100 bytes, its metadata records" in proc.stderr and "Moved its slot to" in proc.stderr
    assert len(_quarantined(p)) == 1
    fresh = metadata.read(p.key_dir)
    assert fresh.library_size == md.library_size and fresh.build_seconds > 0
    assert _answer(_load_child(toy, ws)) == (42, 0)  # and every later process just loads it


def test_bit_flipped_library_is_quarantined_and_rebuilt(toy, ws):
    p, md = _built(toy)
    lib = p.key_dir / md.library
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x10
    lib.write_bytes(bytes(data))
    assert "does not match its recorded SHA-256" in jit.verify(p).reason
    proc = _load_child(toy, ws)
    assert _answer(proc) == (42, 1) and len(_quarantined(p)) == 1


def test_a_planted_library_in_the_slot_never_runs(toy, ws, planted):
    lib_src, marker = planted
    p, md = _built(toy)
    shutil.copyfile(lib_src, p.key_dir / md.library)
    assert jit.verify(p).state == "damaged"
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not marker.exists()


def test_a_planted_library_in_the_build_directory_is_never_republished(toy, ws, planted):
    lib_src, marker = planted
    p, md = _built(toy)
    os.truncate(p.key_dir / md.library, 0)
    shutil.copyfile(lib_src, p.key_dir / "build" / p.output)  # newer than every input
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not marker.exists()
    assert metadata.read(p.key_dir).library_sha256 == md.library_sha256  # rebuilt, identical


def test_a_header_edit_reuses_only_verified_build_outputs(toy, ws):
    """The one incremental rebuild: a verified slot whose header changed. The unit that reads the
    header recompiles, the other is reused."""
    units = ("toy.cc", "extra.cc")
    p, md = _built(toy, units)
    extra = p.key_dir / "build" / "extra.cc.o"
    before = extra.stat().st_mtime_ns
    (toy / "include" / "toy_value.h").write_text("#pragma once\n#define TOY_VALUE 7\n")
    assert jit.verify(p).state == "stale"
    assert _answer(_load_child(toy, ws, units)) == (7, 1)
    assert extra.stat().st_mtime_ns == before and not _quarantined(p)


def test_a_planted_object_in_the_build_directory_is_never_linked(toy, ws, tmp_path, planted):
    """An incremental rebuild would have linked whatever object ninja found newer than its source."""
    _, marker = planted
    units = ("toy.cc", "extra.cc")
    p, md = _built(toy, units)
    build_planted(p.key_dir / "build" / "extra.cc.o", marker, kind="object")
    (toy / "include" / "toy_value.h").write_text("#pragma once\n#define TOY_VALUE 7\n")
    proc = _load_child(toy, ws, units)
    assert _answer(proc) == (7, 1)
    assert not marker.exists()
    assert "extra.cc.o does not match the digest recorded" in proc.stderr


def test_a_header_edit_recompiles_its_unit_even_when_its_mtime_is_older(toy, ws):
    """ninja compares mtimes; a header restored with an old mtime (a checkout, cp -p) must still
    recompile the units that read it."""
    p, md = _built(toy)
    header = toy / "include" / "toy_value.h"
    obj = p.key_dir / "build" / "toy.cc.o"
    header.write_text("#pragma once\n#define TOY_VALUE 9\n")
    old = obj.stat().st_mtime_ns - 10**9
    os.utime(header, ns=(old, old))
    assert _answer(_load_child(toy, ws)) == (9, 1)


def test_a_crashed_build_starts_from_an_empty_slot(toy, ws, planted):
    """No metadata (the commit marker) but a build directory: an interrupted build. Nothing in it
    is reused."""
    lib_src, marker = planted
    p, md = _built(toy)
    (p.key_dir / metadata.METADATA).unlink()
    shutil.copyfile(lib_src, p.key_dir / "build" / p.output)
    os.truncate(p.key_dir / "build" / "toy.cc.o", 10)
    entry = jit.verify(p)
    assert entry.state == "absent" and "interrupted build" in entry.reason
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not marker.exists() and not _quarantined(p)


def test_force_rebuilds_every_unit(toy, ws):
    units = ("toy.cc", "extra.cc")
    p, md = _built(toy, units)
    objs = [p.key_dir / "build" / f"{u}.o" for u in units]
    before = [o.stat().st_mtime_ns for o in objs]
    time.sleep(0.05)
    status, _ = jit.build(toy_spec(toy, units=units), force=True, quiet=True)
    assert status == "built"
    assert all(o.stat().st_mtime_ns > b for o, b in zip(objs, before, strict=True))


# --- metadata: every field, wrong types, missing, edited ---------------------------------------

BAD_VALUES = [None, [], {}, "", -1, True, 1.5, "x", "../evil.so", ["a"], {"a": 1}]


def test_every_metadata_field_with_a_wrong_value_is_a_miss_never_an_exception(toy, ws):
    p, md = _built(toy)
    path = p.key_dir / metadata.METADATA
    text = path.read_text()
    good = json.loads(text)
    tried = 0
    for field in sorted(metadata._TYPES):
        for value in [*BAD_VALUES, "missing"]:
            d = dict(good)
            if value == "missing":
                del d[field]
            else:
                d[field] = value
            if d == good:
                continue
            path.write_text(json.dumps(d))
            entry = jit.verify(p)  # never raises
            tried += 1
            informational = field in ("label", "commands", "built_at", "build_seconds") and \
                value != "missing" and metadata._TYPES[field](value) is None
            if informational:  # checked against nothing: still the right library
                assert entry.state == "ok", (field, value)
            else:
                assert entry.state in ("damaged", "absent") and entry.reason, (field, value, entry)
    assert tried > 150
    for bad in ["", "{ not json", "null", "[]", "42", '{"format": 2}', '{"format": "2"}',
                text[: len(text) // 2]]:
        path.write_text(bad)
        assert jit.verify(p).state == "damaged", bad
    path.write_text(text)
    assert jit.verify(p).state == "ok"


def test_a_null_library_field_is_rebuilt_in_every_later_process(toy, ws):
    """"library": null raised TypeError in every later process."""
    p, md = _built(toy)
    _edit_metadata(p, lambda d: d.update(library=None))
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert _answer(_load_child(toy, ws)) == (42, 0)


@pytest.mark.parametrize("where", ["absolute", "dotdot", "subdir"])
def test_a_library_path_outside_the_slot_is_never_loaded(toy, ws, planted, where):
    """The library field was used as a path: pointed (with a matching digest) outside the slot,
    the planted code ran."""
    lib_src, marker = planted
    p, md = _built(toy)
    outside = {"absolute": ws.base.parent / "evil.so", "dotdot": p.key_dir.parent / "evil.so",
               "subdir": p.key_dir / "build" / "evil.so"}[where]
    shutil.copyfile(lib_src, outside)
    name = {"absolute": str(outside), "dotdot": "../evil.so", "subdir": "build/evil.so"}[where]
    _edit_metadata(p, _resign(p, outside, name))
    assert "plain file name" in jit.verify(p).reason
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not marker.exists()


def test_a_consistent_edit_of_the_integrity_fields_is_still_refused(toy, ws):
    p, md = _built(toy)
    _edit_metadata(p, lambda d: d.update(kiln_version="0.0.1"))
    assert jit.verify(p).reason.startswith("built by kiln 0.0.1")
    p, md = _built(toy)  # rebuilt after the quarantine
    _edit_metadata(p, lambda d: d["key_parts"].update(uri="other"))
    assert "key parts do not hash to its spec key" in jit.verify(p).reason


# --- files and directories: links, modes, owners -----------------------------------------------

def test_a_library_writable_by_others_is_quarantined(toy, ws):
    """A 0666 library in a private directory loaded."""
    p, md = _built(toy)
    os.chmod(p.key_dir / md.library, 0o666)
    assert "is writable by other users (mode 666)" in jit.verify(p).reason
    os.chmod(p.key_dir / md.library, 0o660)
    assert "mode 660" in jit.verify(p).reason
    assert _answer(_load_child(toy, ws)) == (42, 1)


@pytest.mark.parametrize("what", ["library", "metadata"])
def test_a_file_that_is_a_link_is_quarantined(toy, ws, tmp_path, what):
    p, md = _built(toy)
    name = md.library if what == "library" else metadata.METADATA
    copy = tmp_path / f"copy-{name}"
    shutil.copyfile(p.key_dir / name, copy)
    (p.key_dir / name).unlink()
    (p.key_dir / name).symlink_to(copy)
    assert jit.verify(p).state == "damaged"
    assert _answer(_load_child(toy, ws)) == (42, 1)


def test_a_slot_replaced_by_a_link_is_quarantined(toy, ws, tmp_path):
    p, md = _built(toy)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(p.key_dir, elsewhere)
    shutil.rmtree(p.key_dir)
    p.key_dir.symlink_to(elsewhere)
    assert jit.verify(p).reason == "the cache slot is a symbolic link"
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not p.key_dir.is_symlink() and elsewhere.is_dir()  # the link moved aside, not followed


def test_a_module_directory_replaced_by_a_link_is_refused(toy, ws, tmp_path):
    p, md = _built(toy)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(p.module_dir, elsewhere)
    p.module_dir.symlink_to(elsewhere)
    with pytest.raises(WorkspaceError, match="is a symbolic link"):
        jit.verify(p)
    proc = _load_child(toy, ws, check=False)
    assert proc.returncode != 0 and "WorkspaceError" in proc.stderr and "is a symbolic link" in proc.stderr


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_a_cache_directory_others_can_write_is_refused(toy, ws, mode):
    p, md = _built(toy)
    os.chmod(p.module_dir, mode)
    try:
        with pytest.raises(WorkspaceError, match=rf"writable by other users \(mode {mode:o}\).*chmod go-w"):
            jit.verify(p)
        proc = _load_child(toy, ws, check=False)
        assert proc.returncode != 0 and "WorkspaceError" in proc.stderr
    finally:
        os.chmod(p.module_dir, 0o700)


@pytest.mark.skipif(not ROOT, reason="planting a file of another user needs root")
def test_files_planted_by_another_user_never_load_after_chmod_go_w(toy, ws, planted):
    """With the directories made private (what kiln's refusal advises), a library another user
    planted while they were writable, and its re-signed metadata, loaded."""
    lib_src, marker = planted
    p, md = _built(toy)
    lib = p.key_dir / md.library
    shutil.copyfile(lib_src, lib)
    _edit_metadata(p, _resign(p, lib))
    os.chown(lib, NOBODY, NOBODY)
    os.chmod(lib, 0o755)
    assert f"belongs to uid {NOBODY}" in jit.verify(p).reason
    assert _answer(_load_child(toy, ws)) == (42, 1)
    assert not marker.exists()
    p, md = _built(toy)
    os.chown(p.key_dir / metadata.METADATA, NOBODY, NOBODY)
    assert f"belongs to uid {NOBODY}" in jit.verify(p).reason
    os.chown(p.key_dir, NOBODY, NOBODY)
    with pytest.raises(WorkspaceError, match=f"belongs to uid {NOBODY}"):
        jit.verify(p)


def test_quarantine_keeps_only_the_newest_entries(toy, ws):
    p, md = _built(toy)
    shutil.rmtree(p.key_dir)
    for i in range(cache.QUARANTINE_KEEP + 2):
        p.key_dir.mkdir()
        (p.key_dir / metadata.METADATA).write_text(f"damaged {i}")
        cache.quarantine(p, f"test {i}")
    kept = _quarantined(p)
    assert len(kept) == cache.QUARANTINE_KEEP
    assert [(k / metadata.METADATA).read_text() for k in kept] == [
        f"damaged {i}" for i in range(2, cache.QUARANTINE_KEEP + 2)]  # the newest


# --- a full disk ---------------------------------------------------------------------------------

FULL_DISK = """
import resource
from pathlib import Path
from helpers import toy_spec
from kiln.runtime import jit
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
jit.load(toy_spec(Path({toy!r})))
"""


def test_a_full_disk_during_a_compile_is_a_clear_error_and_publishes_nothing(toy, tmp_path):
    """RLIMIT_FSIZE as a disk that fills up: at the sources, the objects, the library and the
    metadata. Each is a clear error; a later process builds and loads a correct module."""
    ref = Workspace(tmp_path / "ref")
    _, p = jit.build(toy_spec(toy), workspace=ref, quiet=True)
    md = metadata.read(p.key_dir)
    sizes = {"object": (p.key_dir / "build" / "toy.cc.o").stat().st_size,
             "library": md.library_size, "metadata": (p.key_dir / metadata.METADATA).stat().st_size}
    for stage, limit in [("sources", 200), *((s, n - 1) for s, n in sizes.items())]:
        base = tmp_path / f"ws-{stage}"
        proc = run_python(FULL_DISK.format(limit=limit, toy=str(toy)), check=False,
                          env={"KILN_WORKSPACE_BASE": str(base)})
        assert proc.returncode != 0, stage
        last = proc.stderr.strip().splitlines()[-1]
        assert ("BuildWriteError" in last and "File too large" in last and
                "Nothing was published" in last) or "CompileError" in proc.stderr, (stage, proc.stderr)
        print(stage, limit, last)
        key_dir = Workspace(base).key_dir(p.spec.name, p.spec_key)
        assert not (key_dir / metadata.METADATA).exists(), stage
        fresh = run_python(LOAD.format(toy=str(toy), units=("toy.cc",)),
                           env={"KILN_WORKSPACE_BASE": str(base)})
        assert _answer(fresh) == (42, 1), stage


def test_no_write_happens_on_a_verified_hit(toy, ws):
    p, md = _built(toy)
    before = {str(q): q.stat().st_mtime_ns for q in ws.base.rglob("*")}
    time.sleep(0.01)
    assert _answer(_load_child(toy, ws)) == (42, 0)
    assert {str(q): q.stat().st_mtime_ns for q in ws.base.rglob("*")} == before
    assert stat.S_IMODE((p.key_dir / md.library).stat().st_mode) == 0o700
