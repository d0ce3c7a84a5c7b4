// //ops:sampling, CUDA backend: the entry points of sampling.h for this module's dtype. Copied into
// the specialisation's generated directory, next to its spec_config.h.
#include "ops/sampling/sampling.cuh"
#include "spec_config.h"

namespace kiln::sampling {

Status sample_rows(const RowParams& p, LaunchContext ctx) {
  return launch_rows<spec::dtype>(p, ctx);
}

Status chain_speculative(const SpecParams& p, LaunchContext ctx) {
  return launch_speculative(p, ctx);
}

}  // namespace kiln::sampling
