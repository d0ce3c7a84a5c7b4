// //ops/gemm:grouped, CUDA backend: the sm90 grouped kernels (segment scan, clipped stores), both
// B layouts, out = the module's dtype or float32, tile_n 128 and 256. One unit of the module's
// parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_grouped_sm90<spec::dtype>(const GroupedGemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
