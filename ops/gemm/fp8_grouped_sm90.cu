// //ops/gemm:fp8_grouped, CUDA backend: the sm90 grouped fp8 kernel (e4m3 x and weights, groupwise
// 1 x 128 x 128 scales per weight, segment scan and clipped stores), out bf16 or f16, tile_n 128.
// One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_grouped_sm90_fp8<spec::dtype>(const GroupedGemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
