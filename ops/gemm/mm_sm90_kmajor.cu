// //ops/gemm:mm, CUDA backend: the sm90 kernels (TMA + wgmma, sm_90a) for a K-major B (the
// transpose view of an [n, k] weight), every tile and cluster shape, out = the module's dtype or
// float32. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_sm90_kmajor<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
