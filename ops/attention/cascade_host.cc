// //ops/attention:cascade, host backend: merge_states() and merge_two() of attention.h for this
// module's dtype and head_dim. Copied into the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

constexpr int kHeadDim = static_cast<int>(spec::head_dim);

Status merge_states(const MergeParams& p, LaunchContext) {
  host::merge<spec::dtype, spec::dtype, kHeadDim>(p);
  return Status::Ok();
}

Status merge_two(const MergeTwoParams& p, LaunchContext) {
  return host::merge_two<spec::dtype, kHeadDim>(p);
}

}  // namespace kiln::attention
