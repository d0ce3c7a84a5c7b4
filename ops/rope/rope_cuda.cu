// //ops:rope, CUDA backend: the entry point of rope.h for this module's dtype.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/rope/rope.cuh"
#include "spec_config.h"

namespace kiln::rope {

Status apply_rope(const RopeParams& p, LaunchContext ctx) {
  return launch<spec::dtype>(p, ctx);
}

}  // namespace kiln::rope
