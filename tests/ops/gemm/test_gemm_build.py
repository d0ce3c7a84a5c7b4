"""Compile-only checks of the //ops/gemm CUDA modules, wherever nvcc is (no GPU needed): each
target built for "8.0 9.0a" imports on this machine (so every kernel partition its table calls is
instantiated in one of its units: gemm_kernels.h), exports what its host module exports, and holds
the instructions its kernels need per arch: wgmma (HGMMA, QGMMA for fp8) only in the sm_90a code,
mma.sync (HMMA) for the sm80 and small-M kernels. tests/runtime/test_cuda_build.py builds every
declared family (sm100, sm120 too)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from helpers import device_error_code

from kiln import _jit
from kiln.codegen.dispatch import specialisation
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import compile_spec
from kiln.runtime import jit, metadata
from kiln.runtime.arch import ArchContext, parse_arch_list
from kiln.runtime.toolchain import available
from kiln.runtime.workspace import Workspace
from release.verify import cuobjdump, dump_sass, nvdisasm

pytestmark = [pytest.mark.skipif(not available("cuda"), reason="needs nvcc"), pytest.mark.slow]

MODULES = [
    ("//ops/gemm:mm", "bf16", torch.bfloat16),
    ("//ops/gemm:fp8", "e4m3", torch.float8_e4m3fn),
    ("//ops/gemm:grouped", "bf16", torch.bfloat16),
    ("//ops/gemm:fp8_grouped", "e4m3", torch.float8_e4m3fn),
]


@pytest.fixture(scope="module", params=MODULES, ids=lambda m: m[0])
def built(request, tmp_path_factory):
    label, dtype, torch_dtype = request.param
    graph = load_graph()
    spec = compile_spec(specialisation(graph.target(label), {"dtype": dtype}), "cuda", graph)
    ctx = ArchContext(parse_arch_list("8.0 9.0a"), "test arch list")
    status, plan = jit.build(spec, ctx, workspace=Workspace(tmp_path_factory.mktemp("gemm")), quiet=True)
    assert status == "built"
    md = metadata.read(plan.key_dir)
    return label, torch_dtype, spec.name, plan.key_dir / md.library


def test_the_cuda_module_imports_and_exports_what_the_host_module_does(built):
    label, torch_dtype, name, library = built
    loader = importlib.util.spec_from_file_location(name, library)
    mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(mod)  # an undefined kernel partition fails here (dlopen RTLD_NOW)
    host = _jit.module(label, torch.device("cpu"), "test", dtype=torch_dtype)
    assert list(mod.tactic_names) == list(host.tactic_names)
    gemm_codes = {device_error_code("gemm", n) for n in (1, 2, 3)}  # ops/gemm/gemm.h
    assert dict(mod.error_texts) == dict(host.error_texts) and set(mod.error_texts) == gemm_codes
    assert mod.max_tactics == host.max_tactics and mod.scale_block == 128


def _sass_by_arch(library) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    arch = None
    for line in dump_sass(library).splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
        elif arch:
            out.setdefault(arch, []).append(line)
    return {a: "\n".join(lines) for a, lines in out.items()}


@pytest.mark.skipif(not (cuobjdump() and nvdisasm()), reason="needs cuobjdump and nvdisasm")
def test_each_arch_holds_the_instructions_of_its_kernels(built):
    label, _, _, library = built
    sass = _sass_by_arch(library)
    assert set(sass) == {"sm_80", "sm_90a"}
    wgmma = "QGMMA" if label.endswith((":fp8", ":fp8_grouped")) else "HGMMA"
    assert sass["sm_90a"].count(wgmma) > 0  # the TMA + wgmma kernels
    assert "GMMA" not in sass["sm_80"]  # there, the sm90 kernels are trap stubs
    if label.endswith(":mm"):
        assert "HMMA.16816.F32.BF16" in sass["sm_80"] and "HMMA.16816.F32.BF16" in sass["sm_90a"]
        assert "LDGSTS" in sass["sm_80"]  # the cp.async pipelines of the sm80 and small-M kernels
