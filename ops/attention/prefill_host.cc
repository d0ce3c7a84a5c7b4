// //ops/attention:prefill, host backend: prefill() of attention.h for this module's dtype,
// head_dim and soft-cap flag. Copied into the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

Status prefill(const PrefillParams& p, LaunchContext) {
  return host::prefill<spec::dtype, static_cast<int>(spec::head_dim), spec::soft_cap>(p);
}

}  // namespace kiln::attention
