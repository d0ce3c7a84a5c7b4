# //ops:activation -- gated activations of a GLU MLP: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.
# One module per dtype and toolchain (activation_dtype_bf16_cuda, ...); the activation is a run-time
# argument, so one module holds all three (12 small kernels: three activations x four vector widths).
op_library(
    name="activation",
    doc="gated activations act(x[..., :d]) * x[..., d:]: silu, gelu (erf), gelu (tanh)",
    srcs=["activation_cuda.cu"],
    host_srcs=["activation_host.cc"],
    binding="bindings/activation.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
