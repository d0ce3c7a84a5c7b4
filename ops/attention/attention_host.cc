// //ops:attention, host backend: the entry points of attention.h for this module's dtype,
// head_dim and soft-cap flag. Copied into the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

using T = spec::dtype;
constexpr int kHeadDim = static_cast<int>(spec::head_dim);

Status decode(const DecodeParams& p, LaunchContext) {
  return host::decode<T, kHeadDim, spec::soft_cap>(p);
}

Status prefill(const PrefillParams& p, LaunchContext) {
  return host::prefill<T, kHeadDim, spec::soft_cap>(p);
}

Status merge_states(const MergeParams& p, LaunchContext) {
  host::merge<T, T, kHeadDim>(p);
  return Status::Ok();
}

Status merge_two(const MergeTwoParams& p, LaunchContext) {
  return host::merge_two<T, kHeadDim>(p);
}

Status append_paged_kv(const AppendParams& p, LaunchContext) {
  return host::append_paged_kv<T, kHeadDim>(p);
}

}  // namespace kiln::attention
