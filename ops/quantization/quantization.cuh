// fp8 quantisation CUDA kernels and their launchers (see quantization.h for the contract).
//
// Memory bound: each input element is read (twice for a group: the second pass from L1) and one
// byte written.
//   group_quant_kernel   G threads own a group (G a power of two <= 32, so a group's absmax is a
//                        shuffle within a warp); 256 threads a block, a grid-stride loop over groups.
//   absmax_kernel, finalize_scale_kernel, tensor_quant_kernel: the dynamic per-tensor path
//                        (block maxima combined with an atomicMax on the float's bits, which orders
//                        non-negative floats), then one quantisation pass; the static path runs
//                        the last kernel only.
// Vectors are 16 bytes of input where cols, group_size, the strides and the pointers allow.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/vec.cuh"
#include "ops/quantization/quantization.h"

namespace kiln::quantization {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

// VEC E4M3 bytes stored with one access.
template <int VEC>
struct alignas(VEC) Bytes {
  uint8_t b[VEC];
  __device__ __forceinline__ void store(uint8_t* ptr) const { *reinterpret_cast<Bytes*>(ptr) = *this; }
};

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// x / scale rounded to E4M3; 0 where the scale is 0 (an all-zero group or tensor).
__device__ __forceinline__ uint8_t quantize(float x, float scale) {
  return scale == 0.0f ? uint8_t(0) : to_e4m3(__fdiv_rn(x, scale));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) group_quant_kernel(const GroupQuantParams p, int G) {
  using V = Vec<T, VEC>;
  const int64_t groups_per_row = p.cols / p.group_size;
  const int64_t groups = p.rows * groups_per_row;
  const int64_t vecs = p.group_size / VEC;
  const int lane = threadIdx.x % G;
  const int64_t per_block = kThreads / G;
  for (int64_t g = int64_t(blockIdx.x) * per_block + threadIdx.x / G; g - threadIdx.x / G < groups;
       g += int64_t(gridDim.x) * per_block) {
    // Every thread of a warp takes part in the shuffle; a group past the end contributes nothing.
    const bool valid = g < groups;
    const int64_t row = valid ? g / groups_per_row : 0, col = valid ? (g % groups_per_row) * p.group_size : 0;
    const T* x = static_cast<const T*>(p.input) + row * p.in_stride + col;
    float amax = 0.0f;
    if (valid) {
      for (int64_t j = lane; j < vecs; j += G) {
        const V v = V::load(x + j * VEC);
#pragma unroll
        for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(v.get(k)));
      }
    }
    for (int offset = G >> 1; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (!valid) continue;
    const float scale = __fdiv_rn(amax, kE4M3Max);
    if (lane == 0) p.scales[row * p.scale_stride_row + (col / p.group_size) * p.scale_stride_group] = scale;
    uint8_t* out = static_cast<uint8_t*>(p.out) + row * p.out_stride + col;
    for (int64_t j = lane; j < vecs; j += G) {
      const V v = V::load(x + j * VEC);
      Bytes<VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.b[k] = quantize(v.get(k), scale);
      o.store(out + j * VEC);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) absmax_kernel(const TensorQuantParams p) {
  using V = Vec<T, VEC>;
  __shared__ float warp_max[kThreads / 32];
  const int64_t vecs_per_row = p.cols / VEC, total = p.rows * vecs_per_row;
  float amax = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = i / vecs_per_row, j = i % vecs_per_row;
    const V v = V::load(static_cast<const T*>(p.input) + row * p.in_stride + j * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(v.get(k)));
  }
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    // Non-negative floats order like their bits: an unsigned max is the float max.
    atomicMax(reinterpret_cast<unsigned int*>(p.scale), __float_as_uint(amax));
  }
}

__global__ void finalize_scale_kernel(float* scale) {
  *scale = __fdiv_rn(*scale, kE4M3Max);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) tensor_quant_kernel(const TensorQuantParams p) {
  using V = Vec<T, VEC>;
  const float scale = *p.scale;
  const int64_t vecs_per_row = p.cols / VEC, total = p.rows * vecs_per_row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = i / vecs_per_row, j = i % vecs_per_row;
    const V v = V::load(static_cast<const T*>(p.input) + row * p.in_stride + j * VEC);
    Bytes<VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.b[k] = quantize(v.get(k), scale);
    o.store(static_cast<uint8_t*>(p.out) + row * p.out_stride + j * VEC);
  }
}

inline bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// The widest vector (<= 16 bytes of input) that `unit` (cols or group_size), the strides and the
// pointers allow; the output vector is VEC bytes.
template <typename T>
int choose_vec(int64_t unit, int64_t in_stride, int64_t out_stride, const void* in, const void* out) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    if (unit % vec == 0 && in_stride % vec == 0 && out_stride % vec == 0 && aligned(in, vec * int64_t(sizeof(T))) &&
        aligned(out, vec))
      return vec;
  }
  return 1;
}

template <typename F>
bool with_vec_of(int vec, F&& f) {
  return dispatch_value<1, 2, 4, 8>(vec, f);
}

inline int64_t grid_for(int64_t work_items, int64_t per_block) {
  return std::max<int64_t>(
      1, std::min<int64_t>(ceil_div<int64_t>(work_items, per_block), int64_t(sm_count()) * kBlocksPerSm));
}

template <typename T>
Status launch_group(const GroupQuantParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.cols == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int vec = choose_vec<T>(p.group_size, p.in_stride, p.out_stride, p.input, p.out);
  const int G = int(std::min<int64_t>(32, next_pow2(ceil_div<int64_t>(p.group_size / vec, 1))));
  const int64_t groups = p.rows * (p.cols / p.group_size);
  const unsigned grid = unsigned(grid_for(groups, kThreads / G));
  const bool ok = with_vec_of(
      vec, [&](auto kVec) { group_quant_kernel<T, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(p, G); });
  if (!ok) return Status::Error(1, "per_token_group_quant: no kernel for vec=" + std::to_string(vec));
  return cuda_status(cudaGetLastError(), "per_token_group_quant kernel launch");
}

template <typename T>
Status launch_tensor(const TensorQuantParams& p, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int vec = choose_vec<T>(p.cols, p.in_stride, p.out_stride, p.input, p.out);
  const int64_t total = p.rows * (p.cols / vec);
  const unsigned grid = unsigned(grid_for(total, kThreads));
  if (p.dynamic) {
    // The scale buffer first holds the absmax (0 for an empty tensor), then absmax / 448.
    Status s = cuda_status(cudaMemsetAsync(p.scale, 0, sizeof(float), stream), "scaled_fp8_quant memset");
    if (!s.ok()) return s;
    if (total > 0) {
      const bool ok = with_vec_of(
          vec, [&](auto kVec) { absmax_kernel<T, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(p); });
      if (!ok) return Status::Error(1, "scaled_fp8_quant: no kernel for vec=" + std::to_string(vec));
    }
    finalize_scale_kernel<<<1, 1, 0, stream>>>(p.scale);
    s = cuda_status(cudaGetLastError(), "scaled_fp8_quant absmax launch");
    if (!s.ok()) return s;
  }
  if (total == 0) return Status::Ok();
  const bool ok = with_vec_of(
      vec, [&](auto kVec) { tensor_quant_kernel<T, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(p); });
  if (!ok) return Status::Error(1, "scaled_fp8_quant: no kernel for vec=" + std::to_string(vec));
  return cuda_status(cudaGetLastError(), "scaled_fp8_quant kernel launch");
}

}  // namespace kiln::quantization
