// //ops/gemm:mm, CUDA backend: the sm80 tiled mma.sync kernels (both B layouts, 3 and 4 stages)
// and the fallback kernel. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_fallback.cuh"
#include "ops/gemm/gemm_sm80.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_sm80<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
template Status run_fallback<spec::dtype, spec::dtype>(const GemmParams&, LaunchContext);
}  // namespace kiln::gemm
