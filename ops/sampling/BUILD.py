# //ops:sampling -- the sampler at the end of a decode step: softmax, sampling from probabilities or
# logits with top-k / top-p / min-p filters, the renormalised and masked distributions, and chain
# speculative sampling. One module per input dtype and toolchain (sampling_dtype_f32_cuda, ...):
# probabilities are float32, logits any of the three. Three kernels per module (one row kernel whose
# output and filters are run-time parameters, softmax's cluster kernel for sm90+, one speculative
# kernel), so a cold compile stays small. --fmad=false: no multiply-add is fused on the device
# only, so the host backend computes the same weights and draws the same tokens
# (ops/sampling/sampling.h).
op_library(
    name="sampling",
    doc="sampling: softmax, top-k / top-p / min-p sampling and renormalisation, chain speculative sampling",
    srcs=["sampling_cuda.cu"],
    host_srcs=["sampling_host.cc"],
    binding="bindings/sampling.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    cuda_flags=["--fmad=false"],
    release="all",
)
