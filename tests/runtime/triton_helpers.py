"""A toy triton module for the toolchain tests: two tiny kernels in one file, importing a helper
file beside it (so a helper edit must change the action key, as a header edit does for nvcc)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kiln.runtime.arch import ArchFamily
from kiln.runtime.spec import CompileSpec, TritonKernel, Unit

HELPER = textwrap.dedent(
    """\
    import triton
    import triton.language as tl

    SCALE = tl.constexpr({scale})


    @triton.jit
    def scaled(x):
        return x * SCALE
    """
)

KERNELS = textwrap.dedent(
    """\
    import triton
    import triton.language as tl

    from toy_triton_helper import scaled


    @triton.jit
    def toy_add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out + i, scaled(tl.load(x + i, mask=m)) + tl.load(y + i, mask=m), mask=m)


    @triton.jit
    def toy_fill(out, n, value, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.zeros([BLOCK], tl.float32) + value, mask=i < n)
    """
)

FAMILIES = (ArchFamily("sm80", ("8.0", "8.6", "8.9")), ArchFamily("sm90", ("9.0",)))


def make_toy_triton(directory: Path, scale: int = 1) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "toy_triton_helper.py").write_text(HELPER.format(scale=scale))
    (directory / "toy_triton.py").write_text(KERNELS)
    return directory


def toy_triton_spec(
    directory: Path, name: str = "toy_triton_module", block: int = 128, families=FAMILIES
) -> CompileSpec:
    unit = "toy_triton.py"
    return CompileSpec(
        name=name,
        uri=name,
        toolchain="triton",
        units=(Unit(unit, "triton"),),
        inputs=(directory / unit,),
        params=(("block", str(block)),),
        arch_families=families,
        label="//tests:toy_triton",
        kernels=(
            TritonKernel(
                "toy_add",
                unit,
                (("x", "*fp32"), ("y", "*fp32"), ("out", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr")),
                (("BLOCK", block),),
                num_warps=4,
                num_stages=1,
            ),
            TritonKernel(
                "toy_fill",
                unit,
                (("out", "*fp32"), ("n", "i32"), ("value", "fp32"), ("BLOCK", "constexpr")),
                (("BLOCK", block),),
                num_warps=2,
                num_stages=1,
            ),
        ),
    )
