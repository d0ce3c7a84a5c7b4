# //ops:norm -- RMSNorm, fused residual-add RMSNorm, their Gemma (1 + w) variants, LayerNorm, and
# the fp8-quantised rmsnorm_quant / fused_add_rmsnorm_quant / layernorm_quant.
# One module per dtype and toolchain: norm_dtype_bf16_cuda, norm_dtype_bf16_host, ... The quantised
# kernels are a unit of their own (norm_quant_cuda.cu), compiled in parallel with the others.
op_library(
    name="norm",
    doc="RMSNorm / fused add + RMSNorm (and Gemma variants), LayerNorm, their fp8-quantised forms; 2-D and 3-D rows",
    srcs=["norm_cuda.cu", "norm_quant_cuda.cu"],
    host_srcs=["norm_host.cc"],
    binding="bindings/norm.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",  # every dtype ships in precompiled packages (python -m release build)
)
