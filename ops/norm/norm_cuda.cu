// //ops:norm, CUDA backend: the entry points of norm.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/norm/layernorm.cuh"
#include "ops/norm/norm.cuh"
#include "spec_config.h"

namespace kiln::norm {

Status rmsnorm(const NormParams& p, LaunchContext ctx) {
  return launch_rmsnorm<spec::dtype, false>(p, ctx);
}

Status fused_add_rmsnorm(const NormParams& p, LaunchContext ctx) {
  return launch_rmsnorm<spec::dtype, true>(p, ctx);
}

Status layernorm(const LayerNormParams& p, LaunchContext ctx) {
  return launch_layernorm<spec::dtype>(p, ctx);
}

}  // namespace kiln::norm
