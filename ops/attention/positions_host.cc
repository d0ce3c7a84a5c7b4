// //ops/attention:positions, host backend: batch_indices_positions() of attention.h. Copied into
// the specialisation's generated directory.
#include "ops/attention/attention_host.h"
#include "spec_config.h"

namespace kiln::attention {

Status batch_indices_positions(const PositionsParams& p, LaunchContext) {
  return host::batch_indices_positions(p);
}

}  // namespace kiln::attention
