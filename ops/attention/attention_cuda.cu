// //ops:attention, CUDA backend: the entry points of attention.h for this module's dtype,
// head_dim and soft-cap flag. Copied into the specialisation's generated directory.
#include "ops/attention/decode.cuh"
#include "ops/attention/merge.cuh"
#include "ops/attention/page.cuh"
#include "ops/attention/prefill.cuh"
#include "spec_config.h"

namespace kiln::attention {

using T = spec::dtype;
constexpr int kHeadDim = static_cast<int>(spec::head_dim);

Status decode(const DecodeParams& p, LaunchContext ctx) {
  return launch_decode<T, kHeadDim, spec::soft_cap>(p, ctx);
}

Status prefill(const PrefillParams& p, LaunchContext ctx) {
  return launch_prefill<T, kHeadDim, spec::soft_cap>(p, ctx);
}

Status merge_states(const MergeParams& p, LaunchContext ctx) {
  return launch_merge_states<T, kHeadDim>(p, ctx);
}

Status merge_two(const MergeTwoParams& p, LaunchContext ctx) {
  return launch_merge_two<T, kHeadDim>(p, ctx);
}

Status append_paged_kv(const AppendParams& p, LaunchContext ctx) {
  return launch_append_paged_kv<T, kHeadDim>(p, ctx);
}

}  // namespace kiln::attention
