// LayerNorm CUDA kernels and their launcher (see norm.h for the contract).
//
// Memory bound like RMSNorm: a row is read once and written once; gamma and beta (float32, shared
// by every row) stay in L1/L2. One block per row:
//   layernorm_rows        the row lives in registers (ITEMS vectors of VEC elements per thread);
//                         the mean, then the sum of squared deviations from it (two block
//                         reductions over the registers: no cancellation of E[x^2] - mean^2).
//   layernorm_rows_large  rows longer than the registers of a block hold: three passes over
//                         global memory (the second and third mostly from L2).
// The vector width, ITEMS and threads per row come from one place: choose_layernorm_shape.
// QUANT (layernorm_quant): the same kernels storing fp8(y / scale) (norm.h, norm.cuh's store_fp8).
// LayerNorm takes no enable_pdl (FlashInfer's layernorm has none): these kernels are launched
// without programmatic dependent launch and do not wait for one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/reduce.cuh"
#include "ops/common/vec.cuh"
#include "ops/norm/norm.cuh"

namespace kiln::norm {

// The quantised kernels ask for one block an SM at least (0: no request, the unquantised ones' own
// bounds): without it ptxas held the ITEMS = 8 kernels to 64 registers on sm_80 and spilled 8 bytes;
// with it they take 72 and spill nothing.
template <typename T, int VEC, int ITEMS, typename P>
__global__ void __launch_bounds__(max_group(ITEMS), kQuant<P> ? 1 : 0) layernorm_rows(const P p) {
  constexpr bool QUANT = kQuant<P>;
  using V = Vec<T, VEC>;
  using F = Vec<float, VEC>;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t nvec = p.cols / VEC;
  const T* x = static_cast<const T*>(p.input) + row_offset(row, p.d1, p.in_stride0, p.in_stride1);
  V xv[ITEMS];
  float scale = 1.0f;
  if constexpr (QUANT) scale = load_scale(p.quant);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < nvec) xv[i] = V::load(x + j * VEC);
  }
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < nvec) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += xv[i].get(k);
    }
  }
  const float mean = block_sum(sum, scratch) / static_cast<float>(p.cols);
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < nvec) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = xv[i].get(k) - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = rsqrtf(block_sum(sq, scratch) / static_cast<float>(p.cols) + p.eps);
  const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
  T* out = static_cast<T*>(p.out) + out_at;
  [[maybe_unused]] const float scale_inv = 1.0f / scale;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < nvec) {
      const F g = *reinterpret_cast<const F*>(p.gamma + j * VEC);
      const F b = *reinterpret_cast<const F*>(p.beta + j * VEC);
      if constexpr (QUANT) {
        float y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = (xv[i].get(k) - mean) * rstd * g.v[k] + b.v[k];
        store_fp8<VEC>(p.out, out_at + j * VEC, p.quant.format, y, scale_inv);
      } else {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.set(k, (xv[i].get(k) - mean) * rstd * g.v[k] + b.v[k]);
        o.store(out + j * VEC);
      }
    }
  }
}

template <typename T, int VEC, typename P>
__global__ void __launch_bounds__(kMaxThreads) layernorm_rows_large(const P p) {
  constexpr bool QUANT = kQuant<P>;
  using V = Vec<T, VEC>;
  using F = Vec<float, VEC>;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t nvec = p.cols / VEC;
  const T* x = static_cast<const T*>(p.input) + row_offset(row, p.d1, p.in_stride0, p.in_stride1);
  const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
  T* out = static_cast<T*>(p.out) + out_at;
  float scale = 1.0f;
  if constexpr (QUANT) scale = load_scale(p.quant);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    const V xv = V::load(x + j * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += xv.get(k);
  }
  const float mean = block_sum(sum, scratch) / static_cast<float>(p.cols);
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    const V xv = V::load(x + j * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = xv.get(k) - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(block_sum(sq, scratch) / static_cast<float>(p.cols) + p.eps);
  [[maybe_unused]] const float scale_inv = 1.0f / scale;
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    const V xv = V::load(x + j * VEC);
    const F g = *reinterpret_cast<const F*>(p.gamma + j * VEC);
    const F b = *reinterpret_cast<const F*>(p.beta + j * VEC);
    if constexpr (QUANT) {
      float y[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) y[k] = (xv.get(k) - mean) * rstd * g.v[k] + b.v[k];
      store_fp8<VEC>(p.out, out_at + j * VEC, p.quant.format, y, scale_inv);
    } else {
      V o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.set(k, (xv.get(k) - mean) * rstd * g.v[k] + b.v[k]);
      o.store(out + j * VEC);
    }
  }
}

// The widest vector (<= 16 bytes of T) that cols, the row starts and strides, and gamma/beta (read
// as VEC floats) allow.
template <typename T>
int choose_layernorm_vec(const LayerNormParams& p, int64_t out_elem) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    const int64_t bytes = vec * int64_t(sizeof(T));
    const int64_t fbytes = vec * int64_t(sizeof(float));
    if (p.cols % vec == 0 && aligned(p.out, vec * out_elem) && aligned(p.input, bytes) && aligned(p.gamma, fbytes) &&
        aligned(p.beta, fbytes) && p.out_stride0 % vec == 0 && p.out_stride1 % vec == 0 && p.in_stride0 % vec == 0 &&
        p.in_stride1 % vec == 0)
      return vec;
  }
  return 1;
}

// Threads per row: a power of two >= 32 (block_sum's warps), ITEMS as rmsnorm's choose_shape picks.
template <typename T>
LaunchShape choose_layernorm_shape(const LayerNormParams& p, int64_t out_elem, int sms) {
  LaunchShape s{};
  s.vec = choose_layernorm_vec<T>(p, out_elem);
  const int64_t nvec = p.cols / s.vec;
  int64_t items = p.rows() >= 4 * int64_t(sms) ? 4 : 1;
  int64_t group = std::max<int64_t>(32, next_pow2(ceil_div<int64_t>(nvec, items)));
  while (group > max_group(int(items)) && items <= kMaxItems) {
    items *= 2;
    group = std::max<int64_t>(32, next_pow2(ceil_div<int64_t>(nvec, items)));
  }
  s.rows_per_block = 1;
  s.blocks = p.rows();
  if (items > kMaxItems) {
    s.items = 0;
    s.group = kMaxThreads;
    return s;
  }
  s.items = int(items);
  s.group = int(group);
  return s;
}

// P: LayerNormParams, or QuantLayerNormParams for layernorm_quant (fp8 out: one byte an element).
template <typename T, typename P>
Status launch_layernorm(const P& p, LaunchContext ctx) {
  if (p.rows() == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const LaunchShape s = choose_layernorm_shape<T>(p, kQuant<P> ? 1 : int64_t(sizeof(T)), sm_count());
  if (s.blocks > 0x7fffffffLL) {
    return Status::Error(1, "layernorm: " + std::to_string(p.rows()) + " rows exceed the grid limit");
  }
  bool launched = false;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if (s.items == 0) {
      layernorm_rows_large<T, VEC, P><<<unsigned(s.blocks), s.group, 0, stream>>>(p);
      launched = true;
      return;
    }
    launched = dispatch_value<1, 2, 4, 8>(s.items, [&](auto kItems) {
      layernorm_rows<T, VEC, decltype(kItems)::value, P><<<unsigned(s.blocks), s.group, 0, stream>>>(p);
    });
  };
  bool vec_ok = false;
  if constexpr (sizeof(T) == 4) {
    vec_ok = dispatch_value<1, 2, 4>(s.vec, with_vec);
  } else {
    vec_ok = dispatch_value<1, 2, 4, 8>(s.vec, with_vec);
  }
  if (!vec_ok || !launched) {
    return Status::Error(1, "layernorm: no kernel for vec=" + std::to_string(s.vec) + " items=" +
                                std::to_string(s.items) + " (allowed items: " + allowed_values<1, 2, 4, 8>() + ")");
  }
  return cuda_status(cudaGetLastError(), "layernorm kernel launch");
}

}  // namespace kiln::norm
