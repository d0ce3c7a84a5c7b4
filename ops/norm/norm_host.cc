// //ops:norm, host backend: the entry points of norm.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/norm/norm_host.h"
#include "spec_config.h"

namespace kiln::norm {

Status rmsnorm(const NormParams& p, LaunchContext) {
  return host::run<spec::dtype, false>(p);
}

Status fused_add_rmsnorm(const NormParams& p, LaunchContext) {
  return host::run<spec::dtype, true>(p);
}

Status layernorm(const LayerNormParams& p, LaunchContext) {
  return host::layernorm<spec::dtype>(p);
}

Status rmsnorm_quant(const QuantNormParams& p, LaunchContext) {
  return host::run<spec::dtype, false>(p, &p.quant);
}

Status fused_add_rmsnorm_quant(const QuantNormParams& p, LaunchContext) {
  return host::run<spec::dtype, true>(p, &p.quant);
}

Status layernorm_quant(const QuantLayerNormParams& p, LaunchContext) {
  return host::layernorm<spec::dtype>(p, &p.quant);
}

}  // namespace kiln::norm
