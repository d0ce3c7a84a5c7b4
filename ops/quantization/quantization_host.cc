// //ops:quantization, host backend: the entry points of quantization.h for this module's dtype.
// The same float32 arithmetic and rounding as the CUDA kernels, on the calling thread. Copied into
// the specialisation's generated directory, next to its spec_config.h.
#include <cmath>

#include "ops/common/dtypes.h"
#include "ops/quantization/quantization.h"
#include "spec_config.h"

namespace kiln::quantization {

namespace {

using C = Convert<spec::dtype>;

uint8_t quantize(float x, float scale) {
  return scale == 0.0f ? uint8_t(0) : float_to_e4m3_satfinite(x / scale);
}

}  // namespace

Status per_token_group_quant(const GroupQuantParams& p, LaunchContext) {
  const int64_t groups = p.group_size > 0 ? p.cols / p.group_size : 0;
  for (int64_t row = 0; row < p.rows; ++row) {
    const auto* x = static_cast<const spec::dtype*>(p.input) + row * p.in_stride;
    uint8_t* out = static_cast<uint8_t*>(p.out) + row * p.out_stride;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * p.group_size;
      float amax = 0.0f;
      for (int64_t j = c0; j < c0 + p.group_size; ++j) amax = std::fmax(amax, std::fabs(C::to_float(x[j])));
      const float scale = amax / kE4M3Max;
      p.scales[row * p.scale_stride_row + g * p.scale_stride_group] = scale;
      for (int64_t j = c0; j < c0 + p.group_size; ++j) out[j] = quantize(C::to_float(x[j]), scale);
    }
  }
  return Status::Ok();
}

Status scaled_fp8_quant(const TensorQuantParams& p, LaunchContext) {
  if (p.dynamic) {
    float amax = 0.0f;
    for (int64_t row = 0; row < p.rows; ++row) {
      const auto* x = static_cast<const spec::dtype*>(p.input) + row * p.in_stride;
      for (int64_t j = 0; j < p.cols; ++j) amax = std::fmax(amax, std::fabs(C::to_float(x[j])));
    }
    *p.scale = amax / kE4M3Max;
  }
  const float scale = *p.scale;
  for (int64_t row = 0; row < p.rows; ++row) {
    const auto* x = static_cast<const spec::dtype*>(p.input) + row * p.in_stride;
    uint8_t* out = static_cast<uint8_t*>(p.out) + row * p.out_stride;
    for (int64_t j = 0; j < p.cols; ++j) out[j] = quantize(C::to_float(x[j]), scale);
  }
  return Status::Ok();
}

}  // namespace kiln::quantization
