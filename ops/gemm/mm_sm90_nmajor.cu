// //ops/gemm:mm, CUDA backend: the sm90 kernels (TMA + wgmma with the transpose-B descriptor,
// sm_90a) for an N-major (row-major [k, n]) B, every tile and cluster shape, out = the module's
// dtype or float32. One unit of the module's parallel build (gemm_kernels.h).
#include "ops/gemm/gemm_sm90.cuh"
#include "spec_config.h"

namespace kiln::gemm {
template Status run_sm90_nmajor<spec::dtype>(const GemmParams&, const Tactic&, LaunchContext);
}  // namespace kiln::gemm
