// //ops/attention:positions, CUDA backend: batch_indices_positions() of attention.h. One thread per
// appended token; token_position (attention.h) finds its request and position and checks the
// inputs on the way (an error is recorded and the token gets -1, never a read out of range).
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/attention/attention.h"
#include "ops/common/cuda_utils.cuh"
#include "spec_config.h"

namespace kiln::attention {

constexpr int kPositionsThreads = 256;

__global__ void __launch_bounds__(kPositionsThreads) positions_kernel(const PositionsParams p, int64_t* errors) {
  const int64_t i = int64_t(blockIdx.x) * kPositionsThreads + threadIdx.x;
  if (i == 0) check_append_indptr(p, errors);
  if (i < p.nnz) token_position(p, i, errors);
}

Status batch_indices_positions(const PositionsParams& p, LaunchContext ctx) {
  // One block at least: the indptr is checked also when there is no token.
  const int64_t blocks = std::max<int64_t>(1, (p.nnz + kPositionsThreads - 1) / kPositionsThreads);
  if (blocks > 0x7fffffffLL) return Status::Error(1, "get_batch_indices_positions: too many tokens for one launch");
  DeviceGuard guard(ctx.device);
  positions_kernel<<<static_cast<unsigned>(blocks), kPositionsThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
      p, ctx.errors);
  return cuda_status(cudaGetLastError(), "get_batch_indices_positions kernel launch");
}

}  // namespace kiln::attention
