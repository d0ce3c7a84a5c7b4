"""grouped_mm on the triton backend (ops/gemm/grouped_triton.py): the same float64 reference as the
CUDA backend (kiln.trace.gemm.grouped_mm_reference_float), fresh random data, odd sizes, empty
groups, both weight layouts, float32 out, strided views, bad offs. GPU tests are marked `gpu`; the
CPU tests check the API around it (backend=, the host fallback) and that both specialisations
cross-compile for 8.0 and 9.0a with no GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import kiln
from kiln.codegen.graph import load_graph
from kiln.codegen.specs import module_spec
from kiln.runtime import jit, metadata
from kiln.runtime.arch import ArchContext
from kiln.trace import gemm as ref

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
CONFIGS = ["grouped_mm_kmajor_m128n128k64_w8s3", "grouped_mm_kmajor_m16n128k128_w4s4"]  # autotuner tactics
FAST = ["grouped_mm_kmajor", *CONFIGS, "grouped_mm_nmajor"]
TOL = {BF16: (1.6e-2, 1e-2), F16: (2e-3, 2e-3), F32: (1e-5, 1e-5)}
_needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="the triton backend needs triton==3.6.0 (pip install -e '.[test]')",
)


def gpu(test):
    """A GPU test of the triton backend: marked gpu, and skipped where triton is not installed."""
    return pytest.mark.gpu(_needs_triton(test))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(shape, k, dtype, device, g):
    """Uniform in [-1, 1] / sqrt(k): dot products of order 1."""
    return (
        ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) / max(k, 1) ** 0.5)
        .to(dtype)
        .to(device)
    )


def close(out, want, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), want.double().cpu(), rtol=rtol, atol=atol)


def operands(lens, n, k, dtype, device, seed, column_major=True):
    g = gen(seed)
    rows = sum(lens)
    a = rand((rows, k), k, dtype, device, g)
    if column_major:
        b = rand((len(lens), n, k), k, dtype, device, g).transpose(1, 2)
    else:
        b = rand((len(lens), k, n), k, dtype, device, g)
    offs = torch.tensor(lens, dtype=torch.int64).cumsum(0).to(device=device, dtype=torch.int32)
    return a, b, offs


def test_backend_is_checked():
    a, b, offs = operands([3, 2], 8, 16, BF16, "cpu", 1)
    with pytest.raises(ValueError, match="backend must be one of auto, cuda, triton, got 'cutlass'"):
        kiln.grouped_mm(a, b, offs, backend="cutlass")


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto"])
def test_cpu_tensors_run_the_host_backend_whatever_the_backend(backend):
    a, b, offs = operands([5, 0, 9], 24, 40, BF16, "cpu", 2)
    close(
        kiln.grouped_mm(a, b, offs, backend=backend),
        ref.grouped_mm_reference_float(a, b, offs, torch.float64),
        BF16,
    )


def test_the_target_declares_the_triton_toolchain():
    t = load_graph().target("//ops/gemm:grouped")
    assert t.toolchains == ("cuda", "host", "triton")
    assert [k.name or k.entry for k in t.triton_kernels] == [
        "grouped_mm_kernel",
        "grouped_mm_f32_kernel",
        *FAST,
    ]
    assert {k.entry for k in t.triton_kernels} == {"grouped_mm_kernel", "grouped_mm_f32_kernel"}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_both_kernels_cross_compile_for_80_and_90a(dtype):
    """In the session's workspace: the autotuner, CLI and release tests then find these builds."""
    pytest.importorskip("triton", reason="cross-compiling needs triton==3.6.0 (pip install -e '.[test]')")
    spec = module_spec("//ops/gemm:grouped", {"dtype": dtype}, "triton")
    status, p = jit.build(spec, ArchContext.current("8.0;9.0a"))
    assert status in ("built", "cached")
    md = metadata.read(p.key_dir)
    library = json.loads((p.key_dir / md.library).read_text())
    want_ty = {"bf16": "*bf16", "f16": "*fp16"}[dtype]
    for entry, out_ty in (("grouped_mm_kernel", want_ty), ("grouped_mm_f32_kernel", "*fp32")):
        assert sorted(library["kernels"][entry]) == ["8.0", "9.0a"]
        for launch in library["kernels"][entry].values():
            params = {p[0]: p[1] for p in launch["params"]}
            assert params["a"] == want_ty and params["out"] == out_ty and params["offs"] == "*i32"
            assert launch["constexprs"] == {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64}
            assert 0 < launch["shared"] <= 227 * 1024 and launch["num_warps"] == 4
            assert launch["global_scratch_size"] == 0
    for name in FAST:  # unit strides as constexprs, ":16" hints recorded for the launcher to check
        for launch in library["kernels"][name].values():
            params = {p[0]: p[2] for p in launch["params"]}
            unit = {"stride_ak", "stride_on", "stride_bk" if "kmajor" in name else "stride_bn"}
            assert unit.isdisjoint(params) and all(launch["constexprs"][s] == 1 for s in unit)
            assert params["a"] == params["b"] == params["out"] == params["stride_am"] == 16
            assert params["k" if "kmajor" in name else "n"] == 16 and params["rows"] == 1
            assert launch["shared"] > 24576  # pipelined: more than one stage of its tiles
    assert jit.build(spec, ArchContext.current("8.0;9.0a"))[0] == "cached"


# ---- on the GPU --------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("lens", [[0, 0, 0], [1, 1], [17, 0, 250, 3, 0], [300], [64, 65, 63, 1]], ids=str)
@pytest.mark.parametrize("column_major", [True, False])
def test_grouped_mm_triton_matches_the_reference(dtype, lens, column_major):
    a, b, offs = operands(lens, 56, 72, dtype, "cuda", len(lens) + sum(lens), column_major)
    want = ref.grouped_mm_reference_float(a, b, offs, torch.float64)
    out = kiln.grouped_mm(a, b, offs, backend="triton")
    assert out.shape == (sum(lens), 56) and out.dtype == dtype
    close(out, want, dtype)
    close(kiln.grouped_mm(a, b, offs, out_dtype=F32, backend="triton"), want, F32)


@gpu
@pytest.mark.parametrize("n,k", [(1, 1), (129, 65), (300, 200), (24, 0), (512, 4096)])
def test_grouped_mm_triton_odd_sizes(n, k):
    a, b, offs = operands([3, 70, 0, 129], n, k, BF16, "cuda", n + k)
    close(
        kiln.grouped_mm(a, b, offs, backend="triton"),
        ref.grouped_mm_reference_float(a, b, offs, torch.float64),
        BF16,
    )


@gpu
def test_grouped_mm_triton_agrees_with_the_cuda_backend_and_torch():
    a, b, offs = operands([40, 0, 300, 7, 128, 1, 90, 33], 384, 256, BF16, "cuda", 7)
    tri = kiln.grouped_mm(a, b, offs, backend="triton")
    cuda = kiln.grouped_mm(a, b, offs, backend="cuda")
    close(tri, cuda.float(), BF16)
    if hasattr(torch, "_grouped_mm"):
        try:
            theirs = torch._grouped_mm(a, b, offs=offs)
        except RuntimeError as e:  # torch's kernel needs sm90 and aligned sizes
            pytest.skip(f"torch._grouped_mm refuses this input here: {e}")
        close(tri, theirs.float(), BF16)


@gpu
def test_grouped_mm_triton_strided_views_and_out():
    g = gen(11)
    big = rand((50, 2 * 48), 48, BF16, "cuda", g)
    a = big[:, ::2]  # non-unit column stride
    b = rand((3, 48, 40), 48, BF16, "cuda", g)
    offs = torch.tensor([10, 30, 45], dtype=torch.int32, device="cuda")
    out = torch.full((50, 40), float("nan"), dtype=BF16, device="cuda")
    kiln.grouped_mm(a, b, offs, out=out, backend="triton")
    close(out[:45], ref.grouped_mm_reference_float(a, b, offs, torch.float64)[:45], BF16)
    assert out[45:].isnan().all()  # rows past offs[-1] are not written
    offs64 = offs.to(torch.int64)
    close(kiln.grouped_mm(a, b, offs64, backend="triton")[:45], out[:45].float(), BF16)


@gpu
def test_grouped_mm_triton_bad_offs_never_leave_the_tensors(kiln_env):
    a, b, _ = operands([8, 8], 32, 32, BF16, "cuda", 3)
    for bad in ([20, 16], [12, 100], [-5, 16]):
        offs = torch.tensor(bad, dtype=torch.int32, device="cuda")
        out = torch.full((16, 32), float("nan"), dtype=BF16, device="cuda")
        kiln.grouped_mm(a, b, offs, out=out, backend="triton")  # clamped: no fault
        torch.cuda.synchronize()
        clamped = torch.tensor(bad).clamp(min=0).cummax(0).values.clamp(max=16)
        close(
            out[: int(clamped[-1])],
            ref.grouped_mm_reference_float(a, b, clamped, torch.float64)[: int(clamped[-1])],
            BF16,
        )
    kiln_env.set("KILN_VALIDATE_INDICES", "1")
    with pytest.raises(IndexError, match=r"offs\[1\] = 100 is out of range.*rows = 16"):
        kiln.grouped_mm(a, b, torch.tensor([12, 100], dtype=torch.int32, device="cuda"), backend="triton")
    with pytest.raises(IndexError, match=r"offs\[1\] = 3 is out of range"):
        kiln.grouped_mm(a, b, torch.tensor([5, 3], dtype=torch.int32, device="cuda"), backend="triton")


@gpu
def test_grouped_mm_triton_under_torch_compile():
    a, b, offs = operands([30, 2, 64], 64, 64, BF16, "cuda", 5)
    f = torch.compile(lambda a, b, o: kiln.grouped_mm(a, b, o, backend="triton"), fullgraph=True)
    close(f(a, b, offs), ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)


@pytest.mark.parametrize("validate", [False, True])
def test_torch_compile_fullgraph_reaches_the_triton_custom_op_on_cuda_tensors(validate, kiln_env):
    """torch.compile(fullgraph=True) over grouped_mm(backend="triton") with no GPU: dynamo traces
    fake CUDA tensors, and the graph must hold the one custom op kiln::grouped_gemm_triton (run
    here as its fake implementation) with nothing of the launch path traced. The environment is
    unread when the trace starts (reading it takes a lock, which dynamo cannot trace: the H200
    failure), and KILN_VALIDATE_INDICES=1 (its host check of offs is a sync) must not break the
    graph either: both are read inside the op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, offs = operands([3, 0, 5], 8, 16, BF16, "cpu", 21)
    kiln.grouped_mm(a, b, offs, backend="triton")  # imports whatever the call imports lazily
    if validate:
        kiln_env.set("KILN_VALIDATE_INDICES", "1")
    kiln.runtime.env.reload()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(
        lambda a, b, o: kiln.grouped_mm(a, b, o, backend="triton"), fullgraph=True, backend=capture
    )
    with FakeTensorMode():
        fa = torch.empty(96, 64, dtype=BF16, device="cuda")
        fb = torch.empty(3, 128, 64, dtype=BF16, device="cuda").transpose(1, 2)
        fo = torch.empty(3, dtype=torch.int64, device="cuda")
        got = f(fa, fb, fo)
    torch._dynamo.reset()
    assert got.shape == (96, 128) and got.device.type == "cuda" and got.dtype == BF16
    (gm,) = graphs
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    ops = [t for t in calls if isinstance(t, torch._ops.OpOverload) and t.namespace == "kiln"]
    assert ops == [torch.ops.kiln.grouped_gemm_triton.default], calls


def test_the_triton_op_checks_offs_under_validate_indices(kiln_env, monkeypatch):
    """KILN_VALIDATE_INDICES=1 is honoured inside the custom op: a bad offs is an IndexError naming
    the entry (the caller's int64 value, not its int32 copy) before any module lookup."""
    from kiln import gemm

    def no_lookup(*args, **kwargs):
        raise AssertionError("the module was looked up before offs were checked")

    monkeypatch.setattr(gemm._jit, "triton_module", no_lookup)
    kiln_env.set("KILN_VALIDATE_INDICES", "1")
    a, b, _ = operands([4, 4], 8, 16, BF16, "cpu", 22)
    out = torch.empty(8, 8, dtype=BF16)
    bounds = torch.tensor([4, 2**31 + 3], dtype=torch.int64)
    offs32 = bounds.clamp(-1, 2**31 - 1).to(torch.int32)
    with pytest.raises(IndexError, match=r"offs\[1\] = 2147483651 is out of range"):
        gemm._grouped_triton_op.eager(out, a, b, offs32, bounds)


def test_the_kernels_logic_under_tritons_cpu_interpreter():
    """The grouped kernel itself, run by Triton's interpreter on the CPU (float32): group lookup,
    tiles, masks and the clamping of bad offs, against the float64 reference."""
    pytest.importorskip("triton", reason="the interpreter is part of triton==3.6.0")
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    root = here.parents[2]
    proc = subprocess.run(
        [sys.executable, str(here / "grouped_triton_interpret.py"), str(root / "ops" / "gemm"), "1234"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(lines) == 18 and {r["scan"] for r in lines} == {256, 2}  # the vector scan and the scalar walk
    for r in lines:
        assert r["max_abs_err"] < 1e-4 and not r["nan"], r
        assert r.get("untouched", True), r


# ---- the autotuner's tactics: the configs of grouped_mm_kernel ---------------------------------


def test_the_configs_are_the_autotuners_tactics_and_the_blocklist_applies(tmp_path, kiln_env):
    pytest.importorskip("triton", reason="cross-compiling needs triton==3.6.0 (pip install -e '.[test]')")
    from kiln import autotuner, gemm

    spec = module_spec("//ops/gemm:grouped", {"dtype": "bf16"}, "triton")
    mod = jit.load(spec, ArchContext.current("8.0;9.0a"))
    tactics = gemm._TritonTactics(mod, torch.device("cpu"), BF16)
    assert tactics.tactic_names == ("grouped_mm_kmajor", *sorted(CONFIGS))
    assert [k.constexprs["BLOCK_M"] for k in tactics.kernels] == [64, 128, 16]
    blocklist = tmp_path / "blocklist.json"
    blocklist.write_text(
        json.dumps(
            {
                "format": "kiln-tactic-blocklist",
                "version": 1,
                "blocked": [{"tactic": "grouped_mm_kmajor_m128*", "op": "grouped_triton", "why": "test"}],
            }
        )
    )
    kiln_env.set("KILN_TACTIC_BLOCKLIST", str(blocklist))
    assert autotuner.blocked_mask(tactics, "grouped_triton", torch.device("cpu")) == 0b010
    other = gemm._TritonTactics(mod, torch.device("cpu"), BF16)  # (masks are cached per module)
    assert autotuner.blocked_mask(other, "grouped", torch.device("cpu")) == 0  # another op's rule


@gpu
@pytest.mark.parametrize("config", range(3))
def test_every_config_matches_the_reference(config):
    from kiln import gemm

    a, b, offs = operands([17, 0, 250, 3, 0, 64], 208, 144, BF16, "cuda", 40 + config)
    kiln.grouped_mm(a, b, offs, backend="triton")  # loads the module
    mod = kiln._jit.triton_module("//ops/gemm:grouped", a.device, "test", dtype=BF16)
    tactics = gemm._triton_tactics[id(mod)]
    out = torch.full((a.shape[0], 208), float("nan"), dtype=BF16, device="cuda")
    assert gemm._fast_layout(out, a, b) == "kmajor"
    gemm._launch_triton(tactics.kernels[config], out, a, b, offs)
    close(out, ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)


@gpu
def test_tuning_records_a_triton_config_and_reuses_it(tmp_path):
    a, b, offs = operands([300, 7, 128, 1, 90], 256, 256, BF16, "cuda", 9)
    cache = tmp_path / "tactics.json"
    with kiln.autotune(cache=str(cache)):
        out = kiln.grouped_mm(a, b, offs, backend="triton")
    close(out, ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)
    entries = json.loads(cache.read_text())["entries"]
    (entry,) = [e for e in entries.values() if e["op"] == "grouped_triton"]
    assert entry["tactic"] in ("grouped_mm_kmajor", *CONFIGS)
    assert set(entry["timings_us"]) == {"grouped_mm_kmajor", *CONFIGS}  # every config was timed
    assert entry["default"] == "grouped_mm_kmajor"
    with kiln.autotune(False, cache=str(cache)):
        close(
            kiln.grouped_mm(a, b, offs, backend="triton"),
            ref.grouped_mm_reference_float(a, b, offs, torch.float64),
            BF16,
        )


@gpu
@pytest.mark.parametrize("case", ["kmajor", "nmajor", "odd_k", "odd_n_nmajor", "misaligned", "strided_a"])
def test_each_kernel_variant_is_chosen_and_matches_the_reference(case):
    from kiln import gemm

    lens, n, k = [40, 0, 300, 7, 129], 256, 192
    if case == "odd_k":
        k = 200
    if case == "odd_n_nmajor":
        n = 200
    a, b, offs = operands(lens, n, k, BF16, "cuda", 77, column_major=case not in ("nmajor", "odd_n_nmajor"))
    if case == "misaligned":  # a's data 2 bytes past an aligned address
        a = torch.cat([torch.zeros(1, dtype=BF16, device="cuda"), a.flatten()])[1:].view(a.shape)
    if case == "strided_a":
        a = torch.cat([a, a], dim=1)[:, :k]  # row stride 2k, still aligned: kmajor
    out = torch.full((sum(lens), n), float("nan"), dtype=BF16, device="cuda")
    want = {"kmajor": "kmajor", "nmajor": "nmajor", "strided_a": "kmajor"}.get(case)
    assert gemm._fast_layout(out, a, b) == want
    kiln.grouped_mm(a, b, offs, out=out, backend="triton")
    close(out, ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)


@gpu
def test_a_fast_kernel_refuses_an_argument_it_was_not_compiled_for():
    from kiln import gemm

    a, b, offs = operands([8, 8], 128, 64, BF16, "cuda", 3)
    kiln.grouped_mm(a, b, offs, backend="triton")
    tactics = gemm._triton_tactics[
        id(kiln._jit.triton_module("//ops/gemm:grouped", a.device, "t", dtype=BF16))
    ]
    out = torch.empty((16, 128), dtype=BF16, device="cuda")
    a_bad = torch.cat([torch.zeros(1, dtype=BF16, device="cuda"), a.flatten()])[1:].view(a.shape)
    with pytest.raises(ValueError, match=r"argument a = \d+ must be a multiple of 16"):
        gemm._launch_triton(tactics.kernels[0], out, a_bad, b, offs)


def test_the_layout_choice_and_the_launch_arguments_on_cpu_tensors():
    """Which kernel a call gets (gemm._fast_layout) and what _launch_triton passes it (grid, and
    each parameter by name, the constexpr unit strides left out), with a stand-in launcher."""
    from kiln import gemm

    a = torch.empty(100, 64, dtype=BF16)
    kmajor_b = torch.empty(4, 128, 64, dtype=BF16).transpose(1, 2)
    out = torch.empty(100, 128, dtype=BF16)
    assert gemm._fast_layout(out, a, kmajor_b) == "kmajor"
    assert gemm._fast_layout(out, a, torch.empty(4, 64, 128, dtype=BF16)) == "nmajor"
    assert gemm._fast_layout(out.float(), a, kmajor_b) is None  # float32 out: the fallback
    assert (
        gemm._fast_layout(
            out, torch.empty(100, 72, dtype=BF16), torch.empty(4, 128, 72, dtype=BF16).transpose(1, 2)
        )
        is None
    )
    assert gemm._fast_layout(out, torch.empty(64, 100, dtype=BF16).t(), kmajor_b) is None  # a column-major
    assert (
        gemm._fast_layout(torch.empty(100, 136, dtype=BF16)[:, :128], a, kmajor_b) is None
    )  # out row stride 136

    class Stand:
        params = [
            "a",
            "b",
            "out",
            "offs",
            "rows",
            "n",
            "k",
            "groups",
            "stride_am",
            "stride_bg",
            "stride_bn",
            "stride_om",
        ]
        constexprs = {"BLOCK_M": 64, "BLOCK_N": 128}
        calls = []

        def __call__(self, grid, *args, stream, device):
            self.calls.append((grid, args, stream, device))

    offs = torch.tensor([10, 60, 60, 100], dtype=torch.int32)
    k = Stand()
    gemm._launch_triton(k, out, a, kmajor_b, offs)
    ((grid, args, stream, device),) = k.calls
    assert grid == (2 + 4, 1) and stream == 0 and device is None
    assert args == (
        a.data_ptr(),
        kmajor_b.data_ptr(),
        out.data_ptr(),
        offs.data_ptr(),
        100,
        128,
        64,
        4,
        64,
        128 * 64,
        64,
        128,
    )


def test_the_untuned_path_runs_the_first_unblocked_config(tmp_path, kiln_env, monkeypatch):
    """With nothing tuned, the op launches the default kmajor config straight away (no callables,
    autotuner.untuned), never a blocked one; under a tuning context it goes through
    autotuner.launch as before. The launches are recorded by a stand-in for _launch_values; the
    module is the real cross-compiled one, its launch arguments those of _operands."""
    pytest.importorskip("triton", reason="cross-compiling needs triton==3.6.0 (pip install -e '.[test]')")
    from kiln import autotuner, gemm

    mod = jit.load(
        module_spec("//ops/gemm:grouped", {"dtype": "bf16"}, "triton"), ArchContext.current("8.0;9.0a")
    )
    tactics = gemm._TritonTactics(mod, torch.device("cpu"), BF16)
    monkeypatch.setattr(gemm, "_tactics_of", lambda device, dtype: tactics)
    seen = []
    monkeypatch.setattr(gemm, "_launch_values", lambda kernel, v, device: seen.append((kernel, v)))
    a, b, offs = operands([3, 0, 13], 32, 48, BF16, "cpu", 5)
    out = torch.empty(16, 32, dtype=BF16)
    assert gemm._fast_layout(out, a, b) == "kmajor"
    gemm._grouped_triton_op(out, a, b, offs, offs)
    assert seen == [(tactics.kernels[0], gemm._operands(out, a, b, offs.data_ptr()))]
    blocklist = tmp_path / "blocklist.json"
    blocklist.write_text(
        json.dumps(
            {
                "format": "kiln-tactic-blocklist",
                "version": 1,
                "blocked": [{"tactic": "grouped_mm_kmajor", "op": "grouped_triton", "why": "test"}],
            }
        )
    )
    kiln_env.set("KILN_TACTIC_BLOCKLIST", str(blocklist))
    assert autotuner.untuned(tactics, "grouped_triton", torch.device("cpu")) == 0b001
    del seen[:]
    gemm._grouped_triton_op(out, a, b, offs, offs)
    assert [k for k, _ in seen] == [tactics.kernels[1]]
    assert tactics.default(0b011) == 2 and tactics.default(0b111) == 0  # (all blocked: the first)
    with autotuner.autotune(tune_mode=False):  # a context: the op takes autotuner.launch's path
        assert autotuner.untuned(tactics, "grouped_triton", torch.device("cpu")) is None
        del seen[:]
        gemm._grouped_triton_op(out, a, b, offs, offs)
        assert [k for k, _ in seen] == [tactics.kernels[1]]


def test_the_module_lookup_is_cached_except_while_api_logging_observes_it(monkeypatch):
    """_tactics_of: one _jit.triton_module call per (device, dtype), then a dict lookup; while API
    logging's module observer is on, every call goes through _jit.triton_module (which reports
    the module), so a logged call still records the module it used."""
    pytest.importorskip("triton", reason="cross-compiling needs triton==3.6.0 (pip install -e '.[test]')")
    from kiln import gemm

    mod = jit.load(
        module_spec("//ops/gemm:grouped", {"dtype": "bf16"}, "triton"), ArchContext.current("8.0;9.0a")
    )
    lookups = []
    monkeypatch.setattr(gemm._jit, "triton_module", lambda *a, **kw: lookups.append(a[1]) or mod)
    monkeypatch.setattr(gemm, "_triton_by_call", {})
    # API logging off for the first part, whatever an earlier test or the environment left on
    monkeypatch.setattr(gemm.hooks, "module_observer", None)
    dev = torch.device("cuda", 3)  # (a key only: nothing runs)
    first = gemm._tactics_of(dev, BF16)
    assert gemm._tactics_of(dev, BF16) is first and lookups == [dev]
    assert first.mod is mod and first.tactic_names[0] == "grouped_mm_kmajor"
    monkeypatch.setattr(gemm.hooks, "module_observer", lambda *a: None)
    assert gemm._tactics_of(dev, BF16) is first and gemm._tactics_of(dev, BF16) is first
    assert lookups == [dev] * 3


def test_the_launch_names_the_tensors_device(monkeypatch):
    """_launch_triton launches in a's device's context (device=a.device.index: the launcher binds
    its primary context) on that device's current stream, whatever the thread's current device."""
    from kiln import gemm

    class OnCuda1:  # a CPU tensor that says it lives on cuda:1
        def __init__(self, t):
            self.t = t
            self.device = torch.device("cuda", 1)

        def __getattr__(self, name):
            return getattr(self.t, name)

    seen = []

    class Stand:
        params = ["a", "rows"]
        constexprs = {"BLOCK_M": 16, "BLOCK_N": 16}

        def __call__(self, grid, *args, stream, device):
            seen.append((args, stream, device))

    monkeypatch.setattr(gemm._jit, "stream_of", lambda d: 0x51 if d == torch.device("cuda", 1) else -1)
    a = torch.empty(20, 32, dtype=BF16)
    b = OnCuda1(torch.empty(2, 32, 16, dtype=BF16))
    gemm._launch_triton(
        Stand(), OnCuda1(torch.empty(20, 16, dtype=BF16)), OnCuda1(a), b, torch.tensor([5, 20])
    )
    assert seen == [((a.data_ptr(), 20), 0x51, 1)]


@gpu
def test_grouped_mm_triton_from_a_fresh_thread():
    """A thread that never touched the GPU has no current CUDA context; the op makes it current."""
    import threading

    a, b, offs = operands([30, 2, 64], 128, 64, BF16, "cuda", 13)
    out = torch.full((96, 128), float("nan"), dtype=BF16, device="cuda")
    errors = []

    def work():
        try:
            kiln.grouped_mm(a, b, offs, out=out, backend="triton")
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert errors == []
    close(out, ref.grouped_mm_reference_float(a, b, offs, torch.float64), BF16)


def test_the_overhead_benchmarks_reference_check():
    """benchmarks/triton_overhead.py's check on CPU tensors (both backends run the host backend
    there): it passes on a right answer, and fails naming the backend when one writes nothing (out
    is refilled with NaN per backend) or writes a wrong answer. On the GPU it compared a host copy
    with the reference on the device; it now copies both sides to the host."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "triton_overhead.py"
    spec = importlib.util.spec_from_file_location("triton_overhead", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a, b, offs = operands([7, 0, 12], 24, 40, BF16, "cpu", 31)
    out = torch.empty(19, 24, dtype=BF16)
    bench.check_reference(a, b, offs, out)
    assert not out.isnan().any()

    def triton_writes_nothing(a, b, offs, out, backend):
        return out if backend == "triton" else kiln.grouped_mm(a, b, offs, out=out, backend=backend)

    with pytest.raises(AssertionError, match="backend=triton"):
        bench.check_reference(a, b, offs, out, run=triton_writes_nothing)

    def cuda_is_off_by_a_bit(a, b, offs, out, backend):
        got = kiln.grouped_mm(a, b, offs, out=out, backend=backend)
        return got + 0.1 if backend == "cuda" else got

    with pytest.raises(AssertionError, match="backend=cuda"):
        bench.check_reference(a, b, offs, out, run=cuda_is_off_by_a_bit)


def test_the_overhead_benchmarks_host_only_mode(tmp_path):
    """benchmarks/triton_overhead.py --host-only on this machine: the CUDA driver is the stub
    (benchmarks/stub_libcuda.c, compiled with cc), which counts every launch that reaches it; each
    triton case must have launched once per call (else the script exits non-zero), and each record
    says so. In a child process: the stub must not become this session's libcuda.so.1."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton", reason="the host-only mode loads the cross-compiled triton module")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("needs a C compiler for the stub driver")
    if kiln.utils.cuda_available():
        pytest.skip("a machine with a GPU measures the real driver (triton_overhead.py without --host-only)")
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "triton_overhead.py"
    out = tmp_path / "host.jsonl"
    subprocess.run(
        [sys.executable, str(path), "--host-only", "--calls", "50", "--reps", "2", "--out", str(out)],
        check=True,
        timeout=300,
    )
    records = {r["case"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {"harness", "launch", "op_nmajor", "op_kmajor"} <= set(records)
    for case in ("launch", "op_nmajor", "op_kmajor"):
        assert records[case]["launch_check"] == "passed" and records[case]["median_us"] > 0
