// Attention states in the log2 domain, shared by the CUDA and host backends.
//
// A state of one query head over a set of keys is (o, lse): o the softmax-weighted sum of values,
// lse = log2(sum exp(logit)). Merging states weights each by exp2(lse_i - max) (the standard
// split-softmax identity); an empty state has lse = -inf and contributes nothing.
#pragma once

#include <cmath>
#include <limits>

#include "ops/common/macros.h"

namespace kiln::attention {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x * log2e)

KILN_HOST_DEVICE float neg_inf() {
  return -std::numeric_limits<float>::infinity();
}

// What an output the kernel could not compute (an index out of range) holds.
KILN_HOST_DEVICE float quiet_nan() {
  return std::numeric_limits<float>::quiet_NaN();
}

// exp2(x - max) that is 0 (not NaN) when both are -inf.
KILN_HOST_DEVICE float scale_from(float x, float max) {
#if defined(__CUDA_ARCH__)
  return x == neg_inf() ? 0.0f : exp2f(x - max);
#else
  return x == neg_inf() ? 0.0f : std::exp2(x - max);
#endif
}

// lse of a merged state from its max and the sum of exp2(lse_i - max).
KILN_HOST_DEVICE float merged_lse(float max, float sum) {
#if defined(__CUDA_ARCH__)
  return sum > 0.0f ? max + log2f(sum) : neg_inf();
#else
  return sum > 0.0f ? max + std::log2(sum) : neg_inf();
#endif
}

}  // namespace kiln::attention
