// Sum and max reductions over a group of threads: within a warp (groups of 1..32 lanes) and over a
// block. Every thread of the group must call them (no early return before the reduction).
#pragma once

#include <cmath>

namespace kiln {

// Sum over aligned groups of `width` consecutive lanes (width a power of two <= 32); every lane
// of a group gets the group's sum.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The max (IsMax) or the sum over the whole block (blockDim.x a multiple of 32, blockDim.y ==
// blockDim.z == 1); every thread gets it, and every block combines its values in the same order,
// so equal inputs give equal bits. `scratch` is one float of shared memory per warp, free to reuse
// after the call.
template <bool IsMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, offset);
    v = IsMax ? fmaxf(v, w) : v + w;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : (IsMax ? -INFINITY : 0.0f);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, offset);
    v = IsMax ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // scratch may be reused by the caller
  return v;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce<false>(v, scratch);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<true>(v, scratch);
}

}  // namespace kiln
