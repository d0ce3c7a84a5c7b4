// //ops/attention:page, host backend: append_paged_kv() of attention.h for this module's dtype, kv
// dtype and head_dim. Copied into the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

Status append_paged_kv(const AppendParams& p, LaunchContext) {
  return host::append_paged_kv<spec::dtype, spec::kv_dtype, static_cast<int>(spec::head_dim)>(p);
}

}  // namespace kiln::attention
