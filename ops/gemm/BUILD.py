# //ops/gemm -- GEMM: one target per op whose kernels differ; //ops:gemm builds them all.
# Modules: gemm_mm_dtype_bf16_cuda, gemm_fp8_dtype_e4m3_host, gemm_grouped_dtype_f16_cuda, ...
#
# Each module holds the kernels of one input dtype only (the kernels' own notes: one module with
# every dtype and tactic took 33-36 s to compile cold), and its kernel families are separate
# compile units (gemm_kernels.h), so a cold build takes its slowest unit, not their sum. The sm90
# kernels (wgmma, TMA) need sm_90a: every target declares sm90a, so a 9.0 GPU builds 9.0a; sm80,
# sm100 and sm120 run the mma.sync, small-M and fallback kernels (fp8: the fallback kernel).
ARCHS = ["sm80", "sm90a", "sm100", "sm120"]

source_library(
    name="shared",
    doc="what every GEMM module compiles: the device arch and timestamps, the tactics and their rules",
    srcs=["gemm_device.cu", "gemm_tactics.cc"],
    host_srcs=["gemm_tactics.cc"],
)

op_library(
    name="mm",
    doc="dense 16-bit GEMM, mm and batched: mm_bf16, bmm_bf16",
    srcs=["gemm_cuda.cu", "mm_sm90_kmajor.cu", "mm_sm90_nmajor.cu", "mm_sm80.cu", "mm_small_m.cu"],
    host_srcs=["gemm_host.cc"],
    deps=[":shared"],
    binding="bindings/gemm/mm.cc",
    dispatch={"dtype": ["bf16", "f16"]},
    archs=ARCHS,
    release="all",
)

op_library(
    name="fp8",
    doc="fp8 GEMM, per-tensor and groupwise (1 x 128 x 128) scales: bmm_fp8, gemm_fp8_nt_groupwise, "
    "gemm_fp8_nt_blockscaled",
    srcs=["gemm_cuda.cu", "fp8_sm90_tensor.cu", "fp8_sm90_group.cu", "fp8_fallback.cu"],
    host_srcs=["gemm_host.cc"],
    deps=[":shared"],
    binding="bindings/gemm/fp8.cc",
    dispatch={"dtype": ["e4m3", "e5m2"]},  # A's dtype; B is e4m3 (the sm90 kernels) or e5m2
    archs=ARCHS,
    release="all",
)

# grouped_mm's backend="triton" (ops/gemm/grouped_triton.py): one cubin per kernel and arch.
# grouped_mm_kernel / grouped_mm_f32_kernel take any strides (the fallback; every argument a
# runtime value). The fast kernels are the same function specialised the way Triton's JIT would:
# unit strides as constexprs and ":16" on what is a multiple of 16 (16-byte aligned pointers, row
# strides, the dimension a mask runs along), which lets Triton vectorise the loads and pipeline
# them (without both it emits scalar loads and no cp.async, one stage). kmajor: b column-major
# per group (MoE weights held [E, n, k]); nmajor: b row-major. The default tile, 64 x 128 x 64
# with 4 warps and 3 stages, is vLLM's fused-MoE default for bf16; kmajor has two more configs,
# the autotuner's tactics (op "grouped_triton"): 128 x 128 x 64 / 8 warps for many rows per
# group, 16 x 128 x 128 / 4 stages for decode's few (docs/perf/gemm-triton.md).
_GROUPED_SIGNATURE = {
    "a": "*{dtype}", "b": "*{dtype}", "out": "*{dtype}", "offs": "*i32", "rows": "i32",
    "n": "i32", "k": "i32", "groups": "i32", "stride_am": "i64", "stride_ak": "i64",
    "stride_bg": "i64", "stride_bk": "i64", "stride_bn": "i64", "stride_om": "i64",
    "stride_on": "i64", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
}
_GROUPED_TILE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64}
_ALIGNED = {"a": "*{dtype}:16", "b": "*{dtype}:16", "out": "*{dtype}:16", "stride_am": "i64:16",
            "stride_ak": "constexpr", "stride_bg": "i64:16", "stride_om": "i64:16",
            "stride_on": "constexpr"}
_KMAJOR = {**_GROUPED_SIGNATURE, **_ALIGNED, "k": "i32:16", "stride_bk": "constexpr",
           "stride_bn": "i64:16"}
_NMAJOR = {**_GROUPED_SIGNATURE, **_ALIGNED, "n": "i32:16", "stride_bk": "i64:16",
           "stride_bn": "constexpr"}
_UNIT = {"stride_ak": 1, "stride_on": 1}
# (name, signature, tile and unit strides, warps, stages) of each fast kernel.
_GROUPED_FAST = [
    ("grouped_mm_kmajor", _KMAJOR, {**_GROUPED_TILE, **_UNIT, "stride_bk": 1}, 4, 3),
    ("grouped_mm_kmajor_m128n128k64_w8s3", _KMAJOR,
     {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, **_UNIT, "stride_bk": 1}, 8, 3),
    ("grouped_mm_kmajor_m16n128k128_w4s4", _KMAJOR,
     {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, **_UNIT, "stride_bk": 1}, 4, 4),
    ("grouped_mm_nmajor", _NMAJOR, {**_GROUPED_TILE, **_UNIT, "stride_bn": 1}, 4, 3),
]

op_library(
    name="grouped",
    doc="grouped (segment) GEMM for MoE and LoRA: SegmentGEMMWrapper, grouped_mm",
    srcs=["grouped_cuda.cu", "grouped_sm90.cu"],
    host_srcs=["gemm_host.cc"],
    deps=[":shared"],
    triton_srcs=["grouped_triton.py"],
    triton_kernels=[
        triton_kernel("grouped_mm_kernel", unit="grouped_triton.py", signature=_GROUPED_SIGNATURE,
                      constexprs=_GROUPED_TILE, num_warps=4, num_stages=3),
        triton_kernel("grouped_mm_f32_kernel", unit="grouped_triton.py",
                      signature={**_GROUPED_SIGNATURE, "out": "*fp32"},
                      constexprs=_GROUPED_TILE, num_warps=4, num_stages=3),
        *(triton_kernel("grouped_mm_kernel", name=name, unit="grouped_triton.py", signature=sig,
                        constexprs=consts, num_warps=warps, num_stages=stages)
          for name, sig, consts, warps, stages in _GROUPED_FAST),
    ],
    binding="bindings/gemm/grouped.cc",
    dispatch={"dtype": ["bf16", "f16"]},
    archs=ARCHS,
    release="all",
)

# The fp8 grouped GEMM (MoE with e4m3 weights, DeepSeek-V3's 1 x 128 x 128 scales): the grouped
# entry and fallback units of :grouped for e4m3, and the sm90 unit combining the grouped tile
# order with the groupwise main loop.
op_library(
    name="fp8_grouped",
    doc="grouped fp8 GEMM with groupwise (1 x 128 x 128) scales per weight: group_gemm_fp8_nt_groupwise",
    srcs=["grouped_cuda.cu", "fp8_grouped_sm90.cu"],
    host_srcs=["gemm_host.cc"],
    deps=[":shared"],
    binding="bindings/gemm/fp8_grouped.cc",
    dispatch={"dtype": ["e4m3"]},
    archs=ARCHS,
    release="all",
)

op_group(
    name="gemm",
    doc="every GEMM op: mm, fp8, grouped, fp8_grouped",
    targets=[":mm", ":fp8", ":grouped", ":fp8_grouped"],
)
