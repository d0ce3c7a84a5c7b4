# //ops/gemm -- GEMM: one target per op whose kernels differ; //ops:gemm builds them all.
# Modules: gemm_mm_dtype_bf16_cuda, gemm_fp8_dtype_e4m3_host, gemm_grouped_dtype_f16_cuda, ...
#
# Each module holds the kernels of one input dtype only (the kernels' own notes: one module with
# every dtype and tactic took 33-36 s to compile cold), and its kernel families are separate
# compile units (gemm_kernels.h), so a cold build takes its slowest unit, not their sum. The sm90
# kernels (wgmma, TMA) need sm_90a: every target declares sm90a, so a 9.0 GPU builds 9.0a; sm80,
# sm100 and sm120 run the mma.sync, small-M and fallback kernels (fp8: the fallback kernel).
ARCHS = ["sm80", "sm90a", "sm100", "sm120"]
SHARED = ["gemm_device.cu", "gemm_tactics.cc"]  # device arch, timestamps; tactics and their rules
HOST = ["gemm_host.cc", "gemm_tactics.cc"]

op_library(
    name="mm",
    doc="dense 16-bit GEMM, mm and batched: mm_bf16, bmm_bf16",
    srcs=["gemm_cuda.cu", "mm_sm90_kmajor.cu", "mm_sm90_nmajor.cu", "mm_sm80.cu", "mm_small_m.cu", *SHARED],
    host_srcs=HOST,
    binding="bindings/gemm/mm.cc",
    dispatch={"dtype": ["bf16", "f16"]},
    archs=ARCHS,
    release="all",
)

op_library(
    name="fp8",
    doc="fp8 GEMM, per-tensor and groupwise (1 x 128 x 128) scales: bmm_fp8, gemm_fp8_nt_groupwise",
    srcs=["gemm_cuda.cu", "fp8_sm90_tensor.cu", "fp8_sm90_group.cu", "fp8_fallback.cu", *SHARED],
    host_srcs=HOST,
    binding="bindings/gemm/fp8.cc",
    dispatch={"dtype": ["e4m3", "e5m2"]},  # A's dtype; B is e4m3 (the sm90 kernels) or e5m2
    archs=ARCHS,
    release="all",
)

# grouped_mm's backend="triton" (ops/gemm/grouped_triton.py): one cubin per entry point and arch.
# Tiles 64 x 128 x 64, 4 warps, 3 stages: the shape vLLM's fused-MoE default config uses for
# bf16 at moderate M (docs/perf/gemm-triton.md has the floors and the measurements).
_GROUPED_SIGNATURE = {
    "a": "*{dtype}", "b": "*{dtype}", "out": "*{dtype}", "offs": "*i32", "rows": "i32",
    "n": "i32", "k": "i32", "groups": "i32", "stride_am": "i64", "stride_ak": "i64",
    "stride_bg": "i64", "stride_bk": "i64", "stride_bn": "i64", "stride_om": "i64",
    "stride_on": "i64", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
}
_GROUPED_TILE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64}

op_library(
    name="grouped",
    doc="grouped (segment) GEMM for MoE and LoRA: SegmentGEMMWrapper, grouped_mm",
    srcs=["grouped_cuda.cu", "grouped_sm90.cu", *SHARED],
    host_srcs=HOST,
    triton_srcs=["grouped_triton.py"],
    triton_kernels=[
        triton_kernel("grouped_mm_kernel", unit="grouped_triton.py", signature=_GROUPED_SIGNATURE,
                      constexprs=_GROUPED_TILE, num_warps=4, num_stages=3),
        triton_kernel("grouped_mm_f32_kernel", unit="grouped_triton.py",
                      signature={**_GROUPED_SIGNATURE, "out": "*fp32"},
                      constexprs=_GROUPED_TILE, num_warps=4, num_stages=3),
    ],
    binding="bindings/gemm/grouped.cc",
    dispatch={"dtype": ["bf16", "f16"]},
    archs=ARCHS,
    release="all",
)

op_group(
    name="gemm",
    doc="every GEMM op: mm, fp8, grouped",
    targets=[":mm", ":fp8", ":grouped"],
)
