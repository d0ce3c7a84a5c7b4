// Sum reductions over a group of threads: within a warp (groups of 1..32 lanes) and over a block.
// Every thread of the group must call them (no early return before the reduction).
#pragma once

namespace kiln {

// Sum over aligned groups of `width` consecutive lanes (width a power of two <= 32); every lane
// of a group gets the group's sum.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, blockDim.y == blockDim.z == 1); every
// thread gets the sum. `scratch` is 32 floats of shared memory, free to reuse after the call.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = group_sum(v, 32);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = group_sum(v, 32);
  __syncthreads();  // scratch may be reused by the caller
  return v;
}

}  // namespace kiln
