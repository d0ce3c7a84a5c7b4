// Gated-activation CUDA kernel and its launcher (see activation.h for the contract).
//
// Memory bound: each output element reads two input elements and writes one. A 2-D grid with one
// vector of each half per thread: blockIdx.x and the threads cover a row's vectors, so one long row
// (a decode token, d = 14336) still spreads over many SMs, and blockIdx.y is the row (looped only
// beyond CUDA's 65535). The grid is not capped at a few blocks per SM: with a row loop in every
// block the H200 streamed 8192 x 14336 at 3.5 TB/s, with a block per (row, 256 vectors) at 4.3
// (docs/perf/activation.md). Vectors are 16 bytes when both halves of every row and the output row
// are aligned to them (d, the strides and the pointers multiples of VEC); otherwise narrower, down
// to the scalar path for odd d. 16-bit types use the fast exponential and division (activation.h).
//
// Programmatic dependent launch (ops/common/pdl.cuh; launched so when ctx.pdl): the kernel waits
// for the one before it (pdl_wait) before any global access and lets the next one be scheduled
// (pdl_launch_dependents) at its end, after its last loads. A row's output does not depend on how
// the grid is split, so a kernel waiting on another through PDL reads exactly the bytes an
// ordinary launch would.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/activation/activation.h"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/pdl.cuh"
#include "ops/common/vec.cuh"

namespace kiln::activation {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y

template <typename T, int VEC, Act A>
__global__ void __launch_bounds__(kThreads) act_and_mul_kernel(const ActParams p) {
  using V = Vec<T, VEC>;
  constexpr bool kFast = sizeof(T) < 4;
  pdl_wait();
  const int64_t nvec = p.d / VEC;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* x = static_cast<const T*>(p.input) + row * p.in_stride;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < nvec; j += int64_t(gridDim.x) * kThreads) {
      const V a = V::load(x + j * VEC);
      const V b = V::load(x + p.d + j * VEC);
      V o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.set(k, apply<A, kFast>(a.get(k)) * b.get(k));
      o.store(out + j * VEC);
    }
  }
  pdl_launch_dependents();
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The widest vector (<= 16 bytes) that d, both row strides and both pointers allow.
template <typename T>
int choose_vec(const ActParams& p) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    const int64_t bytes = vec * int64_t(sizeof(T));
    if (p.d % vec == 0 && p.in_stride % vec == 0 && p.out_stride % vec == 0 && aligned(p.input, bytes) &&
        aligned(p.out, bytes))
      return vec;
  }
  return 1;
}

template <typename T>
Status launch_act_and_mul(const ActParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.d == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const int vec = choose_vec<T>(p);
  // Both loops stay in the kernel for what exceeds CUDA's grid limits (2^31 - 1 blocks in x).
  const int64_t grid_x = std::min<int64_t>(ceil_div<int64_t>(p.d / vec, kThreads), INT32_MAX);
  const int64_t grid_y = std::min<int64_t>(p.rows, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  bool launched = false;
  cudaError_t err = cudaSuccess;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    switch (p.act) {
      case Act::kSilu:
        err = kiln::launch(act_and_mul_kernel<T, VEC, Act::kSilu>, grid, dim3(kThreads), 0, ctx, p);
        launched = true;
        break;
      case Act::kGelu:
        err = kiln::launch(act_and_mul_kernel<T, VEC, Act::kGelu>, grid, dim3(kThreads), 0, ctx, p);
        launched = true;
        break;
      case Act::kGeluTanh:
        err = kiln::launch(act_and_mul_kernel<T, VEC, Act::kGeluTanh>, grid, dim3(kThreads), 0, ctx, p);
        launched = true;
        break;
    }
  };
  bool vec_ok = false;
  if constexpr (sizeof(T) == 4) {
    vec_ok = dispatch_value<1, 2, 4>(vec, with_vec);
  } else {
    vec_ok = dispatch_value<1, 2, 4, 8>(vec, with_vec);
  }
  if (!vec_ok || !launched) {
    return Status::Error(
        1, "act_and_mul: no kernel for vec=" + std::to_string(vec) + " act=" + std::to_string(static_cast<int>(p.act)));
  }
  const cudaError_t last = cudaGetLastError();  // also clears a launch error the runtime recorded
  return cuda_status(err != cudaSuccess ? err : last, "act_and_mul kernel launch");
}

}  // namespace kiln::activation
