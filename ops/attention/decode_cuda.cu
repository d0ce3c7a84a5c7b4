// //ops/attention:decode, CUDA backend: decode() of attention.h for this module's dtype, kv dtype,
// head_dim, soft-cap and RoPE flags (the split-KV merge included). Copied into the
// specialisation's generated directory.
#include "ops/attention/decode.cuh"
#include "spec_config.h"

namespace kiln::attention {

Status decode(const DecodeParams& p, LaunchContext ctx) {
  return launch_decode<spec::dtype, spec::kv_dtype, static_cast<int>(spec::head_dim), spec::soft_cap, spec::rope>(p,
                                                                                                                  ctx);
}

}  // namespace kiln::attention
