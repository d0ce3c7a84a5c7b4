// RoPE CUDA kernels and their launcher (see rope.h for the contract).
//
// Memory bound: every element of q and k is read once and written once. Two kernels, by where the
// angles come from. From a cos/sin cache (rope_kernel): a thread owns one unit of one token (VEC
// pairs, NeoX: a vector from each half; or VEC elements, interleaved: VEC / 2 pairs, at least one
// pair) across a group of up to kHeadsPerThread heads of q then k; it reads the unit's cos/sin
// once into registers, loads the unit of every head of its group, then rotates and stores them.
// No shared memory and no barrier, kHeadsPerThread units' loads in flight per thread: 3.15 TB/s
// on the H200 at 8192 tokens, where the staged kernel reached 2.7 (docs/perf/rope.md).
// Consecutive threads take consecutive units of a head (coalesced), then the next head group, then
// the next token; a block holds as many whole tokens as fit, and a token wider than a block
// spreads over gridDim.y blocks. Computed angles use rope_staged_kernel (below). 16-byte vectors
// when the shape, strides and pointers allow.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/vec.cuh"
#include "ops/rope/rope.h"

namespace kiln::rope {

constexpr int kThreads = 256;
constexpr int kHeadsPerThread = 4;    // loads in flight per thread; 4 x 32 B keeps ~64 registers
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y
constexpr int kBlocksPerSm = 8;       // the staged kernel: 2048 resident threads per SM

// What the launcher derives once: a head's units, the head groups, a token's threads.
struct RopeGrid {
  int units;             // rotated units of a head
  int per_head;          // units + the copied tail's vectors
  int groups;            // ceil((q_heads + k_heads) / kHeadsPerThread)
  int per_token;         // per_head * groups threads
  int tokens_per_block;  // >= 1; 1 when a token spans gridDim.y blocks
};

template <typename T, int VEC, bool INTERLEAVE>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeParams p, const RopeGrid g) {
  using V = Vec<T, VEC>;
  constexpr int W = VEC < 2 ? 2 : VEC;  // interleaved: a unit is W elements (W / 2 pairs)
  constexpr int kPairs = INTERLEAVE ? W / 2 : VEC;
  constexpr int kLoads = INTERLEAVE ? W / VEC : 2;  // vectors of one head's unit
  const int64_t half = p.rotary_dim / 2;
  const int64_t heads = p.q_heads + p.k_heads;
  const int in_block = int(threadIdx.x) / g.per_token;
  const int lane = int(blockIdx.y) * kThreads + int(threadIdx.x) - in_block * g.per_token;
  // The block's threads past its last whole token idle (fewer than per_token of them).
  if (in_block >= g.tokens_per_block || lane >= g.per_token) return;
  const int group = lane / g.per_head;
  const int u = lane - group * g.per_head;
  const int64_t h0 = int64_t(group) * kHeadsPerThread;
  const int nh = heads - h0 < kHeadsPerThread ? int(heads - h0) : kHeadsPerThread;

  for (int64_t t = int64_t(blockIdx.x) * g.tokens_per_block + in_block; t < p.nnz;
       t += int64_t(gridDim.x) * g.tokens_per_block) {
    int64_t pos = 0;
    if (!token_position(p.at, t, p.nnz, p.errors, &pos)) continue;
    const T* src[kHeadsPerThread];
    T* dst[kHeadsPerThread];
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      const int64_t h = h0 + (i < nh ? i : nh - 1);  // past the last head: a repeat, never used
      const bool is_q = h < p.q_heads;
      const int64_t hk = is_q ? h : h - p.q_heads;
      src[i] = static_cast<const T*>(is_q ? p.q : p.k) +
               (is_q ? t * p.q_stride_n + hk * p.q_stride_h : t * p.k_stride_n + hk * p.k_stride_h);
      dst[i] = static_cast<T*>(is_q ? p.q_out : p.k_out) +
               (is_q ? t * p.qo_stride_n + hk * p.qo_stride_h : t * p.ko_stride_n + hk * p.ko_stride_h);
    }
    if (u >= g.units) {  // a vector past rotary_dim, copied unchanged
      const int64_t j = p.rotary_dim + int64_t(u - g.units) * VEC;
      V v[kHeadsPerThread];
#pragma unroll
      for (int i = 0; i < kHeadsPerThread; ++i)
        if (i < nh) v[i] = V::load(src[i] + j);
#pragma unroll
      for (int i = 0; i < kHeadsPerThread; ++i)
        if (i < nh) v[i].store(dst[i] + j);
      continue;
    }
    // Element offsets of the unit's vectors, and its first pair.
    const int64_t j = INTERLEAVE ? int64_t(u) * W : int64_t(u) * VEC;
    const int64_t pair0 = INTERLEAVE ? j / 2 : j;
    V v[kHeadsPerThread][kLoads];
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      if (i >= nh) continue;
#pragma unroll
      for (int e = 0; e < kLoads; ++e) v[i][e] = V::load(src[i] + (INTERLEAVE ? j + e * VEC : j + e * half));
    }
    float c[kPairs], sn[kPairs];
#pragma unroll
    for (int e = 0; e < kPairs; ++e) cos_sin(p.at, p.rotary_dim, pos, pair0 + e, &c[e], &sn[e]);
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      if (i >= nh) continue;
      if constexpr (!INTERLEAVE) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float x1 = v[i][0].get(e), x2 = v[i][1].get(e);
          v[i][0].set(e, x1 * c[e] - x2 * sn[e]);
          v[i][1].set(e, x2 * c[e] + x1 * sn[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; e += 2) {
          const float x1 = v[i][e / VEC].get(e % VEC), x2 = v[i][(e + 1) / VEC].get((e + 1) % VEC);
          v[i][e / VEC].set(e % VEC, x1 * c[e / 2] - x2 * sn[e / 2]);
          v[i][(e + 1) / VEC].set((e + 1) % VEC, x2 * c[e / 2] + x1 * sn[e / 2]);
        }
      }
#pragma unroll
      for (int e = 0; e < kLoads; ++e) v[i][e].store(dst[i] + (INTERLEAVE ? j + e * VEC : j + e * half));
    }
  }
}

// Computed angles (pos_ids, indptr, Llama 3.1): the earlier kernel, whose block stages a token's
// cos/sin once in shared memory (a thread of rope_kernel would compute its unit's powf and sincos
// again for every head group: 72-76 us against 63-67 at 8192 tokens on the H200). A block owns one
// token at a time; its threads stage the rotary_dim / 2 pairs, then rotate every head from there.
template <typename T, int VEC, bool INTERLEAVE>
__global__ void __launch_bounds__(kThreads) rope_staged_kernel(const RopeParams p) {
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
  if (p.at.mode != PosMode::kCosSin) {
    const int64_t blocks = std::min<int64_t>(p.nnz, int64_t(sm_count()) * kBlocksPerSm);
    const size_t smem = size_t(p.rotary_dim) * sizeof(float);
    bool launched = false;
    auto with_vec = [&](auto kVec) {
      constexpr int VEC = decltype(kVec)::value;
      if (p.interleave) {
        rope_staged_kernel<T, VEC, true><<<unsigned(blocks), kThreads, smem, stream>>>(p);
      } else {
        rope_staged_kernel<T, VEC, false><<<unsigned(blocks), kThreads, smem, stream>>>(p);
      }
      launched = true;
    };
    if (!dispatch_value<1, 2, 4, 8>(vec, with_vec) || !launched) {
      return Status::Error(1, "apply_rope: no kernel for vec=" + std::to_string(vec) +
                                  " (allowed: " + allowed_values<1, 2, 4, 8>() + ")");
    }
    return cuda_status(cudaGetLastError(), "rope kernel launch");
  }
  const int w = p.interleave ? std::max(vec, 2) : vec;
  const int64_t units = p.interleave ? p.rotary_dim / w : p.rotary_dim / 2 / vec;
  const int64_t tail = p.copy_tail ? (p.head_dim - p.rotary_dim) / vec : 0;
  const int64_t groups = ceil_div<int64_t>(p.q_heads + p.k_heads, kHeadsPerThread);
  const int64_t per_token = (units + tail) * groups;
  const int64_t blocks_y = ceil_div<int64_t>(per_token, kThreads);
  if (blocks_y > kMaxGridY) {
    return Status::Error(1, "apply_rope: a token needs " + std::to_string(per_token) + " threads (" +
                                std::to_string(units + tail) + " vectors of " + std::to_string(vec) +
                                " elements per head x " + std::to_string(groups) + " groups of " +
                                std::to_string(kHeadsPerThread) + " heads), more than " + std::to_string(kMaxGridY) +
                                " blocks of " + std::to_string(kThreads));
  }
  const RopeGrid g{int(units), int(units + tail), int(groups), int(per_token),
                   int(std::max<int64_t>(1, kThreads / per_token))};
  const dim3 grid(unsigned(std::min<int64_t>(ceil_div<int64_t>(p.nnz, g.tokens_per_block), INT32_MAX)),
                  unsigned(blocks_y));
  bool launched = false;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if (p.interleave) {
      rope_kernel<T, VEC, true><<<grid, kThreads, 0, stream>>>(p, g);
    } else {
      rope_kernel<T, VEC, false><<<grid, kThreads, 0, stream>>>(p, g);
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
