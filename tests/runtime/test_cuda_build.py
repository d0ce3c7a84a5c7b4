"""Compile-only CUDA builds for every arch family the build graph declares (R4.6): they run
wherever nvcc exists, GPU or not, and check the SASS of each arch landed in the module."""

import subprocess

import pytest

from kiln.codegen.dispatch import specialisation
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import arch_families, compile_spec
from kiln.runtime import jit, metadata
from kiln.runtime.arch import ArchContext, parse_arch_list
from kiln.runtime.toolchain import available
from kiln.runtime.workspace import Workspace
from release.verify import cuobjdump  # PATH, the CUDA toolkit, or the test extra's wheel

pytestmark = pytest.mark.skipif(not available("cuda"), reason="needs nvcc")


@pytest.mark.slow
@pytest.mark.parametrize("label,params", [
    ("//ops:norm", {"dtype": "bf16"}),
    ("//ops:attention", {"dtype": "bf16", "head_dim": 128, "soft_cap": False}),
], ids=["norm", "attention"])
def test_every_declared_family_compiles(tmp_path, label, params):
    graph = load_graph()
    target = graph.target(label)
    # The first arch of every family the target declares, in the variant the family needs.
    archs = " ".join(f.archs[0] + ("a" if f.arch_specific else "")
                     for f in arch_families(graph, target))
    spec = compile_spec(specialisation(target, params), "cuda", graph)
    ctx = ArchContext(parse_arch_list(archs), f"test arch list {archs!r}")
    status, plan = jit.build(spec, ctx, workspace=Workspace(tmp_path), quiet=True)
    assert status == "built"
    md = metadata.read(plan.key_dir)
    assert sorted(md.archs) == sorted(str(a) for a in parse_arch_list(archs))
    lib = plan.key_dir / md.library
    if cuobjdump():
        listing = subprocess.run([cuobjdump(), "--list-elf", str(lib)], capture_output=True,
                                 text=True, check=True).stdout
        for a in parse_arch_list(archs):
            assert f".sm_{a.sm}." in listing, listing
