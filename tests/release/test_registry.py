"""The registry of what ships precompiled: `release=` on op_library, validated when the
BUILD file loads, expanded like the dispatch matrix, and shown by `python -m codegen query`."""

import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

from kiln.codegen.dispatch import released
from kiln.codegen.graph import load_graph
from kiln.codegen.rules import BuildFileError

WORKSPACE = textwrap.dedent("""
    BUILD_ROOTS = ("ops",)
    ARCH_FAMILIES = {"sm80": {"archs": ("8.0",)}}
    AXIS_TABLES = {"dtype": {"f16": "kiln::f16_t", "bf16": "kiln::bf16_t"}}
    TOOLCHAINS = {}
""")


def graph_with(tmp_path, release: str):
    (tmp_path / "WORKSPACE.py").write_text(WORKSPACE)
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "BUILD.py").write_text(
        'op_library(name="attn", host_srcs=["a.cc"], binding="b.cc",\n'
        '           dispatch={"dtype": ["f16", "bf16"], "head_dim": [64, 128]},\n'
        '           exclude=[unsupported({"dtype": "f16", "head_dim": 128}, "not in this test")],\n'
        f'           {release})\n')
    return load_graph(tmp_path)


def uris(graph):
    return [s.uri for s in released(graph.target("//ops:attn"))]


def test_release_all_ships_every_supported_specialisation(tmp_path):
    assert uris(graph_with(tmp_path, 'release="all"')) == [
        "attn_dtype_f16_head_dim_64", "attn_dtype_bf16_head_dim_64", "attn_dtype_bf16_head_dim_128"]


def test_a_selection_ships_only_what_it_names(tmp_path):
    assert uris(graph_with(tmp_path, 'release={"head_dim": [128]}')) == [
        "attn_dtype_bf16_head_dim_128"]  # f16 x 128 is excluded, so it never ships


def test_without_release_nothing_ships(tmp_path):
    assert uris(graph_with(tmp_path, 'doc="no release"')) == []


@pytest.mark.parametrize("release,match", [
    ('release={"head": [64]}', "release= names axis 'head'; the dispatch axes are dtype, head_dim"),
    ('release={"dtype": ["f32"]}', "release= names dtype=f32; dtype takes f16, bf16"),
    ('release="everything"', 'release= takes "all", '),
    ('release={}', 'release= takes "all", '),
])
def test_an_invalid_release_is_rejected_naming_the_file(tmp_path, release, match):
    with pytest.raises(BuildFileError, match=match) as e:
        graph_with(tmp_path, release)
    assert "BUILD.py" in str(e.value)


def test_norm_ships_every_dtype_and_query_says_so():
    assert [s.uri for s in released(load_graph().target("//ops:norm"))] == [
        "norm_dtype_f32", "norm_dtype_f16", "norm_dtype_bf16"]
    out = subprocess.run([sys.executable, "-m", "codegen", "query", "//ops:norm", "--specs"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "release        3 specialisation(s) ship precompiled" in out
    assert "norm_dtype_bf16_cuda, norm_dtype_bf16_host  [release]" in out
