// //ops/attention:decode, host backend: decode() of attention.h for this module's dtype, kv
// dtype, head_dim, soft-cap and RoPE flags. Copied into the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

Status decode(const DecodeParams& p, LaunchContext) {
  return host::decode<spec::dtype, spec::kv_dtype, static_cast<int>(spec::head_dim), spec::soft_cap, spec::rope>(p);
}

}  // namespace kiln::attention
