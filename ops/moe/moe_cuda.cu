// //ops:moe, CUDA backend: the entry points of moe.h for this module's dtype (the dtype of the
// router logits for topk, of the hidden states for gather and unpermute; sort takes int32 ids).
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/moe/moe.cuh"
#include "spec_config.h"

namespace kiln::moe {

Status topk(const TopkParams& p, LaunchContext ctx) {
  return launch_topk<spec::dtype>(p, ctx);
}
Status sort(const SortParams& p, LaunchContext ctx) {
  return launch_sort(p, ctx);
}
Status gather(const GatherParams& p, LaunchContext ctx) {
  return launch_gather<spec::dtype>(p, ctx);
}
Status unpermute(const UnpermuteParams& p, LaunchContext ctx) {
  return launch_unpermute<spec::dtype>(p, ctx);
}
Status experts(const ExpertsParams& p, LaunchContext ctx) {
  return launch_experts<spec::dtype>(p, ctx);
}
Status dequant(const DequantParams& p, LaunchContext ctx) {
  return launch_dequant<spec::dtype>(p, ctx);
}
Status expert_act(const ExpertActParams& p, LaunchContext ctx) {
  return launch_expert_act<spec::dtype>(p, ctx);
}

}  // namespace kiln::moe
