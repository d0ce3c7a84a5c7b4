// Small integer helpers shared by launchers (host and device).
#pragma once

#include <cstdint>

#include "ops/common/macros.h"

namespace kiln {

template <typename T>
KILN_HOST_DEVICE constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// The smallest power of two >= x (x >= 1).
KILN_HOST_DEVICE constexpr int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace kiln
