"""BUILD loading, labels, dispatch expansion, URIs and unsupported combinations."""

import textwrap

import pytest

from kiln.codegen.dispatch import DispatchError, expand, specialisation
from kiln.codegen.graph import LabelError, load_graph
from kiln.codegen.rules import BuildFileError

WORKSPACE = textwrap.dedent("""
    BUILD_ROOTS = ("ops",)
    ARCH_FAMILIES = {"sm80": {"archs": ("8.0",)}, "sm90": {"archs": ("9.0",)}}
    AXIS_TABLES = {"dtype": {"f16": "kiln::f16_t", "bf16": "kiln::bf16_t"}}
    TOOLCHAINS = {}
""")


def make_tree(tmp_path, builds: dict[str, str]):
    (tmp_path / "WORKSPACE.py").write_text(WORKSPACE)
    for rel, text in builds.items():
        path = tmp_path / "ops" / rel / "BUILD.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return load_graph(tmp_path)


ATTN = """
op_library(name="attention", srcs=["a.cu"], host_srcs=["a.cc"], binding="bindings/a.cc",
           dispatch={"dtype": ["f16", "bf16"], "head_dim": [64, 128, 256], "causal": [True, False]},
           exclude=[unsupported({"dtype": "f16", "head_dim": 256}, "no f16 at 256 in this test")],
           archs=["sm80", "sm90a"])
"""
NORM = """
op_library(name="norm", srcs=["n.cu"], host_srcs=["n.cc"], binding="bindings/n.cc",
           dispatch={"dtype": ["f16", "bf16"]}, archs=["sm80", "sm90"])
op_library(name="norm_host_only", host_srcs=["n.cc"], binding="bindings/n.cc")
"""


@pytest.fixture
def graph(tmp_path):
    return make_tree(tmp_path, {"attention": ATTN, "norm": NORM})


def test_labels_resolve(graph):
    assert [t.name for t in graph.resolve("//ops:norm")] == ["norm"]
    assert [t.name for t in graph.resolve("//ops/norm:norm")] == ["norm"]
    assert [t.name for t in graph.resolve("norm")] == ["norm"]
    assert sorted(t.name for t in graph.resolve("//ops/...")) == ["attention", "norm",
                                                                  "norm_host_only"]
    assert sorted(t.name for t in graph.resolve("//ops:all")) == ["attention", "norm",
                                                                  "norm_host_only"]
    assert [t.name for t in graph.resolve("//ops/norm/...")] == ["norm", "norm_host_only"]


@pytest.mark.parametrize("label,near", [("//ops:nrom", "//ops:norm"),
                                        ("//ops:atention", "//ops:attention"),
                                        ("normm", "//ops:norm")])
def test_unknown_labels_list_near_matches(graph, label, near):
    with pytest.raises(LabelError, match=f"did you mean {near}") as e:
        graph.resolve(label)
    assert "Known targets:" in str(e.value)


def test_unknown_label_without_near_match(graph):
    with pytest.raises(LabelError, match="no target matches '//ops:zzzzzz'; Known targets"):
        graph.resolve("//ops:zzzzzz")
    with pytest.raises(LabelError):
        graph.resolve("//nope/...")


def test_toolchains_and_families(graph):
    t = graph.target("//ops:attention")
    assert t.toolchains == ("cuda", "host")
    assert graph.target("//ops:norm_host_only").toolchains == ("host",)
    from kiln.codegen.specs import arch_families

    fams = arch_families(graph, t)
    assert [(f.name, f.arch_specific) for f in fams] == [("sm80", False), ("sm90", True)]


def test_expansion_is_the_product_minus_exclusions_with_readable_uris(graph):
    specs = expand(graph.target("//ops:attention"))
    assert len(specs) == 2 * 3 * 2 - 2
    uris = [s.uri for s in specs]
    assert uris[0] == "attention_dtype_f16_head_dim_64_causal_true"
    assert "attention_dtype_f16_head_dim_256_causal_true" not in uris
    assert len(set(uris)) == len(uris)
    assert specs[0].module_name("cuda") == "attention_dtype_f16_head_dim_64_causal_true_cuda"
    assert expand(graph.target("//ops:attention")) == specs  # deterministic


def test_selection_restricts_and_rejects_unknown_values(graph):
    t = graph.target("//ops:attention")
    assert [s.uri for s in expand(t, {"dtype": ["bf16"], "head_dim": ["128"]})] == [
        "attention_dtype_bf16_head_dim_128_causal_true",
        "attention_dtype_bf16_head_dim_128_causal_false"]
    with pytest.raises(DispatchError, match="head_dim=96 is not supported; head_dim takes 64, 128, 256"):
        expand(t, {"head_dim": ["96"]})
    with pytest.raises(DispatchError, match="has no dispatch axis 'page'"):
        expand(t, {"page": ["16"]})


def test_an_excluded_combination_is_an_error_with_its_reason(graph):
    t = graph.target("//ops:attention")
    with pytest.raises(DispatchError, match="dtype=f16, head_dim=256 is not supported: no f16 at 256"):
        specialisation(t, {"dtype": "f16", "head_dim": 256, "causal": True})
    s = specialisation(t, {"dtype": "bf16", "head_dim": 256, "causal": False})
    assert s.uri == "attention_dtype_bf16_head_dim_256_causal_false"
    with pytest.raises(DispatchError, match="missing \\['causal'\\]"):
        specialisation(t, {"dtype": "bf16", "head_dim": 256})


@pytest.mark.parametrize("build,match", [
    ('op_library(name="Bad", host_srcs=["x.cc"], binding="b.cc")', "name must match"),
    ('op_library(name="x", binding="b.cc")', "needs srcs"),
    ('op_library(name="x", srcs=["x.cu"], binding="b.cc")', "must declare archs"),
    ('op_library(name="x", host_srcs=["x.cc"], binding="b.cc", dispatch={"d": [1, 1]})',
     "distinct values"),
    ('op_library(name="x", srcs=["x.cu"], binding="b.cc", archs=["sm70"])', "unknown arch families"),
    ('op_library(name="x", host_srcs=["x.cc"], binding="b.cc", dispatch={"d": [1]},\n'
     '           exclude=[unsupported({"d": 2}, "r")])', "not in the dispatch"),
])
def test_invalid_build_files_are_rejected_with_the_file_named(tmp_path, build, match):
    with pytest.raises(BuildFileError, match=match) as e:
        make_tree(tmp_path, {"x": build})
    assert "BUILD.py" in str(e.value)


LIBS = {
    "gemm": """
source_library(name="shared", srcs=["dev.cu", "rules.cc"], host_srcs=["rules.cc"], doc="shared units")
op_library(name="mm", srcs=["mm.cu", "dev.cu"], host_srcs=["mm.cc"], binding="bindings/mm.cc",
           deps=[":shared", "//ops/common:util"], archs=["sm80"])
op_library(name="host_only", host_srcs=["h.cc"], binding="bindings/h.cc", deps=[":shared"],
           archs=["sm80"])
""",
    "common": 'source_library(name="util", host_srcs=["util.cc"])',
}


def test_deps_append_a_source_librarys_units_once_each_in_its_order(tmp_path):
    graph = make_tree(tmp_path, LIBS)
    mm = graph.target("//ops/gemm:mm")
    assert mm.deps == (":shared", "//ops/common:util")
    assert mm.srcs == ("mm.cu", "dev.cu", "rules.cc")  # dev.cu listed by the target already
    assert mm.host_srcs == ("mm.cc", "rules.cc", "../common/util.cc")  # from another package
    # a library's CUDA units give a host-only target the CUDA toolchain too
    assert graph.target("//ops/gemm:host_only").toolchains == ("cuda", "host")
    assert [lib.label for lib in graph.libraries] == ["//ops/common:util", "//ops/gemm:shared"]


@pytest.mark.parametrize("build,match", [
    ('op_library(name="x", host_srcs=["x.cc"], binding="b.cc", deps=[":nope"])',
     r"depends on ':nope', which is no source_library \(declared: //ops/x:cuda, //ops/x:lib\)"),
    ('op_library(name="x", host_srcs=["x.cc"], binding="b.cc", deps=":lib")', "deps= takes a list"),
    ('op_library(name="x", host_srcs=["x.cc"], binding="b.cc", deps=[":cuda"])', "must declare archs"),
    ('source_library(name="empty")', "needs srcs"),
    ('op_library(name="lib", host_srcs=["x.cc"], binding="b.cc")', "declared twice"),
])
def test_invalid_source_libraries_and_deps_are_rejected(tmp_path, build, match):
    libs = 'source_library(name="lib", host_srcs=["l.cc"])\nsource_library(name="cuda", srcs=["c.cu"])\n'
    with pytest.raises(BuildFileError, match=match):
        make_tree(tmp_path, {"x": libs + build})


def test_duplicate_labels_are_rejected(tmp_path):
    dup = 'op_library(name="x", host_srcs=["x.cc"], binding="b.cc")'
    with pytest.raises(BuildFileError, match="declared twice"):
        make_tree(tmp_path, {"a": dup + "\n" + dup})


def test_one_name_in_two_packages_is_two_targets_and_the_short_form_is_ambiguous(tmp_path):
    one = 'op_library(name="x", host_srcs=["x.cc"], binding="b.cc")'
    graph = make_tree(tmp_path, {"a": one, "b": one})
    assert [t.label for t in graph.targets] == ["//ops/a:x", "//ops/b:x"]
    assert [s.uri for t in graph.targets for s in expand(t)] == ["a_x", "b_x"]
    with pytest.raises(LabelError, match="ambiguous: //ops/a:x, //ops/b:x"):
        graph.resolve("//ops:x")


def test_the_real_graph_loads_and_every_module_name_is_unique():
    graph = load_graph()
    names = [s.module_name(tc) for t in graph.targets for s in expand(t) for tc in t.toolchains]
    assert names and len(names) == len(set(names))
    assert all(n.isidentifier() for n in names)
    assert graph.target("//ops:norm").axes["dtype"] == ("f32", "f16", "bf16")
