// //ops/gemm:fp8, CUDA backend: the sm90 fp8 kernels with groupwise (1 x 128 x 128) scales applied
// per 128-wide K block, A of the module's dtype x e4m3 B, out bf16 or f16, tile_n 128, clusters 1
// and 2. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_sm90_fp8_group<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
