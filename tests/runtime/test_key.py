"""Cache identity: depfile parsing, and a new key whenever sources, headers, flags,
archs, toolchain or version change -- and the same key when nothing did."""

import dataclasses

import pytest
from helpers import make_toy_sources, toy_spec

from kiln.runtime import build, key, sources
from kiln.runtime.arch import ArchContext, ArchFamily, parse_arch_list
from kiln.runtime.spec import CompileSpec, Unit
from kiln.runtime.toolchain import available
from kiln.runtime.workspace import Workspace


def test_parse_depfile_handles_continuations_escapes_and_multiple_rules():
    text = ("a.o: /src/a.cc /inc/one.h \\\n /inc/with\\ space.h\n"
            "b.o : /x/b.h $$dollar.h\n")
    assert key.parse_depfile(text) == ["/src/a.cc", "/inc/one.h", "/inc/with space.h",
                                       "/x/b.h", "$dollar.h"]


def test_dep_changed_detects_content_not_just_mtime(tmp_path):
    f = tmp_path / "h.h"
    f.write_text("one")
    d = key.Dep.of(str(f))
    assert not d.changed()
    f.write_text("two")  # same size, new bytes
    assert d.changed()
    f.write_text("one")  # bytes back, mtime moved: still the same dependency
    assert not d.changed()
    f.unlink()
    assert d.changed()


def test_action_key_depends_on_every_header_digest():
    deps = [key.Dep("/a.h", 1, 1, "aa"), key.Dep("/b.h", 1, 1, "bb")]
    k1 = key.action_key("spec", deps)
    assert k1 == key.action_key("spec", list(reversed(deps)))  # order-independent
    assert k1 != key.action_key("spec", [deps[0], deps[1]._replace(sha256="bc")])
    assert k1 != key.action_key("spec2", deps)


@pytest.fixture
def toy(tmp_path):
    return make_toy_sources(tmp_path / "src")


def _key(spec, ws, **kw):
    return build.plan(spec, workspace=ws, **kw).spec_key


def test_same_inputs_same_key(toy, tmp_path):
    ws = Workspace(tmp_path / "ws")
    assert _key(toy_spec(toy), ws) == _key(toy_spec(toy), ws)
    assert not ws.base.exists()  # planning writes nothing


def test_key_changes_with_sources_flags_params_and_name(toy, tmp_path):
    ws = Workspace(tmp_path / "ws")
    base = _key(toy_spec(toy), ws)
    assert _key(toy_spec(toy, flags=("-DX=1",)), ws) != base
    assert _key(dataclasses.replace(toy_spec(toy), params=(("dtype", "bf16"),)), ws) != base
    assert _key(toy_spec(toy, name="toy_other"), ws) != base
    (toy / "toy.cc").write_text((toy / "toy.cc").read_text() + "\n// edited\n")
    assert _key(toy_spec(toy), ws) != base


def test_key_changes_with_kiln_version(toy, tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws")
    before = _key(toy_spec(toy), ws)
    monkeypatch.setattr(sources, "kiln_version", lambda: "999.0.0")
    assert _key(toy_spec(toy), ws) != before


def test_key_changes_with_the_toolchain_identity(toy, tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws")
    before = _key(toy_spec(toy), ws)
    real = build.host_compiler
    monkeypatch.setattr(build, "host_compiler",
                        lambda: dataclasses.replace(real(), version="g++ 99.0 (pretend)"))
    assert _key(toy_spec(toy), ws) != before


def test_key_changes_with_debug_builds_but_not_with_verbosity(toy, tmp_path, kiln_env):
    ws = Workspace(tmp_path / "ws")
    before = _key(toy_spec(toy), ws)
    kiln_env.set("KILN_JIT_VERBOSE", "1")
    assert _key(toy_spec(toy), ws) == before
    kiln_env.set("KILN_JIT_DEBUG", "1")
    assert _key(toy_spec(toy), ws) != before


def _cuda_spec(tmp_path):
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    return CompileSpec(name="cuda_toy", uri="cuda_toy", toolchain="cuda",
                       units=(Unit("k.cu", "cuda"),), inputs=(tmp_path / "k.cu",),
                       arch_families=(ArchFamily("sm80", ("8.0", "8.6")),
                                      ArchFamily("sm90", ("9.0",))))


@pytest.mark.skipif(not available("cuda"), reason="needs nvcc")
def test_cuda_key_changes_with_archs_and_the_gencode_flags_follow(tmp_path):
    ws = Workspace(tmp_path / "ws")
    spec = _cuda_spec(tmp_path)
    p80 = build.plan(spec, ArchContext(parse_arch_list("8.0"), "t"), ws)
    p90 = build.plan(spec, ArchContext(parse_arch_list("8.0 9.0"), "t"), ws)
    assert p80.spec_key != p90.spec_key
    assert "-gencode=arch=compute_90,code=[sm_90]" in p90.cuda_flags
    assert not any("compute_90" in f for f in p80.cuda_flags)  # never an implicit other family
    assert "nvcc" in p90.key_parts["toolchain"]
