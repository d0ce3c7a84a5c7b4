// //ops/quantization:packbits, host backend: packbits.h's entry point, one output byte after
// another on the calling thread. Copied into the target's generated directory.
#include "ops/quantization/packbits.h"

namespace kiln::quantization {

Status packbits(const PackbitsParams& p, LaunchContext) {
  for (int64_t j = 0; j < p.y_len; ++j) {
    int64_t first = 0, lo = 0, hi = 0;
    p.y[j] = byte_source(p, j, &first, &lo, &hi) ? pack_byte(p, first, lo, hi) : uint8_t(0);
  }
  return Status::Ok();
}

}  // namespace kiln::quantization
