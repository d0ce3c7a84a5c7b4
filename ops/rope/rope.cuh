// RoPE CUDA kernel and its launcher (see rope.h for the contract).
//
// Memory bound: every element of q and k is read once and written once. A block owns one token at a
// time (a grid-stride loop over tokens): its threads first stage the token's rotary_dim / 2 (cos,
// sin) pairs in shared memory (computed, or read from the cache row), then rotate every head of q
// and k from there, so a pair's sin/cos is computed once per token, not once per head. A thread's
// unit is VEC pairs (NeoX: a vector from each half) or VEC elements (interleaved: VEC / 2 pairs,
// at least one pair), 16-byte vectors when the shape, strides and pointers allow.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/vec.cuh"
#include "ops/rope/rope.h"

namespace kiln::rope {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 2048 resident threads per SM: loads enough in flight for DRAM

template <typename T, int VEC, bool INTERLEAVE>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeParams p) {
  using V = Vec<T, VEC>;
  extern __shared__ float staged[];  // cos[rotary_dim / 2], then sin[rotary_dim / 2]
  const int64_t half = p.rotary_dim / 2;
  float* cos_s = staged;
  float* sin_s = staged + half;
  // Interleaved: a unit is W elements (W / 2 pairs), loaded as W / VEC vectors.
  constexpr int W = VEC < 2 ? 2 : VEC;
  const int64_t units = INTERLEAVE ? p.rotary_dim / W : half / VEC;
  const int64_t tail = p.copy_tail ? (p.head_dim - p.rotary_dim) / VEC : 0;
  const int64_t per_row = units + tail;
  const int64_t work = (p.q_heads + p.k_heads) * per_row;

  for (int64_t t = blockIdx.x; t < p.nnz; t += gridDim.x) {
    int64_t pos = 0;
    // Every thread reads the same indices, so the branch is uniform across the block.
    if (!token_position(p.at, t, p.nnz, p.errors, &pos)) continue;
    for (int64_t i = threadIdx.x; i < half; i += kThreads) cos_sin(p.at, p.rotary_dim, pos, i, &cos_s[i], &sin_s[i]);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < work; idx += kThreads) {
      const int64_t row = idx / per_row, u = idx % per_row;
      const bool is_q = row < p.q_heads;
      const int64_t h = is_q ? row : row - p.q_heads;
      const T* src = static_cast<const T*>(is_q ? p.q : p.k) +
                     (is_q ? t * p.q_stride_n + h * p.q_stride_h : t * p.k_stride_n + h * p.k_stride_h);
      T* dst = static_cast<T*>(is_q ? p.q_out : p.k_out) +
               (is_q ? t * p.qo_stride_n + h * p.qo_stride_h : t * p.ko_stride_n + h * p.ko_stride_h);
      if (u >= units) {  // a vector past rotary_dim, copied unchanged
        const int64_t j = p.rotary_dim + (u - units) * VEC;
        V::load(src + j).store(dst + j);
        continue;
      }
      if constexpr (!INTERLEAVE) {
        const int64_t j = u * VEC;
        const V a = V::load(src + j), b = V::load(src + half + j);
        V oa, ob;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float x1 = a.get(e), x2 = b.get(e), c = cos_s[j + e], s = sin_s[j + e];
          oa.set(e, x1 * c - x2 * s);
          ob.set(e, x2 * c + x1 * s);
        }
        oa.store(dst + j);
        ob.store(dst + half + j);
      } else {
        const int64_t j = u * W;
        V v[W / VEC];
#pragma unroll
        for (int e = 0; e < W / VEC; ++e) v[e] = V::load(src + j + e * VEC);
#pragma unroll
        for (int e = 0; e < W; e += 2) {
          const float x1 = v[e / VEC].get(e % VEC), x2 = v[(e + 1) / VEC].get((e + 1) % VEC);
          const float c = cos_s[(j + e) / 2], s = sin_s[(j + e) / 2];
          v[e / VEC].set(e % VEC, x1 * c - x2 * s);
          v[(e + 1) / VEC].set((e + 1) % VEC, x2 * c + x1 * s);
        }
#pragma unroll
        for (int e = 0; e < W / VEC; ++e) v[e].store(dst + j + e * VEC);
      }
    }
    __syncthreads();  // the staged cos/sin are rewritten for the next token
  }
}

inline bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// The widest vector (<= 16 bytes) that the rotary split, head_dim, every stride and pointer allow.
template <typename T>
int choose_vec(const RopeParams& p) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    const int64_t bytes = vec * int64_t(sizeof(T));
    const int64_t split = p.interleave ? p.rotary_dim : p.rotary_dim / 2;
    bool ok = split % vec == 0 && p.head_dim % vec == 0;
    for (int64_t s : {p.q_stride_n, p.q_stride_h, p.k_stride_n, p.k_stride_h, p.qo_stride_n, p.qo_stride_h,
                      p.ko_stride_n, p.ko_stride_h})
      ok = ok && s % vec == 0;
    for (const void* ptr : {p.q, p.k, static_cast<const void*>(p.q_out), static_cast<const void*>(p.k_out)})
      ok = ok && aligned(ptr, bytes);
    if (ok) return vec;
  }
  return 1;
}

template <typename T>
Status launch(const RopeParams& p, LaunchContext ctx) {
  if (p.nnz == 0 || p.q_heads + p.k_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int vec = choose_vec<T>(p);
  const int64_t blocks = std::min<int64_t>(p.nnz, int64_t(sm_count()) * kBlocksPerSm);
  const size_t smem = size_t(p.rotary_dim) * sizeof(float);
  bool launched = false;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if (p.interleave) {
      rope_kernel<T, VEC, true><<<unsigned(blocks), kThreads, smem, stream>>>(p);
    } else {
      rope_kernel<T, VEC, false><<<unsigned(blocks), kThreads, smem, stream>>>(p);
    }
    launched = true;
  };
  const bool vec_ok = dispatch_value<1, 2, 4, 8>(vec, with_vec);
  if (!vec_ok || !launched) {
    return Status::Error(
        1, "apply_rope: no kernel for vec=" + std::to_string(vec) + " (allowed: " + allowed_values<1, 2, 4, 8>() + ")");
  }
  return cuda_status(cudaGetLastError(), "rope kernel launch");
}

}  // namespace kiln::rope
