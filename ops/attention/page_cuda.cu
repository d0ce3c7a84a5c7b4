// //ops/attention:page, CUDA backend: append_paged_kv() of attention.h for this module's dtype, kv
// dtype and head_dim. Copied into the specialisation's generated directory.
#include "ops/attention/page.cuh"
#include "spec_config.h"

namespace kiln::attention {

Status append_paged_kv(const AppendParams& p, LaunchContext ctx) {
  return launch_append_paged_kv<spec::dtype, spec::kv_dtype, static_cast<int>(spec::head_dim)>(p, ctx);
}

}  // namespace kiln::attention
