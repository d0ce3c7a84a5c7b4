// //ops/attention:prefill, host backend: prefill() of attention.h for this module's dtype,
// head_dim, soft-cap flag and variant (custom mask, position encoding). Copied into the
// specialisation's generated directory.
#include "ops/attention/prefill_host.h"
#include "spec_config.h"

namespace kiln::attention {

Status prefill(const PrefillParams& p, LaunchContext) {
  constexpr PrefillPosEncoding kPos = prefill_pos_encoding(spec::pos_encoding);
  return host::prefill<spec::dtype, static_cast<int>(spec::head_dim), spec::soft_cap, spec::custom_mask, kPos>(p);
}

}  // namespace kiln::attention
