"""Precompiled modules from an installed package: found by portable key
with no compiler, never stale, never from another kiln version unless deliberately, never
tampered, never replaceable by another user; and the plan that needs no compiler."""

import logging
import os
import stat

import pytest
from helpers import toy_spec
from precompiled_helpers import build_toy_release, edit_manifest, install_package, set_version, write_pins

from kiln.runtime import build, jit, precompiled, sources
from kiln.runtime.files import UntrustedPath
from kiln.runtime.toolchain import ToolchainError
from kiln.runtime.workspace import Workspace


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(toy sources, staged host artifact set) of one toy module, built once for the module."""
    return build_toy_release(tmp_path_factory.mktemp("toy-release"))


@pytest.fixture
def ws(tmp_path, kiln_env):
    base = tmp_path / "ws"
    kiln_env.set("KILN_WORKSPACE_BASE", str(base))
    jit.clear_memory_cache()
    yield Workspace(base)
    jit.clear_memory_cache()


@pytest.fixture
def installed(release, tmp_path, monkeypatch):
    """The toy release installed as a package on sys.path; returns its package directory."""
    pkg = install_package(release[1], tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    precompiled.installed_packages.cache_clear()
    yield pkg
    precompiled.installed_packages.cache_clear()


@pytest.fixture
def no_compiler(kiln_env):
    kiln_env.set("CXX", "/nonexistent/c++")


@pytest.fixture
def jit_logs(caplog):
    log = logging.getLogger("kiln.jit")
    log.propagate = True
    with caplog.at_level(logging.INFO, logger="kiln.jit"):
        yield caplog
    log.propagate = False


def unique(records):
    """One record may reach caplog through more than one handler (pytest versions differ)."""
    return list({id(r): r for r in records}.values())


def test_a_plan_needs_no_compiler_and_keeps_its_portable_key(release, ws, kiln_env):
    toy = release[0]
    with_compiler = build.plan(toy_spec(toy))
    assert with_compiler.toolchain_problem is None
    kiln_env.set("CXX", "/nonexistent/c++")
    without = build.plan(toy_spec(toy))
    assert "no C++ compiler found" in without.toolchain_problem
    assert without.portable_key == with_compiler.portable_key  # what finds precompiled modules
    assert without.spec_key != with_compiler.spec_key  # the disk cache key names the compiler
    assert "no compiler to check it against" in jit.check(without)[1]
    with pytest.raises(ToolchainError, match="cannot compile toy_module"):
        build.compile_plan(without)


def test_the_portable_key_leaves_out_machine_paths(release, tmp_path):
    toy = release[0]
    a = build.plan(toy_spec(toy), workspace=Workspace(tmp_path / "a"))
    b = build.plan(toy_spec(toy), workspace=Workspace(tmp_path / "b"))
    assert a.spec_key != b.spec_key  # the generated directory is in the flags
    assert a.portable_key == b.portable_key
    assert "cxx" not in a.portable_parts["toolchain"] and "archs" not in a.portable_parts
    assert not any(str(tmp_path) in f for f in a.portable_parts["flags"]["cxx"])
    # kiln's own files are named relative to the source tree, the same in every installation
    assert sources.portable_name(sources.source_root() / "ops" / "norm" / "norm.cuh") == \
        "ops/norm/norm.cuh"


def test_installed_package_serves_the_module_without_a_compiler(release, installed, ws,
                                                                no_compiler, kiln_env):
    kiln_env.set("KILN_DISABLE_JIT", "1")
    hits = jit.stats.precompiled_hits
    assert jit.load(toy_spec(release[0])).answer() == 42
    assert jit.stats.precompiled_hits == hits + 1
    assert not ws.base.exists()  # nothing written anywhere


def test_without_package_or_compiler_the_error_says_what_is_missing(release, ws, no_compiler,
                                                                    kiln_env):
    with pytest.raises(ToolchainError) as e:
        jit.load(toy_spec(release[0]))
    assert "no C++ compiler found" in str(e.value)
    assert "no precompiled package installed" in str(e.value)
    kiln_env.set("KILN_DISABLE_JIT", "1")
    with pytest.raises(jit.JITDisabledError, match="no precompiled module .*no precompiled "
                                                   "package installed.*KILN_ARTIFACT_REPOSITORY unset"):
        jit.load(toy_spec(release[0]))


def test_a_package_for_another_version_is_refused_naming_both(release, installed, ws):
    edit_manifest(installed, lambda d: set_version(d, "0.0.9"))
    with pytest.raises(precompiled.PrecompiledVersionError) as e:
        jit.load(toy_spec(release[0]))
    msg = str(e.value)
    assert f"built for kiln 0.0.9, but this is kiln {sources.kiln_version()}" in msg
    assert f"pip install 'kiln-kernels-precompiled-host=={sources.kiln_version()}'" in msg
    assert "pip uninstall kiln-kernels-precompiled-host" in msg and "KILN_SKIP_VERSION_CHECK" in msg


def test_skip_version_check_loads_it_with_a_warning_on_every_load(release, installed, ws,
                                                                  kiln_env, jit_logs):
    edit_manifest(installed, lambda d: set_version(d, "0.0.9"))
    kiln_env.set("KILN_SKIP_VERSION_CHECK", "1")
    kiln_env.set("KILN_DISABLE_JIT", "1")
    for _ in range(2):
        assert jit.load(toy_spec(release[0])).answer() == 42
        jit.clear_memory_cache()
    warnings = [r for r in unique(jit_logs.records) if "KILN_SKIP_VERSION_CHECK=1" in r.getMessage()]
    assert len(warnings) == 2
    assert "built for kiln 0.0.9 into kiln" in warnings[0].getMessage()


def test_a_module_compiled_from_other_kiln_sources_is_never_served(release, installed, ws,
                                                                   kiln_env):
    """An edited kernel header makes the package's module stale: the JIT builds a fresh one."""
    def compiled_from_another_header(d):
        d["modules"][0]["sources"]["ops/norm/norm.h"] = "0" * 64

    edit_manifest(installed, compiled_from_another_header)
    kiln_env.set("KILN_DISABLE_JIT", "1")
    with pytest.raises(jit.JITDisabledError, match="compiled from another ops/norm/norm.h than "
                                                   "this installation's"):
        jit.load(toy_spec(release[0]))
    kiln_env.unset("KILN_DISABLE_JIT")
    compiled = jit.stats.compiled
    assert jit.load(toy_spec(release[0])).answer() == 42
    assert jit.stats.compiled == compiled + 1


def test_another_key_or_another_module_falls_through_to_the_jit(release, installed, ws,
                                                                kiln_env):
    kiln_env.set("KILN_DISABLE_JIT", "1")
    with pytest.raises(jit.JITDisabledError, match="its key differs in flags"):
        jit.load(toy_spec(release[0], flags=("-DEXTRA=1",)))
    with pytest.raises(jit.JITDisabledError, match="has no toy_other"):
        jit.load(toy_spec(release[0], name="toy_other"))


def test_a_tampered_file_is_refused_unless_checksums_are_off(release, installed, ws, kiln_env,
                                                              jit_logs):
    lib = next(installed.glob("toy_module/*.so"))
    data = lib.read_bytes()
    at = data.index(b"GCC: (") + 5  # the compiler's note in .comment: same size, still loads
    lib.write_bytes(data[:at] + b"X" + data[at + 1:])
    with pytest.raises(precompiled.PrecompiledError, match=r"has SHA-256 \w+, expected \w+ "
                                                           r"\(corrupt or tampered\)"):
        jit.load(toy_spec(release[0]))
    lib.write_bytes(data + b"\0")
    with pytest.raises(precompiled.PrecompiledError, match=r"has \d+ bytes, the manifest says \d+"):
        jit.load(toy_spec(release[0]))
    kiln_env.set("KILN_VERIFY_CHECKSUMS", "0")
    for _ in range(2):
        assert jit.load(toy_spec(release[0])).answer() == 42
        jit.clear_memory_cache()
    warned = [r for r in unique(jit_logs.records) if "without checking its SHA-256" in r.getMessage()]
    assert len(warned) == 2  # on every use


def test_a_package_others_can_write_is_refused(release, installed, ws):
    os.chmod(installed / "toy_module", 0o777)
    try:
        with pytest.raises(UntrustedPath, match=r"writable by other users \(mode 777\)"):
            jit.load(toy_spec(release[0]))
    finally:
        os.chmod(installed / "toy_module", 0o755)


def test_loading_writes_nothing_into_a_read_only_package(release, installed, ws, no_compiler):
    tree = [installed, *installed.rglob("*")]
    for p in tree:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = {str(p): p.stat().st_mtime_ns for p in tree}
    try:
        assert jit.load(toy_spec(release[0])).answer() == 42
        after = {str(p): p.stat().st_mtime_ns for p in [installed, *installed.rglob("*")]}
        assert after == before
    finally:
        for p in tree:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.mark.parametrize("bad", ["../escape.so", "/abs/toy.so", "a/../../b.so", "a\\b.so", "a//b.so"])
def test_a_manifest_naming_a_path_outside_its_package_is_refused(release, installed, ws, bad):
    edit_manifest(installed, lambda d: d["modules"][0].update(file=bad))
    with pytest.raises(precompiled.PrecompiledError, match="is broken.*refusing file name"):
        jit.load(toy_spec(release[0]))


def test_a_module_file_that_is_a_link_is_refused(release, installed, ws, tmp_path):
    lib = next(installed.glob("toy_module/*.so"))
    elsewhere = tmp_path / "elsewhere.so"
    lib.rename(elsewhere)
    lib.symlink_to(elsewhere)  # same bytes, same checksum: only the link check can refuse it
    with pytest.raises(precompiled.PrecompiledError, match="refusing .* it is a symbolic link"):
        jit.load(toy_spec(release[0]))


@pytest.mark.parametrize("toolchain", ["host", "cuda"])
def test_portable_flags_are_the_exact_flags_less_machine_paths(kiln_env, toolchain):
    """The portable parts are computed beside the exact flags; they must not drift apart."""
    from kiln.codegen.specs import module_spec
    from kiln.runtime.arch import ArchContext, parse_arch_list

    kiln_env.set("KILN_JIT_LINEINFO", "1")
    kiln_env.set("KILN_NVCC", "/nonexistent/nvcc")  # flags are known without a compiler
    p = build.plan(module_spec("//ops:norm", {"dtype": "bf16"}, toolchain),
                   ArchContext(parse_arch_list("9.0"), "test"))
    exact = {"cxx": p.cxx_flags, "cuda": p.cuda_flags, "link": p.link_flags}
    for kind, flags in p.portable_parts["flags"].items():
        assert [f for f in exact[kind] if f in flags] == flags, kind
        dropped = [f for f in exact[kind] if f not in flags]
        assert all(f.startswith(("-I", "-isystem", "-L", "-ccbin", "-gencode")) for f in dropped), dropped
    assert ("-lineinfo" in p.portable_parts["flags"]["cuda"]) is (toolchain == "cuda")


def test_an_installed_package_is_checked_against_the_pin_of_its_release(release, installed, ws,
                                                                        kiln_env, tmp_path):
    """Installed packages were checked against their own manifest only, so a consistent re-sign
    of library and manifest loaded. When this kiln pins the package's release, the manifest must
    be the pinned one."""
    kiln_env.set("KILN_DISABLE_JIT", "1")
    pins = write_pins(tmp_path / "pins.json", installed)  # the package as released
    kiln_env.set("KILN_ARTIFACT_PINS", str(pins))
    assert jit.load(toy_spec(release[0])).answer() == 42
    jit.clear_memory_cache()
    # Re-signed: a changed manifest, consistent with itself (keys recomputed) and with its files.
    edit_manifest(installed, lambda d: d.update(created_at=d["created_at"] + 1))
    with pytest.raises(precompiled.PrecompiledError, match=r"this kiln pins release "
                       r"[^ ]+/host/[^ ]+ to [0-9a-f]{64}: the package is not the one released"):
        jit.load(toy_spec(release[0]))
    kiln_env.unset("KILN_ARTIFACT_PINS")  # a release this kiln does not pin: its own manifest
    assert jit.load(toy_spec(release[0])).answer() == 42
