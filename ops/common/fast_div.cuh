// Division by a run-time divisor fixed for a whole launch (a page size): built on the host, passed
// to the kernel, used in device code.
#pragma once

#include <cstdint>

namespace kiln {

// n / d for n < 2^31 with a multiply and a shift (Granlund-Montgomery): the attention kernels take
// the page of a token for every tile they copy, and a hardware-less 32-bit division costs ~20 instructions.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << s) < divisor) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - divisor)) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

}  // namespace kiln
