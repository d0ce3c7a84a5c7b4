// //ops/gemm:fp8, CUDA backend: the sm90 fp8 kernels with per-tensor scales (alpha in the
// epilogue), A of the module's dtype x e4m3 B (K-major), out bf16 or f16, every tile and cluster
// shape. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_sm90_fp8_tensor<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
