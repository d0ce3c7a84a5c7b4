"""BUILD-file declarations of triton kernels (codegen/rules.py triton_srcs / triton_kernel) and the
spec codegen makes of them: refused with a message naming the file, the target and what is wrong;
a declared kernel's signature and constexprs take the specialisation's dispatch values."""

from pathlib import Path

import pytest

from kiln.codegen.graph import load_graph
from kiln.codegen.rules import BuildFileError, make_target, triton_kernel
from kiln.codegen.specs import module_spec

SIG = {"x": "*{dtype}", "n": "i32", "BLOCK": "constexpr"}


def target(**kw):
    args = dict(
        name="t",
        binding="bindings/t.cc",
        archs=["sm90a"],
        dispatch={"dtype": ["bf16", "f16"]},
        triton_srcs=["t_triton.py"],
        triton_kernels=[triton_kernel("k", unit="t_triton.py", signature=SIG, constexprs={"BLOCK": 64})],
    )
    args.update(kw)
    return make_target(Path("ops/t/BUILD.py"), "ops", "ops/t", **args)


def test_a_triton_only_target_has_the_triton_toolchain():
    t = target()
    assert t.toolchains == ("triton",) and t.triton_kernels[0].constexprs == (("BLOCK", 64),)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"triton_kernels": []}, "triton_srcs= and triton_kernels= go together"),
        ({"archs": []}, "must declare archs"),
        (
            {"triton_kernels": [triton_kernel("k", unit="other.py", signature=SIG)]},
            "names unit 'other.py', not one of triton_srcs",
        ),
        ({"triton_kernels": ["k"]}, "takes triton_kernel"),
    ],
)
def test_bad_declarations_are_refused_naming_the_target(kw, match):
    with pytest.raises(BuildFileError, match=match):
        target(**kw)


def test_triton_kernel_checks_its_arguments():
    with pytest.raises(BuildFileError, match="the entry point must be an identifier"):
        triton_kernel("not a name", unit="t.py", signature=SIG)
    with pytest.raises(BuildFileError, match="signature= takes"):
        triton_kernel("k", unit="t.py", signature={})


def test_the_spec_substitutes_the_dispatch_values():
    for dtype, ty in (("bf16", "*bf16"), ("f16", "*fp16")):
        spec = module_spec("//ops/gemm:grouped", {"dtype": dtype}, "triton")
        assert spec.toolchain == "triton" and spec.name == f"gemm_grouped_dtype_{dtype}_triton"
        k = {k.key: k for k in spec.kernels}
        sig = dict(k["grouped_mm_kernel"].signature)
        assert (
            sig["a"] == ty
            and sig["out"] == ty
            and dict(k["grouped_mm_f32_kernel"].signature)["out"] == "*fp32"
        )
        assert [Path(p).name for p in spec.inputs] == ["grouped_triton.py"]
        assert [str(f) for f in spec.arch_families] == [
            str(f) for f in module_spec("//ops/gemm:grouped", {"dtype": dtype}, "cuda").arch_families
        ]
    assert "triton" in load_graph().workspace["TOOLCHAINS"]


def test_query_explain_and_inspect_show_triton_modules(tmp_path, kiln_env, capsys, session_workspace):
    pytest.importorskip("triton", reason="inspect builds a module: triton==3.6.0 (pip install -e '.[test]')")
    from kiln.codegen.cli import main

    kiln_env.set("KILN_WORKSPACE_BASE", str(tmp_path / "ws"))
    assert main(["query", "//ops/gemm:grouped"]) == 0
    out = capsys.readouterr().out
    assert "toolchains     cuda, host, triton" in out
    assert "triton kernel  grouped_mm_kmajor (ops/gemm/grouped_triton.py: grouped_mm_kernel;" in out
    assert (
        main(
            [
                "explain",
                "//ops/gemm:grouped",
                "--toolchain",
                "triton",
                "--arch-list",
                "9.0a",
                "--set",
                "dtype=bf16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "python -m kiln.runtime.triton_build" in out and "GPUTarget('cuda', 90, 32)" in out
    assert '"version": "3.6.0"' in out and '"ops/gemm/grouped_triton.py":' in out
    assert "status: a build would happen now" in out and not (tmp_path / "ws").exists()
    kiln_env.set("KILN_WORKSPACE_BASE", session_workspace)  # where the other tests build it too
    build = [
        "build",
        "//ops/gemm:grouped",
        "--toolchain",
        "triton",
        "--arch-list",
        "8.0;9.0a",
        "--set",
        "dtype=bf16",
    ]
    assert main(build) == 0
    capsys.readouterr()
    assert main(["inspect", "gemm_grouped_dtype_bf16_triton", "--arch-list", "8.0;9.0a"]) == 0
    out = capsys.readouterr().out
    assert "status           usable: the JIT loads this one" in out
    assert "triton 3.6.0; kernel sources:" in out and "ops/gemm/grouped_triton.py  sha256" in out
    rows = [ln.split() for ln in out.splitlines() if " sm 9.0a " in ln]
    assert sorted(r[0] for r in rows) == sorted(
        [
            "grouped_mm_kernel",
            "grouped_mm_f32_kernel",
            "grouped_mm_kmajor",
            "grouped_mm_kmajor_m128n128k64_w8s3",
            "grouped_mm_kmajor_m16n128k128_w4s4",
            "grouped_mm_nmajor",
        ]
    )
    assert all(int(r[r.index("shared") + 1]) > 0 and r[r.index("warps") + 1] in ("4", "8") for r in rows)
