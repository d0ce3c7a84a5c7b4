// //ops:quantization, CUDA backend: the entry points of quantization.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/quantization/quantization.cuh"
#include "spec_config.h"

namespace kiln::quantization {

Status per_token_group_quant(const GroupQuantParams& p, LaunchContext ctx) {
  return launch_group<spec::dtype>(p, ctx);
}

Status scaled_fp8_quant(const TensorQuantParams& p, LaunchContext ctx) {
  return launch_tensor<spec::dtype>(p, ctx);
}

}  // namespace kiln::quantization
