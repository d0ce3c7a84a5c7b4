// RMSNorm CUDA kernels and their launcher (see norm.h for the contract).
//
// Memory bound: a row is read once and written once (fused: x and residual read, both written).
// Two kernels:
//   rmsnorm_rows   the row lives in registers. A group of G threads owns a row, each thread
//                  ITEMS vectors of VEC elements (16-byte loads when aligned); all loads are
//                  issued before any arithmetic. G <= 32: several rows per block, warp-shuffle
//                  reduction; G > 32: one row per block, block reduction. Covers rows of up to
//                  1024 * 8 vectors (65536 bf16 elements).
//   rmsnorm_rows_large  longer rows: one block per row, two passes over global memory (the second
//                  mostly from L2).
// The launcher picks VEC from alignment and cols, ITEMS and G from the shape (one table:
// choose_shape), and reports unsupported shapes and launch errors as a Status.
//
// QUANT (rmsnorm_quant, fused_add_rmsnorm_quant): the same kernels, the normalised value times
// 1 / scale stored as fp8 (norm.h); the scale is loaded with the row, its reciprocal taken after
// the reduction, so the row's loads do not wait on it.
//
// Programmatic dependent launch (ops/common/pdl.cuh; launched so when ctx.pdl): each kernel waits
// for the kernel before it (pdl_wait) first thing, before any global access, and lets the next
// one be scheduled (pdl_launch_dependents) at its end, after its last loads. (Triggered right
// after the row's loads instead, the register-resident kernels with ITEMS <= 2 came out of ptxas
// with a few hundred sm_90 instructions rescheduled; first and last, the two instructions are all
// that changes, and nothing at all below sm_90.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/pdl.cuh"
#include "ops/common/reduce.cuh"
#include "ops/common/vec.cuh"
#include "ops/norm/norm.h"

namespace kiln::norm {

constexpr int kMaxThreads = 1024;
constexpr int kMaxItems = 8;           // vectors per thread in the register-resident kernel
constexpr int kThreadsPerBlock = 256;  // block size when several rows share a block (G <= 32)

// Threads per row allowed for a given ITEMS: 4 or more vectors per thread need more than the 64
// registers a 1024-thread block leaves each thread, so those kernels are bounded to 512 threads
// (128 registers) and never spill the row to local memory.
constexpr int max_group(int items) {
  return items >= 4 ? 512 : kMaxThreads;
}

__device__ __forceinline__ int64_t row_offset(int64_t row, int64_t d1, int64_t s0, int64_t s1) {
  return (row / d1) * s0 + (row % d1) * s1;
}

// The *_quant ops are the same kernels with QuantNormParams / QuantLayerNormParams (norm.h) for
// parameters: `kQuant<P>` says which.
template <typename P>
inline constexpr bool kQuant = std::is_same_v<P, QuantNormParams> || std::is_same_v<P, QuantLayerNormParams>;

// The *_quant ops' scale: a float32 in device memory (read after pdl_wait), or the value given.
__device__ __forceinline__ float load_scale(const QuantArgs& q) {
  return q.scale != nullptr ? *q.scale : q.scale_value;
}

// One value rounded to fp8 bits of `format`: nearest even, saturated at the largest finite value
// (the conversion instruction's SATFINITE from sm_89 on; below it, dtypes.h's integer encoder, the
// same rounding in a few integer instructions, where the toolkit would emulate it through double).
__device__ __forceinline__ uint8_t to_fp8(float v, Fp8Format format) {
#if __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::kE5M2 ? __NV_E5M2 : __NV_E4M3));
#else
  return format == Fp8Format::kE5M2 ? float_to_e5m2_satfinite(v) : float_to_e4m3_satfinite(v);
#endif
}

// The *_quant epilogue: VEC values, each times scale_inv, rounded to fp8 of `format` and stored at
// out + at (fp8 elements).
template <int VEC>
__device__ __forceinline__ void store_fp8(void* out, int64_t at, Fp8Format format, const float (&y)[VEC],
                                          float scale_inv) {
  Vec<uint8_t, VEC> o;
#pragma unroll
  for (int k = 0; k < VEC; ++k) o.v[k] = to_fp8(y[k] * scale_inv, format);
  o.store(static_cast<uint8_t*>(out) + at);
}

template <typename T, int VEC, int ITEMS, bool FUSED, typename P>
__global__ void __launch_bounds__(max_group(ITEMS)) rmsnorm_rows(const P p) {
  constexpr bool QUANT = kQuant<P>;
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  pdl_wait();
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows();
  const int64_t nvec = p.cols / VEC;
  const int group = blockDim.x;

  const T* x = static_cast<const T*>(p.input) + (valid ? row_offset(row, p.d1, p.in_stride0, p.in_stride1) : 0);
  T* res =
      FUSED ? static_cast<T*>(p.residual) + (valid ? row_offset(row, p.d1, p.res_stride0, p.res_stride1) : 0) : nullptr;
  const T* w = static_cast<const T*>(p.weight);

  // Issue every load of the row before using any of them. With few vectors per thread the weight
  // is loaded up front too; with more, registers go to occupancy instead and the weight (hot in
  // L1/L2, shared by every row) is loaded after the reduction.
  constexpr bool kPreloadWeight = ITEMS <= 2;
  V xv[ITEMS], rv[ITEMS], wv[ITEMS];
  float scale = 1.0f;
  if constexpr (QUANT) scale = load_scale(p.quant);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * group;
    if (valid && j < nvec) {
      xv[i] = V::load(x + j * VEC);
      if constexpr (FUSED) rv[i] = V::load(res + j * VEC);
      if constexpr (kPreloadWeight) wv[i] = V::load_ro(w + j * VEC);
    }
  }

  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * group;
    if (valid && j < nvec) {
      if constexpr (FUSED) {
        // residual += x, rounded to T; the rounded sum is both stored and normalised, so the
        // result equals the unfused sequence `residual += x; x = rmsnorm(residual)`.
#pragma unroll
        for (int k = 0; k < VEC; ++k) xv[i].set(k, xv[i].get(k) + rv[i].get(k));
        xv[i].store(res + j * VEC);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float v = xv[i].get(k);
        sum_sq += v * v;
      }
    }
  }
  sum_sq = group <= 32 ? group_sum(sum_sq, group) : block_sum(sum_sq, scratch);
  if (!valid) return;
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(p.cols) + p.eps);

  const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
  T* out = static_cast<T*>(p.out) + out_at;
  [[maybe_unused]] const float scale_inv = 1.0f / scale;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * group;
    if (j < nvec) {
      if constexpr (!kPreloadWeight) wv[i] = V::load_ro(w + j * VEC);
      if constexpr (QUANT) {
        float y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = xv[i].get(k) * inv_rms * (wv[i].get(k) + p.weight_offset);
        store_fp8<VEC>(p.out, out_at + j * VEC, p.quant.format, y, scale_inv);
      } else {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.set(k, xv[i].get(k) * inv_rms * (wv[i].get(k) + p.weight_offset));
        o.store(out + j * VEC);
      }
    }
  }
  pdl_launch_dependents();
}

template <typename T, int VEC, bool FUSED, typename P>
__global__ void __launch_bounds__(kMaxThreads) rmsnorm_rows_large(const P p) {
  constexpr bool QUANT = kQuant<P>;
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  pdl_wait();
  const int64_t row = blockIdx.x;
  const int64_t nvec = p.cols / VEC;
  const T* x = static_cast<const T*>(p.input) + row_offset(row, p.d1, p.in_stride0, p.in_stride1);
  T* res = FUSED ? static_cast<T*>(p.residual) + row_offset(row, p.d1, p.res_stride0, p.res_stride1) : nullptr;
  const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
  T* out = static_cast<T*>(p.out) + out_at;
  const T* w = static_cast<const T*>(p.weight);

  float scale = 1.0f;
  if constexpr (QUANT) scale = load_scale(p.quant);
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    V xv = V::load(x + j * VEC);
    if constexpr (FUSED) {
      const V rv = V::load(res + j * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) xv.set(k, xv.get(k) + rv.get(k));
      xv.store(res + j * VEC);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum_sq += xv.get(k) * xv.get(k);
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(p.cols) + p.eps);
  [[maybe_unused]] const float scale_inv = 1.0f / scale;
  // Second pass: each thread re-reads exactly the vectors it wrote (fused) or read in pass one.
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    const V xv = FUSED ? V::load(res + j * VEC) : V::load(x + j * VEC);
    const V wv = V::load_ro(w + j * VEC);
    if constexpr (QUANT) {
      float y[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) y[k] = xv.get(k) * inv_rms * (wv.get(k) + p.weight_offset);
      store_fp8<VEC>(p.out, out_at + j * VEC, p.quant.format, y, scale_inv);
    } else {
      V o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.set(k, xv.get(k) * inv_rms * (wv.get(k) + p.weight_offset));
      o.store(out + j * VEC);
    }
  }
  pdl_launch_dependents();
}

// How a launch is shaped. One table of choices, documented here.
struct LaunchShape {
  int vec;             // elements per vector access (16-byte when alignment allows)
  int items;           // vectors per thread (register-resident kernel); 0 = the two-pass kernel
  int group;           // threads per row (blockDim.x)
  int rows_per_block;  // blockDim.y
  int64_t blocks;
};

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The widest vector (<= 16 bytes of T) that every row start, the weight and cols allow; `out`
// holds T, or one byte per element (fp8) for the *_quant ops.
template <typename T>
int choose_vec(const NormParams& p, bool fused, int64_t out_elem) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    const int64_t bytes = vec * int64_t(sizeof(T));
    bool ok = p.cols % vec == 0 && aligned(p.out, vec * out_elem) && aligned(p.input, bytes) &&
              aligned(p.weight, bytes) && p.out_stride0 % vec == 0 && p.out_stride1 % vec == 0 &&
              p.in_stride0 % vec == 0 && p.in_stride1 % vec == 0;
    if (fused) ok = ok && aligned(p.residual, bytes) && p.res_stride0 % vec == 0 && p.res_stride1 % vec == 0;
    if (ok) return vec;
  }
  return 1;
}

template <typename T>
LaunchShape choose_shape(const NormParams& p, bool fused, int64_t out_elem, int sms) {
  LaunchShape s{};
  s.vec = choose_vec<T>(p, fused, out_elem);
  const int64_t nvec = p.cols / s.vec;
  const int64_t rows = p.rows();
  // Enough rows to fill every SM several times: 4 vectors per thread (more loads in flight per
  // thread, fewer threads per row). Few rows: spread each row over more threads instead.
  int64_t items = rows >= 4 * int64_t(sms) ? 4 : 1;
  int64_t group = next_pow2(ceil_div<int64_t>(nvec, items));
  while (group > max_group(int(items)) && items <= kMaxItems) {
    items *= 2;
    group = next_pow2(ceil_div<int64_t>(nvec, items));
  }
  if (items > kMaxItems) {  // row longer than the registers of one block hold
    s.items = 0;
    s.group = kMaxThreads;
    s.rows_per_block = 1;
    s.blocks = rows;
    return s;
  }
  s.items = int(items);
  s.group = int(group);
  s.rows_per_block = group <= 32 ? kThreadsPerBlock / int(group) : 1;
  s.blocks = ceil_div<int64_t>(rows, s.rows_per_block);
  return s;
}

// P: NormParams, or QuantNormParams for the *_quant ops (fp8 out: one byte an element).
template <typename T, bool FUSED, typename P>
Status launch_rmsnorm(const P& p, LaunchContext ctx) {
  if (p.rows() == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const LaunchShape s = choose_shape<T>(p, FUSED, kQuant<P> ? 1 : int64_t(sizeof(T)), sm_count());
  if (s.blocks > 0x7fffffffLL) {
    return Status::Error(1, "rmsnorm: " + std::to_string(p.rows()) + " rows exceed the grid limit");
  }
  const dim3 grid(static_cast<unsigned>(s.blocks));
  const dim3 block(s.group, s.rows_per_block);
  bool launched = false;
  cudaError_t err = cudaSuccess;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if (s.items == 0) {
      err = kiln::launch(rmsnorm_rows_large<T, VEC, FUSED, P>, grid, block, 0, ctx, p);
      launched = true;
      return;
    }
    launched = dispatch_value<1, 2, 4, 8>(s.items, [&](auto kItems) {
      err = kiln::launch(rmsnorm_rows<T, VEC, decltype(kItems)::value, FUSED, P>, grid, block, 0, ctx, p);
    });
  };
  bool vec_ok = false;
  if constexpr (sizeof(T) == 4) {
    vec_ok = dispatch_value<1, 2, 4>(s.vec, with_vec);
  } else {
    vec_ok = dispatch_value<1, 2, 4, 8>(s.vec, with_vec);
  }
  if (!vec_ok || !launched) {
    return Status::Error(1, "rmsnorm: no kernel for vec=" + std::to_string(s.vec) + " items=" +
                                std::to_string(s.items) + " (allowed items: " + allowed_values<1, 2, 4, 8>() + ")");
  }
  const cudaError_t last = cudaGetLastError();  // also clears a launch error the runtime recorded
  return cuda_status(err != cudaSuccess ? err : last, "rmsnorm kernel launch");
}

}  // namespace kiln::norm
