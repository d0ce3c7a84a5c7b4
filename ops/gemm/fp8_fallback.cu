// //ops/gemm:fp8, CUDA backend: the fallback kernel for A of the module's dtype x either fp8 B
// (any shape, alignment and layout, per-tensor or groupwise scales). One unit of the module's
// parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_fallback.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_fallback<spec::dtype, e4m3_t>(const GemmParams&, LaunchContext);
template Status run_fallback<spec::dtype, e5m2_t>(const GemmParams&, LaunchContext);
}  // namespace kiln::gemm
