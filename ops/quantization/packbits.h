// Bit packing (numpy.packbits) of boolean arrays: the parameters and the entry point shared by the
// CUDA and the host backends.
//
// Segment s of the input, x[indptr[s], indptr[s + 1]), packs into the bytes
// y[out_indptr[s], out_indptr[s + 1]) (out_indptr[s + 1] - out_indptr[s] = ceil(segment length / 8)):
// byte j of the segment holds elements 8j .. 8j + 7, the first in the most significant bit ("big",
// numpy's default) or the least ("little"); bits past the segment's end are 0. A nonzero byte of x
// is a 1. Without indptr (packbits) the whole of x is one segment and y has ceil(n / 8) bytes.
//
// Layout: x [n] bytes with a free stride (elements), y [y_len] contiguous bytes, indptr and
// out_indptr [segments + 1] int64. Memory safety holds for any index values: each byte of y is
// written once from its segment (found by a binary search of out_indptr), and x is read only
// inside [max(indptr[s], 0), min(indptr[s + 1], n)). Framework free.
#pragma once

#include <cstdint>

#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::quantization {

struct PackbitsParams {
  const uint8_t* x;
  int64_t n, x_stride;
  uint8_t* y;
  int64_t y_len;
  bool little;                // bit order: element 8j + k at bit k (else at bit 7 - k)
  const int64_t* indptr;      // [segments + 1], or null: one segment, all of x
  const int64_t* out_indptr;  // [segments + 1], with indptr
  int64_t segments;
};

// The segment holding output byte j and its input range [*lo, *hi), clipped to [0, n); false when
// no segment holds j (inconsistent out_indptr): the byte is then written as 0.
KILN_HOST_DEVICE bool byte_source(const PackbitsParams& p, int64_t j, int64_t* first, int64_t* lo, int64_t* hi) {
  int64_t s = 0, out0 = 0, in0 = 0, in1 = p.n;
  if (p.indptr != nullptr) {
    if (p.segments <= 0 || j < p.out_indptr[0]) return false;
    int64_t a = 0, b = p.segments - 1;  // the last s with out_indptr[s] <= j
    while (a < b) {
      const int64_t mid = (a + b + 1) / 2;
      if (p.out_indptr[mid] <= j) {
        a = mid;
      } else {
        b = mid - 1;
      }
    }
    s = a;
    if (j >= p.out_indptr[s + 1]) return false;
    out0 = p.out_indptr[s];
    in0 = p.indptr[s];
    in1 = p.indptr[s + 1];
  }
  *first = in0 + 8 * (j - out0);
  *lo = in0 < 0 ? 0 : in0;
  *hi = in1 > p.n ? p.n : in1;
  return true;
}

// The byte from elements first .. first + 7 (those outside [lo, hi) read as 0).
KILN_HOST_DEVICE uint8_t pack_byte(const PackbitsParams& p, int64_t first, int64_t lo, int64_t hi) {
  uint32_t byte = 0;
  for (int k = 0; k < 8; ++k) {
    const int64_t i = first + k;
    const uint32_t bit = (i >= lo && i < hi && p.x[i * p.x_stride] != 0) ? 1u : 0u;
    byte |= bit << (p.little ? k : 7 - k);
  }
  return static_cast<uint8_t>(byte);
}

// Implemented once per backend (packbits_cuda.cu, packbits_host.cc).
Status packbits(const PackbitsParams& p, LaunchContext ctx);

}  // namespace kiln::quantization
