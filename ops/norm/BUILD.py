# //ops:norm -- RMSNorm, fused residual-add RMSNorm, and their Gemma (1 + w) variants.
# One module per dtype and toolchain: norm_dtype_bf16_cuda, norm_dtype_bf16_host, ...
op_library(
    name="norm",
    doc="RMSNorm / fused add + RMSNorm (and Gemma variants), 2-D and 3-D rows",
    srcs=["norm_cuda.cu"],
    host_srcs=["norm_host.cc"],
    binding="bindings/norm.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",  # every dtype ships in precompiled packages (python -m release build)
)
