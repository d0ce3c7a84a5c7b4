// //ops:rope, CUDA backend: the entry points of rope.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/rope/rope.cuh"
#include "ops/rope/rope_quantize.cuh"
#include "spec_config.h"

namespace kiln::rope {

Status apply_rope(const RopeParams& p, LaunchContext ctx) {
  return launch<spec::dtype>(p, ctx);
}

Status rope_quantize(const RopeQuantParams& p, LaunchContext ctx) {
  return launch_quantize<spec::dtype>(p, ctx);
}

}  // namespace kiln::rope
