"""KILN_JIT_ASAN=1: host modules compiled and linked with AddressSanitizer, a build with its own
cache key; an out-of-bounds write in an instrumented module is reported (the child exits non-zero
with "AddressSanitizer" on stderr); loading one without the ASan runtime is a clear error instead
of an abort; and an ASan build of //ops:norm loads and runs under the preloaded runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_poke_source, run_asan_python, toy_spec

from kiln.codegen.graph import load_graph
from kiln.codegen.specs import module_spec
from kiln.runtime import build, jit, metadata
from kiln.runtime.workspace import Workspace

ASAN = load_graph().workspace["TOOLCHAINS"]["host"]["asan_flags"]


def test_the_switch_adds_the_flags_to_host_modules_and_has_its_own_key(kiln_env, tmp_path):
    ws = Workspace(tmp_path / "ws")
    plain = module_spec("//ops:norm", {"dtype": "f32"}, "host")
    kiln_env.set("KILN_JIT_ASAN", "1")
    asan = module_spec("//ops:norm", {"dtype": "f32"}, "host")
    assert {"-fsanitize=address", "-fno-omit-frame-pointer"} <= set(asan.cxx_flags) & set(asan.ldflags)
    assert not {"-fsanitize=address"} & set(plain.cxx_flags + plain.ldflags)
    assert build.plan(asan, workspace=ws).key_parts["env"]["KILN_JIT_ASAN"] is True
    kiln_env.unset("KILN_JIT_ASAN")
    plain_key = build.plan(plain, workspace=ws).spec_key
    kiln_env.set("KILN_JIT_ASAN", "1")
    assert build.plan(asan, workspace=ws).spec_key != plain_key
    cuda = module_spec("//ops:norm", {"dtype": "f32"}, "cuda")  # stays unsanitised
    assert "-fsanitize=address" not in cuda.cxx_flags + cuda.ldflags + cuda.cuda_flags


def test_loading_an_asan_module_without_its_runtime_is_a_clear_error(kiln_env, tmp_path):
    kiln_env.set("KILN_WORKSPACE_BASE", str(tmp_path / "ws"))
    spec = toy_spec(make_poke_source(tmp_path / "src"), name="toy_poke", units=("poke.cc",),
                    flags=ASAN, ldflags=ASAN)
    with pytest.raises(jit.SanitizerRuntimeError, match=r"built with AddressSanitizer.*"
                       r"LD_PRELOAD=\"\$\(c\+\+ -print-file-name=libasan.so\)"):
        jit.load(spec)  # this process has no ASan runtime: loading would abort it
    p = build.plan(spec)
    assert "-fsanitize=address" in metadata.read(p.key_dir).key_parts["flags"]["link"]


POKE = """
from pathlib import Path
from helpers import toy_spec
from kiln.runtime import jit
spec = toy_spec(Path({src!r}), name="toy_poke", units=("poke.cc",), flags={asan!r}, ldflags={asan!r})
m = jit.load(spec)
print("in bounds", m.poke(7), flush=True)
m.poke({index})
print("not reported")
"""


def test_an_out_of_bounds_write_in_an_asan_toy_is_reported(tmp_path):
    src = make_poke_source(tmp_path / "src")
    env = {"KILN_WORKSPACE_BASE": str(tmp_path / "ws")}
    proc = run_asan_python(POKE.format(src=str(src), asan=ASAN, index=8), env=env)
    assert "in bounds 0" in proc.stdout  # the module loaded and ran under the runtime
    assert proc.returncode != 0 and "not reported" not in proc.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in proc.stderr and "WRITE of size 4" in proc.stderr
    clean = run_asan_python(POKE.format(src=str(src), asan=ASAN, index=0), env=env)
    assert clean.returncode == 0 and "not reported" in clean.stdout, clean.stderr


NORM = """
import torch, kiln
from kiln.runtime import jit
x = torch.randn(33, 257, dtype=torch.float32)
w = torch.randn(257, dtype=torch.float32)
y = kiln.rmsnorm(x, w, eps=1e-6)
ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
print("close", torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5), "compiled", jit.stats.compiled)
"""


@pytest.mark.slow
def test_an_asan_host_build_of_norm_loads_and_runs(tmp_path):
    ws = tmp_path / "ws"
    proc = run_asan_python(NORM, env={"KILN_WORKSPACE_BASE": str(ws), "KILN_JIT_ASAN": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "close True compiled 1" in proc.stdout
    libs = list(Path(ws, "artifacts").glob("norm_dtype_f32_host/*/norm_dtype_f32_host.*.so"))
    assert len(libs) == 1 and b"__asan_report_store" in libs[0].read_bytes()  # instrumented
