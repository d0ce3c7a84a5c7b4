"""The triton toolchain through the one build-and-load template, with no GPU: cross-compiling for
9.0a and 8.0 (triton.compile with a GPUTarget), the module directory and its metadata, the cache
(a second build compiles nothing, a source edit or a helper edit recompiles only that module, a
faked triton version changes the key), corruption handling (a truncated cubin is rebuilt, never
loaded), KILN_DISABLE_JIT, and N cold processes compiling once. A toy kernel compiles in ~0.5 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from triton_helpers import make_toy_triton, toy_triton_spec

from kiln.runtime import build, jit, metadata, toolchain
from kiln.runtime.arch import ArchContext, ArchError, ArchFamily, parse_arch
from kiln.runtime.triton_module import TritonModule, bundle

pytest.importorskip(
    "triton", reason="the triton toolchain tests need triton==3.6.0 (pip install -e '.[test]')"
)

BOTH = ArchContext.current("8.0;9.0a")


@pytest.fixture
def toy(tmp_path):
    return make_toy_triton(tmp_path / "src")


@pytest.fixture
def ws(tmp_path, kiln_env):
    base = tmp_path / "ws"
    kiln_env.set("KILN_WORKSPACE_BASE", str(base))
    jit.clear_memory_cache()
    yield base
    jit.clear_memory_cache()


def _cubins(key_dir: Path) -> list[str]:
    return sorted(p.name for p in key_dir.glob("*.cubin"))


def test_cross_compiles_for_90a_and_80_with_no_gpu(toy, ws):
    status, p = jit.build(toy_triton_spec(toy), BOTH)
    assert status == "built"
    assert [str(a) for a in p.archs] == ["8.0", "9.0a"]
    md = metadata.read(p.key_dir)
    assert md.toolchain["name"] == "triton"
    assert md.toolchain["triton"]["version"] == "3.6.0"
    assert md.archs == ["8.0", "9.0a"]
    assert md.key_parts["kiln_version"] == md.kiln_version
    assert md.key_parts["inputs"] and all(len(v) == 64 for v in md.key_parts["inputs"].values())
    assert [k["constexprs"] for k in md.key_parts["kernels"]] == [{"BLOCK": 128}] * 2
    # The Python file the kernel imports is a dependency (its digest is in the action key).
    assert [Path(d.path).name for d in md.deps] == ["toy_triton_helper.py"]
    names = _cubins(p.key_dir)
    assert len(names) == 4 and {n.split(".")[-2] for n in names} == {"sm80", "sm90a"}
    library = json.loads((p.key_dir / md.library).read_text())
    for entry, warps in (("toy_add", 4), ("toy_fill", 2)):
        for arch, launch in library["kernels"][entry].items():
            assert launch["name"] == entry and launch["num_warps"] == warps
            assert launch["num_stages"] == 1 and launch["shared"] >= 0
            assert launch["arch"] == {"8.0": "80", "9.0a": "90a"}[arch]
            data = (p.key_dir / launch["cubin"]).read_bytes()
            assert data[:4] == b"\x7fELF" and len(data) == launch["cubin_size"]
    ptx = (p.key_dir / "build" / "toy_add.sm90a.ptx").read_text()
    assert ".target sm_90a" in ptx
    assert library["kernels"]["toy_fill"]["8.0"]["params"] == [
        ["out", "*fp32", 1],
        ["n", "i32", 1],
        ["value", "fp32", 1],
    ]


def test_a_9_0_request_compiles_as_9_0a(toy, ws):
    p = build.plan(toy_triton_spec(toy), ArchContext.current("9.0"))
    assert [str(a) for a in p.archs] == ["9.0a"]


def test_archs_are_restricted_to_the_targets_families(toy, ws):
    spec = toy_triton_spec(toy, families=(ArchFamily("sm90", ("9.0",)),))
    assert [str(a) for a in build.plan(spec, BOTH).archs] == ["9.0a"]
    with pytest.raises(ArchError, match=r"supports none of the requested CUDA archs \[8.0\]"):
        build.plan(spec, ArchContext.current("8.0"))


def test_second_build_compiles_nothing_and_load_reads_the_cubins(toy, ws):
    jit.build(toy_triton_spec(toy), BOTH)
    c0 = jit.stats.compiled
    assert jit.build(toy_triton_spec(toy), BOTH)[0] == "cached"
    m = jit.load(toy_triton_spec(toy), BOTH)
    assert jit.load(toy_triton_spec(toy), BOTH) is m
    assert jit.stats.compiled == c0
    assert isinstance(m, TritonModule) and m.entries == ["toy_add", "toy_fill"]
    assert {(r["kernel"], r["arch"]) for r in m.resources()} == {
        (e, a) for e in ("toy_add", "toy_fill") for a in ("8.0", "9.0a")
    }
    assert m.kernel("toy_fill").params == ["out", "n", "value"]
    with pytest.raises(KeyError, match="has no kernel 'nope'"):
        m.kernel("nope")


def test_nothing_is_written_before_a_miss(toy, ws):
    build.plan(toy_triton_spec(toy), BOTH)
    jit.check(build.plan(toy_triton_spec(toy), BOTH))
    assert not ws.exists()


def test_a_source_edit_recompiles_only_that_module(toy, tmp_path, ws):
    other = make_toy_triton(tmp_path / "other")
    a, b = toy_triton_spec(toy, name="toy_a"), toy_triton_spec(other, name="toy_b")
    pa, pb = jit.build(a, BOTH)[1], jit.build(b, BOTH)[1]
    (toy / "toy_triton.py").write_text((toy / "toy_triton.py").read_text() + "\n# edited\n")
    c0 = jit.stats.compiled
    assert jit.build(b, BOTH)[0] == "cached"
    status, pa2 = jit.build(toy_triton_spec(toy, name="toy_a"), BOTH)
    assert status == "built" and jit.stats.compiled == c0 + 1
    assert pa2.spec_key != pa.spec_key  # the kernel file is an input: a new key
    assert build.plan(b, BOTH).spec_key == pb.spec_key


def test_a_helper_edit_changes_the_action_key(toy, ws):
    spec = toy_triton_spec(toy)
    p = jit.build(spec, BOTH)[1]
    first = metadata.read(p.key_dir)
    (toy / "toy_triton_helper.py").write_text(
        (toy / "toy_triton_helper.py").read_text().replace("constexpr(1)", "constexpr(3)")
    )
    assert jit.verify(p).state == "stale"
    assert jit.build(spec, BOTH)[0] == "built"
    second = metadata.read(p.key_dir)
    assert second.spec_key == first.spec_key and second.action_key != first.action_key
    assert not (p.key_dir / first.library).exists()  # the superseded files are gone
    assert len(_cubins(p.key_dir)) == 4


def test_a_faked_triton_version_changes_the_key(toy, ws, monkeypatch):
    real = build.plan(toy_triton_spec(toy), BOTH)
    monkeypatch.setattr(toolchain, "triton_version", lambda: "3.5.1")
    fake = build.plan(toy_triton_spec(toy), BOTH)
    assert fake.key_parts["toolchain"]["triton"]["version"] == "3.5.1"
    assert fake.spec_key != real.spec_key
    assert fake.portable_key == real.portable_key  # precompiled cubins need no triton to load


def test_a_faked_triton_version_is_refused_by_the_compiler_child(toy, ws, monkeypatch):
    monkeypatch.setattr(toolchain, "triton_version", lambda: "3.5.1")
    with pytest.raises(build.CompileError, match="the plan was made for 3.5.1"):
        jit.build(toy_triton_spec(toy), BOTH)


def test_missing_triton_is_a_clear_error(toy, ws, monkeypatch):
    monkeypatch.setattr(toolchain, "triton_version", lambda: None)
    p = build.plan(toy_triton_spec(toy), BOTH)
    assert "triton is not installed" in p.toolchain_problem
    with pytest.raises(toolchain.ToolchainError, match="triton is not installed"):
        jit.build(toy_triton_spec(toy), BOTH)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_cubin_is_rebuilt_never_loaded(toy, ws, damage):
    p = jit.build(toy_triton_spec(toy), BOTH)[1]
    victim = p.key_dir / _cubins(p.key_dir)[1]
    data = victim.read_bytes()
    victim.write_bytes(
        data[: len(data) // 2] if damage == "truncate" else data[:100] + bytes([data[100] ^ 1]) + data[101:]
    )
    entry = jit.verify(p)
    assert entry.state == "damaged" and victim.name in entry.reason
    jit.clear_memory_cache()
    c0 = jit.stats.compiled
    m = jit.load(toy_triton_spec(toy), BOTH)
    assert jit.stats.compiled == c0 + 1
    assert victim.read_bytes() == data  # rebuilt: the same bytes as the first build
    assert any((p.module_dir / ".quarantine").iterdir())
    assert all(c.data[:4] == b"\x7fELF" for cs in m.cubins.values() for c in cs)


def test_a_cubin_replaced_between_verify_and_load_is_refused(toy, ws):
    p = jit.build(toy_triton_spec(toy), BOTH)[1]
    md = metadata.read(p.key_dir)
    victim = p.key_dir / _cubins(p.key_dir)[0]
    victim.write_bytes(b"\x7fELF" + b"\0" * (victim.stat().st_size - 4))
    with pytest.raises(Exception, match="does not match the digest"):
        TritonModule.from_slot(p.spec.name, p.key_dir, md.library)


def test_disable_jit_refuses_and_names_the_module(toy, ws, kiln_env):
    kiln_env.set("KILN_DISABLE_JIT", "1")
    with pytest.raises(jit.JITDisabledError, match="toy_triton_module.*KILN_DISABLE_JIT=1"):
        jit.load(toy_triton_spec(toy), BOTH)
    assert not ws.exists()


def test_disable_jit_loads_a_built_module(toy, ws, kiln_env):
    jit.build(toy_triton_spec(toy), BOTH)
    jit.clear_memory_cache()
    kiln_env.set("KILN_DISABLE_JIT", "1")
    assert jit.load(toy_triton_spec(toy), BOTH).entries == ["toy_add", "toy_fill"]


def test_no_cache_builds_in_a_temporary_directory(toy, ws, kiln_env):
    kiln_env.set("KILN_NO_CACHE", "1")
    m = jit.load(toy_triton_spec(toy), BOTH)
    assert m.entries == ["toy_add", "toy_fill"] and not (ws / "artifacts").exists()


def test_bundle_round_trips_and_is_checked(toy, ws, tmp_path):
    p = jit.build(toy_triton_spec(toy), BOTH)[1]
    md = metadata.read(p.key_dir)
    data = bundle(p.key_dir, md.library)
    (tmp_path / "b.json").write_bytes(data)
    m = TritonModule.from_bundle(p.spec.name, tmp_path / "b.json")
    assert m.resources() == TritonModule.from_slot(p.spec.name, p.key_dir, md.library).resources()
    d = json.loads(data)
    name = sorted(d["cubins"])[0]
    h, mid = d["cubins"][name], len(d["cubins"][name]) // 2
    d["cubins"][name] = h[:mid] + ("1" if h[mid] == "0" else "0") + h[mid + 1 :]
    (tmp_path / "b.json").write_text(json.dumps(d))
    with pytest.raises(Exception, match="does not match the digest"):
        TritonModule.from_bundle(p.spec.name, tmp_path / "b.json")


def test_a_kernel_error_carries_triton_message_and_the_command(toy, ws):
    src = (toy / "toy_triton.py").read_text()
    assert "m = i < n" in src
    (toy / "toy_triton.py").write_text(src.replace("m = i < n", "m = i < undefined_x", 1))
    with pytest.raises(build.CompileError, match=r"(?s)undefined_x.*kiln.runtime.triton_build"):
        jit.build(toy_triton_spec(toy), BOTH)


def test_n_cold_processes_compile_once(toy, tmp_path):
    go = tmp_path / "go"
    script = (
        "import time, sys; from pathlib import Path\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from triton_helpers import toy_triton_spec\n"
        "from kiln.runtime import jit\nfrom kiln.runtime.arch import ArchContext\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"m = jit.load(toy_triton_spec(Path({str(toy)!r}), name='toy_race'), "
        "ArchContext.current('8.0;9.0a'))\n"
        "print(len(m.resources()), jit.stats.compiled)\n"
    )
    env = dict(
        os.environ,
        KILN_WORKSPACE_BASE=str(tmp_path / "ws"),
        PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(Path(__file__).parent)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    time.sleep(1.0)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = [out.split() for out, _ in outs]
    assert all(r[0] == "4" for r in results)
    assert sum(int(r[1]) for r in results) == 1, results


# ---- launching through the CUDA driver (a GPU) -------------------------------------------------


def _device_ctx():
    import torch

    major, minor = torch.cuda.get_device_capability()
    return ArchContext.current(f"{major}.{minor}")


@pytest.mark.gpu
def test_launch_through_the_driver_matches_torch(toy, ws):
    import torch

    m = jit.load(toy_triton_spec(toy), _device_ctx())
    n = 1000
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.rand(n, device="cuda", generator=g)
    y = torch.rand(n, device="cuda", generator=g)
    out = torch.full((n + 64,), float("nan"), device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        m.kernel("toy_add")(
            ((n + 127) // 128,), x.data_ptr(), y.data_ptr(), out.data_ptr(), n, stream=stream.cuda_stream
        )
    stream.synchronize()
    torch.testing.assert_close(out[:n], x + y, rtol=0, atol=0)
    assert out[n:].isnan().all()  # the mask held
    m.kernel("toy_fill")(((n + 127) // 128,), out.data_ptr(), n, 2.5)
    torch.cuda.synchronize()
    assert (out[:n] == 2.5).all() and out[n:].isnan().all()
    with pytest.raises(TypeError, match="toy_fill takes 3 arguments"):
        m.kernel("toy_fill")((1,), out.data_ptr(), n)


@pytest.mark.gpu
def test_a_module_without_code_for_this_device_says_so(toy, ws):
    import torch

    major, _ = torch.cuda.get_device_capability()
    other = "8.0" if major != 8 else "9.0a"
    m = jit.load(toy_triton_spec(toy), ArchContext.current(other))
    torch.zeros(1, device="cuda")  # a current context
    with pytest.raises(Exception, match="none of which runs on this device"):
        m.kernel("toy_add")((1,), 0, 0, 0, 0)


@pytest.mark.gpu
def test_a_helper_edit_reaches_the_launched_kernel(toy, ws):
    import torch

    spec = toy_triton_spec(toy)
    x = torch.ones(256, device="cuda")
    out = torch.empty_like(x)
    jit.load(spec, _device_ctx()).kernel("toy_add")((2,), x.data_ptr(), x.data_ptr(), out.data_ptr(), 256)
    torch.cuda.synchronize()
    assert (out == 2).all()
    helper = toy / "toy_triton_helper.py"
    helper.write_text(helper.read_text().replace("constexpr(1)", "constexpr(3)"))
    jit.clear_memory_cache()
    jit.load(spec, _device_ctx()).kernel("toy_add")((2,), x.data_ptr(), x.data_ptr(), out.data_ptr(), 256)
    torch.cuda.synchronize()
    assert (out == 4).all()


def test_a_signature_that_does_not_match_the_function_is_refused(toy, ws):
    from kiln.runtime.spec import CompileSpec, TritonKernel, Unit

    spec = toy_triton_spec(toy)
    bad = TritonKernel(
        "toy_fill",
        "toy_triton.py",
        (("out", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr")),
        (("BLOCK", 64),),
    )
    spec = CompileSpec(
        name="toy_bad",
        uri="toy_bad",
        toolchain="triton",
        units=(Unit("toy_triton.py", "triton"),),
        inputs=spec.inputs,
        arch_families=spec.arch_families,
        kernels=(bad,),
    )
    with pytest.raises(
        build.CompileError, match=r"toy_fill takes \(out, n, value, BLOCK\); its signature declares"
    ):
        jit.build(spec, BOTH)


def test_spec_checks():
    from kiln.runtime.spec import CompileSpec, TritonKernel, Unit

    k = TritonKernel("f", "a.py", (("x", "*fp32"),))
    with pytest.raises(ValueError, match="declares no arch families"):
        CompileSpec(
            name="m", uri="m", toolchain="triton", units=(Unit("a.py", "triton"),), inputs=(), kernels=(k,)
        )
    with pytest.raises(ValueError, match="kernels= is for"):
        CompileSpec(
            name="m", uri="m", toolchain="host", units=(Unit("a.cc", "cxx"),), inputs=(), kernels=(k,)
        )
    with pytest.raises(ValueError, match="exactly when constexprs gives its value"):
        TritonKernel("f", "a.py", (("B", "constexpr"),))
    with pytest.raises(ValueError, match="lang 'cxx' is not one of"):
        CompileSpec(
            name="m",
            uri="m",
            toolchain="triton",
            units=(Unit("a.cc", "cxx"),),
            inputs=(),
            arch_families=FAMILIES_ONE,
            kernels=(k,),
        )


FAMILIES_ONE = (ArchFamily("sm90", ("9.0",)),)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"global_scratch_size": 128}, "global/profile scratch"),
        ({"num_ctas": 2}, "clusters"),
        ({"params": [["x", "*fp32"], ["t", "fp16"]]}, "argument t has type fp16"),
    ],
)
def test_kernels_the_launcher_cannot_serve_are_refused_at_load(change, match):
    from kiln.runtime.arch import parse_arch
    from kiln.runtime.triton_module import Cubin, TritonLoadError

    launch = {
        "name": "k",
        "shared": 0,
        "num_warps": 4,
        "num_stages": 1,
        "num_ctas": 1,
        "global_scratch_size": 0,
        "profile_scratch_size": 0,
        "launch_pdl": False,
        "launch_cooperative_grid": False,
        "params": [["x", "*fp32"]],
        "cubin_sha256": "0" * 64,
        **change,
    }
    with pytest.raises(TritonLoadError, match=match):
        TritonModule("m", [Cubin("k", parse_arch("9.0a"), b"", launch)], "here")


def test_the_launcher_packs_arguments_in_the_compiled_order(toy, ws, monkeypatch):
    """The launch path up to cuLaunchKernel with no GPU: the driver call is replaced by one that
    reads back what the launcher passes (function, grid, block, shared bytes, stream and every
    kernel parameter, then the two null scratch pointers)."""
    import ctypes

    from kiln.runtime import triton_module

    m = jit.load(toy_triton_spec(toy), BOTH)
    k = m.kernel("toy_fill")
    cubin = k.cubin_for(parse_arch("9.0"))
    assert str(cubin.arch) == "9.0a" and str(k.cubin_for(parse_arch("8.6")).arch) == "8.0"
    k._functions[4242] = (0xDEAD, cubin)
    monkeypatch.setattr(triton_module, "_ctx_cached", lambda: 4242)
    seen = []

    def fake_launch(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, extra):
        types = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_uint64, ctypes.c_uint64)
        params = [ctypes.cast(argv[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(types)]
        seen.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream, params, extra))
        return 0

    monkeypatch.setitem(triton_module._fast, "launch", fake_launch)
    k((3, 2), 0x1000, 77, 2.5, stream=55)
    k((0,), 0x1000, 77, 2.5)  # an empty grid launches nothing
    assert seen == [(0xDEAD, (3, 2, 1), (64, 1, 1), cubin.shared, 55, [0x1000, 77, 2.5, 0, 0], None)]
    with pytest.raises(TypeError, match=r"toy_fill takes 3 arguments \(out, n, value\), got 2"):
        k((1,), 0x1000, 77)


def test_the_launcher_refuses_a_value_its_type_cannot_hold_and_a_bad_grid(toy, ws, monkeypatch):
    """The argument buffer is packed with one struct.pack_into: a value out of its type's range
    (an i32 past 2^31 - 1, a negative pointer, a float past fp32's range) is a ValueError naming
    the argument, never a launch with a wrapped or infinite value (what ctypes' slots made of
    them); a grid of 4 dimensions is refused (it was cut to 3)."""
    from kiln.runtime import triton_module

    k = jit.load(toy_triton_spec(toy), BOTH).kernel("toy_fill")
    k._functions[4242] = (0xDEAD, k.cubin_for(parse_arch("9.0")))
    monkeypatch.setattr(triton_module, "_ctx_cached", lambda: 4242)
    launched = []
    monkeypatch.setitem(triton_module._fast, "launch", lambda *a: launched.append(a[1:4]) or 0)
    with pytest.raises(ValueError, match=r"toy_fill: argument n = 2147483648 does not fit its type i32"):
        k((1,), 0x1000, 2**31, 1.0)
    with pytest.raises(ValueError, match=r"toy_fill: argument out = -16 does not fit its type \*fp32"):
        k((1,), -16, 7, 1.0)
    with pytest.raises(ValueError, match=r"toy_fill: argument value = 1e\+40 does not fit its type fp32"):
        k((1,), 0x1000, 7, 1e40)  # (ctypes made it inf)
    with pytest.raises(
        ValueError, match=r"toy_fill: grid must have 1, 2 or 3 dimensions, got \(1, 1, 1, 2\)"
    ):
        k((1, 1, 1, 2), 0x1000, 7, 1.0)
    assert launched == []
    k((5, 1, 3), 0x1000, -(2**31), 1.0)  # the range's ends launch, 3-D grids too
    k([4], 0x1000, 2**31 - 1, 1.0)
    assert launched == [(5, 1, 3), (4, 1, 1)]


def test_the_launcher_refuses_an_argument_that_breaks_a_16_hint(toy, ws, monkeypatch):
    from kiln.runtime import triton_module
    from kiln.runtime.spec import CompileSpec, TritonKernel, Unit

    hinted = TritonKernel(
        "toy_fill",
        "toy_triton.py",
        (("out", "*fp32:16"), ("n", "i32:16"), ("value", "fp32"), ("BLOCK", "constexpr")),
        (("BLOCK", 128),),
    )
    spec = CompileSpec(
        name="toy_hinted",
        uri="toy_hinted",
        toolchain="triton",
        units=(Unit("toy_triton.py", "triton"),),
        inputs=(toy / "toy_triton.py",),
        arch_families=FAMILIES_ONE,
        kernels=(hinted,),
    )
    k = jit.load(spec, ArchContext.current("9.0a")).kernel("toy_fill")
    assert [p[2] for p in k.module.cubins["toy_fill"][0].launch["params"]] == [16, 16, 1]
    monkeypatch.setattr(triton_module, "_ctx_cached", lambda: 1)
    k._functions[1] = (1, k.module.cubins["toy_fill"][0])
    monkeypatch.setitem(triton_module._fast, "launch", lambda *a: 0)
    k((1,), 0x1000, 64, 1.0)  # aligned: launched
    with pytest.raises(ValueError, match=r"argument out = 4098 must be a multiple of 16"):
        k((1,), 0x1002, 64, 1.0)
    with pytest.raises(ValueError, match=r"argument n = 65 must be a multiple of 16"):
        k((1,), 0x1000, 65, 1.0)


class _StandInDriver:
    """The driver calls of the launch path, with contexts as the real driver keeps them: a stack
    per thread, empty in a thread that never touched the GPU (the H200 failure: a fresh thread's
    launch found no context). It records which context each module load and launch ran in."""

    PRIMARY = {0: 0x1000, 1: 0x2000}
    DEVICE_OF = {v: k for k, v in PRIMARY.items()}
    INVALID_CONTEXT = 201

    def __init__(self):
        import threading

        self._tls = threading.local()
        self.events = []

    def stack(self) -> list:
        if not hasattr(self._tls, "stack"):
            self._tls.stack = []
        return self._tls.stack

    def current(self) -> int:
        return self.stack()[-1] if self.stack() else 0

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, ref, ordinal):
        ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        dev = getattr(dev, "value", dev)  # (ctypes objects: the real functions convert them)
        self.events.append(("retain", dev))
        ref._obj.value = self.PRIMARY[dev]
        return 0

    def cuCtxGetCurrent(self, ref):
        ref._obj.value = self.current() or None
        return 0

    def cuCtxPushCurrent(self, ctx):
        self.stack().append(ctx)
        return 0

    def cuCtxPopCurrent(self, ref):
        ref._obj.value = self.stack().pop()
        return 0

    def cuCtxGetDevice(self, ref):
        if not self.current():
            return self.INVALID_CONTEXT
        ref._obj.value = self.DEVICE_OF[self.current()]
        return 0

    def cuDeviceGetAttribute(self, ref, attr, dev):
        ref._obj.value = {75: 9, 76: 0}[attr]
        return 0

    def cuModuleLoadData(self, ref, data):
        self.events.append(("load", self.current()))
        ref._obj.value = 0x77
        return 0

    def cuModuleGetFunction(self, ref, mod, name):
        ref._obj.value = 0xF000 + self.current() // 0x1000  # a function is a context's own
        return 0

    def cuFuncSetAttribute(self, fn, attr, value):
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, argv, extra):
        if not self.current() or fn != 0xF000 + self.current() // 0x1000:
            return self.INVALID_CONTEXT  # (the real driver's answer to a function of no context)
        self.events.append(("launch", self.current(), stream))
        return 0

    def cuGetErrorName(self, rc, ref):
        return 0


def test_the_launcher_binds_the_devices_primary_context_in_any_thread(toy, ws, monkeypatch):
    """launcher(..., device=i) from a thread with no current context (and from one with another
    device's) loads and launches in device i's primary context, retained once, and leaves the
    thread's current context as it found it; without device= such a thread gets NoCudaContext.
    The threads run one after another: the stand-in driver is the GPU."""
    import threading

    from kiln.runtime import triton_module
    from kiln.runtime.triton_module import NoCudaContext

    stand = _StandInDriver()
    monkeypatch.setattr(triton_module, "driver", lambda: stand)
    monkeypatch.setattr(triton_module, "_fast", {})
    monkeypatch.setattr(triton_module, "_primaries", {})
    k = jit.load(toy_triton_spec(toy), BOTH).kernel("toy_fill")
    results = {}

    def in_a_thread(name, work):
        def run():
            try:
                results[name] = work()
            except Exception as e:  # noqa: BLE001 - checked below
                results[name] = e

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return results[name]

    def fresh():  # a thread that never touched the GPU, twice
        k((2,), 0x1000, 100, 1.0, stream=7, device=1)
        k((2,), 0x1000, 100, 1.0, stream=7, device=1)
        return list(stand.stack())

    assert in_a_thread("fresh", fresh) == []  # nothing left current
    assert stand.events == [("retain", 1), ("load", 0x2000), ("launch", 0x2000, 7), ("launch", 0x2000, 7)]

    def on_device_0():  # a thread whose current context is device 0's primary
        stand.cuCtxPushCurrent(stand.PRIMARY[0])
        k((1,), 0x1000, 100, 1.0, stream=8, device=1)  # device 1's: bound for the call
        k((1,), 0x1000, 100, 1.0, stream=9, device=0)  # its own: no switch
        return list(stand.stack())

    del stand.events[:]
    assert in_a_thread("dev0", on_device_0) == [0x1000]
    assert stand.events == [("launch", 0x2000, 8), ("retain", 0), ("load", 0x1000), ("launch", 0x1000, 9)]

    err = in_a_thread("none", lambda: k((1,), 0x1000, 100, 1.0))
    assert isinstance(err, NoCudaContext), err
