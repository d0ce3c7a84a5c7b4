// //ops/quantization:packbits, CUDA backend: packbits.h's entry point. Memory bound: one thread an
// output byte (a grid-stride loop), its 8 input bytes read with one 8-byte load where the input is
// contiguous and the bytes lie inside the segment, one by one otherwise. Copied into the target's
// generated directory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/math.h"
#include "ops/quantization/packbits.h"

namespace kiln::quantization {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

__global__ void __launch_bounds__(kThreads) packbits_kernel(const PackbitsParams p) {
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < p.y_len; j += int64_t(gridDim.x) * kThreads) {
    int64_t first = 0, lo = 0, hi = 0;
    uint8_t byte = 0;
    if (byte_source(p, j, &first, &lo, &hi)) {
      const uint8_t* at = p.x + first;
      if (p.x_stride == 1 && first >= lo && first + 8 <= hi && reinterpret_cast<uintptr_t>(at) % 8 == 0) {
        const uint64_t v = *reinterpret_cast<const uint64_t*>(at);  // byte k is element first + k
        uint32_t b = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) b |= (((v >> (8 * k)) & 0xffu) != 0 ? 1u : 0u) << (p.little ? k : 7 - k);
        byte = static_cast<uint8_t>(b);
      } else {
        byte = pack_byte(p, first, lo, hi);
      }
    }
    p.y[j] = byte;
  }
}

}  // namespace

Status packbits(const PackbitsParams& p, LaunchContext ctx) {
  if (p.y_len == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(p.y_len, kThreads), int64_t(sm_count()) * kBlocksPerSm);
  packbits_kernel<<<unsigned(blocks), kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "packbits kernel launch");
}

}  // namespace kiln::quantization
