// //ops/attention:cascade, CUDA backend: merge_states() and merge_two() of attention.h for this
// module's dtype and head_dim. Copied into the specialisation's generated directory.
#include "ops/attention/merge.cuh"
#include "spec_config.h"

namespace kiln::attention {

constexpr int kHeadDim = static_cast<int>(spec::head_dim);

Status merge_states(const MergeParams& p, LaunchContext ctx) {
  return launch_merge_states<spec::dtype, kHeadDim>(p, ctx);
}

Status merge_two(const MergeTwoParams& p, LaunchContext ctx) {
  return launch_merge_two<spec::dtype, kHeadDim>(p, ctx);
}

}  // namespace kiln::attention
