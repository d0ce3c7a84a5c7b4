// //ops/gemm:mm, CUDA backend: the small-M (decode, m <= 64) kernels, every listed tile and
// split-K shape. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm80.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_small_m<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
