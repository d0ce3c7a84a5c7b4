// //ops:norm, CUDA backend: the *_quant entry points of norm.h for this module's dtype, in a unit
// of their own so that ninja compiles them beside the unquantised kernels (norm_cuda.cu).
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/norm/layernorm.cuh"
#include "ops/norm/norm.cuh"
#include "spec_config.h"

namespace kiln::norm {

Status rmsnorm_quant(const QuantNormParams& p, LaunchContext ctx) {
  return launch_rmsnorm<spec::dtype, false>(p, ctx);
}

Status fused_add_rmsnorm_quant(const QuantNormParams& p, LaunchContext ctx) {
  return launch_rmsnorm<spec::dtype, true>(p, ctx);
}

Status layernorm_quant(const QuantLayerNormParams& p, LaunchContext ctx) {
  return launch_layernorm<spec::dtype>(p, ctx);
}

}  // namespace kiln::norm
