"""Compile-only CUDA builds for every arch family each target declares: they run wherever nvcc
exists, GPU or not, and check the SASS of each arch landed in the module, and that a target's
module holds only its own kernels (no wgmma code outside the prefill target)."""

import subprocess

import pytest

from kiln.codegen.dispatch import specialisation
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import arch_families, compile_spec
from kiln.runtime import jit, metadata
from kiln.runtime.arch import ArchContext, parse_arch_list
from kiln.runtime.toolchain import available
from kiln.runtime.workspace import Workspace
from release.verify import cuobjdump, dump_sass, nvdisasm  # PATH, the toolkit, or the test extra

pytestmark = pytest.mark.skipif(not available("cuda"), reason="needs nvcc")


# One specialisation of every CUDA target of the graph: bf16, head_dim 128, no soft-cap where the
# target has those axes.
PREFERRED = {"dtype": "bf16", "kv_dtype": "bf16", "head_dim": "128", "soft_cap": "false"}
TARGETS = [t.label for t in load_graph().targets if "cuda" in t.toolchains]


def _params(target, **chosen) -> dict:
    preferred = {**PREFERRED, **chosen}
    return {axis: preferred.get(axis, values[0]) if preferred.get(axis) in values else values[0]
            for axis, values in target.axes.items()}


def _build(tmp_path, label: str, archs: str, **chosen):
    graph = load_graph()
    target = graph.target(label)
    spec = compile_spec(specialisation(target, _params(target, **chosen)), "cuda", graph)
    ctx = ArchContext(parse_arch_list(archs), f"test arch list {archs!r}")
    status, plan = jit.build(spec, ctx, workspace=Workspace(tmp_path), quiet=True)
    assert status == "built"
    md = metadata.read(plan.key_dir)
    return md, plan.key_dir / md.library


def test_every_cuda_target_is_covered():
    assert {"//ops:norm", "//ops/attention:decode", "//ops/attention:prefill",
            "//ops/attention:cascade", "//ops/attention:page", "//ops/gemm:mm", "//ops/gemm:fp8",
            "//ops/gemm:grouped"} <= set(TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize("label", TARGETS)
def test_every_declared_family_compiles(tmp_path, label):
    graph = load_graph()
    target = graph.target(label)
    # The first arch of every family the target declares, in the variant the family needs.
    archs = " ".join(f.archs[0] + ("a" if f.arch_specific else "")
                     for f in arch_families(graph, target))
    md, lib = _build(tmp_path, label, archs)
    assert sorted(md.archs) == sorted(str(a) for a in parse_arch_list(archs))
    # Every kiln entry point the binding calls is defined in the module: an undefined one (a
    # declaration in <family>.h with no definition in the CUDA units) only shows when a GPU
    # machine loads it, so it is checked here, where the CUDA module is built without one.
    assert _undefined_kiln_symbols(lib) == [], f"{label}: undefined in {lib.name}"
    if cuobjdump():
        listing = subprocess.run([cuobjdump(), "--list-elf", str(lib)], capture_output=True,
                                 text=True, check=True).stdout
        for a in parse_arch_list(archs):
            assert f".sm_{a.sm}." in listing, listing


@pytest.mark.parametrize("label", ["//ops/attention:decode", "//ops/attention:page"])
def test_fp8_kv_cache_modules_compile(tmp_path, label):
    """The fp8 E4M3 cache variants compile for sm80 (a software E4M3 -> f16 conversion) and sm90
    (the hardware one), with no kiln:: symbol left undefined."""
    md, lib = _build(tmp_path, label, "8.0 9.0", kv_dtype="e4m3")
    assert "kv_dtype_e4m3" in md.library
    assert _undefined_kiln_symbols(lib) == []


def _undefined_kiln_symbols(lib) -> list[str]:
    dynamic = subprocess.run(["nm", "-D", "--undefined-only", "-C", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    return [line.split(None, 1)[-1] for line in dynamic.splitlines() if "kiln::" in line]


def test_the_undefined_symbol_check_can_fail(tmp_path):
    """A shared library that calls a kiln:: function it does not define is caught."""
    src = tmp_path / "lib.cc"
    src.write_text("namespace kiln { int missing(int); }\nint use(int x) { return kiln::missing(x); }\n")
    lib = tmp_path / "lib.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert _undefined_kiln_symbols(lib) == ["kiln::missing(int)"]


def _hgmma_count(lib) -> int:
    return dump_sass(lib).count("HGMMA")


_SASS = pytest.mark.skipif(not (cuobjdump() and nvdisasm()), reason="needs cuobjdump and nvdisasm")


@_SASS
@pytest.mark.parametrize("label", ["//ops/attention:cascade", "//ops/attention:decode",
                                   "//ops/attention:page"])
def test_targets_other_than_prefill_compile_no_wgmma_for_9_0a(tmp_path, label):
    """Each target compiles only its own kernels: asked for 9.0a, the merge, decode and append
    modules hold no wgmma (HGMMA) instruction; only //ops/attention:prefill does."""
    md, lib = _build(tmp_path, label, "9.0a")
    assert md.archs == ["9.0a"]
    assert _hgmma_count(lib) == 0


@pytest.mark.slow
@_SASS
def test_the_prefill_target_holds_the_wgmma_kernel(tmp_path):
    """The check above can fail: the prefill module built for 9.0a does contain HGMMA."""
    md, lib = _build(tmp_path, "//ops/attention:prefill", "9.0a")
    assert _hgmma_count(lib) > 0
