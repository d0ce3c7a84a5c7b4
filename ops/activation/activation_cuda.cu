// //ops:activation, CUDA backend: the entry point of activation.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/activation/activation.cuh"
#include "spec_config.h"

namespace kiln::activation {

Status act_and_mul(const ActParams& p, LaunchContext ctx) {
  return launch_act_and_mul<spec::dtype>(p, ctx);
}

}  // namespace kiln::activation
