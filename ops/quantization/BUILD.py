# //ops:quantization -- fp8 (E4M3) quantisation of activations: per-token groups (DeepSeek-V3's
# 1 x 128 scales) and per tensor (dynamic or a given scale). One module per input dtype and
# toolchain (quantization_dtype_bf16_cuda, ...); the output is always float8_e4m3fn.
op_library(
    name="quantization",
    doc="fp8 E4M3 quantisation: per_token_group_quant_fp8, scaled_fp8_quant",
    srcs=["quantization_cuda.cu"],
    host_srcs=["quantization_host.cc"],
    binding="bindings/quantization.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)

# //ops/quantization:packbits -- numpy.packbits of boolean arrays, whole or per segment (FlashInfer's
# flashinfer.quantization.packbits / segment_packbits, which pack attention custom masks). No
# dispatch axis: the input is always bool, the output uint8.
op_library(
    name="packbits",
    doc="bit packing of boolean arrays (numpy.packbits, big or little bit order): packbits, segment_packbits",
    srcs=["packbits_cuda.cu"],
    host_srcs=["packbits_host.cc"],
    binding="bindings/packbits.cc",
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
