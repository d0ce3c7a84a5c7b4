// Merging attention states on CUDA (see attention.h and state.h):
//   merge_states_vec_kernel  S states per row -> one (the public merge_states); states may be
//                            float32 or the module's dtype
//   merge_two_kernel         two states per row, optional mask (merge_state, merge_state_in_place):
//                            one warp per (row, head), each lane VEC consecutive dims
// float32 arithmetic throughout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/attention/attention.h"
#include "ops/attention/state.h"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"

namespace kiln::attention {

constexpr int kMergeWarps = 4;  // heads per block

// Dims per lane so that a warp covers HEAD_DIM.
template <int HEAD_DIM>
constexpr int merge_vec() {
  return HEAD_DIM >= 32 ? HEAD_DIM / 32 : 1;
}

inline dim3 merge_grid(int64_t rows, int64_t heads) {
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(ceil_div<int64_t>(heads, kMergeWarps)));
}

// S states per row -> one, a thread per (item, head, 8 dims): 16-byte loads and stores, and every
// thread reads the item's lse values itself (broadcast loads, no warp reductions). The bindings
// require 16-byte aligned tensors (pointer and strides), and decode's float32 partials are.
constexpr int kMergeVecThreads = 256;
constexpr int kMergeChunk = 8;  // dims per thread

template <typename TIn>
__device__ __forceinline__ void load_chunk(const TIn* src, float (&x)[kMergeChunk]) {
  if constexpr (sizeof(TIn) == 4) {
    const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    alignas(16) TIn t[kMergeChunk];
    *reinterpret_cast<uint4*>(t) = *reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int k = 0; k < kMergeChunk; ++k) x[k] = Convert<TIn>::to_float(t[k]);
  }
}

template <typename TIn, typename TOut, int HEAD_DIM>
__global__ void __launch_bounds__(kMergeVecThreads) merge_states_vec_kernel(const MergeParams p) {
  constexpr int THREADS_PER_HEAD = HEAD_DIM / kMergeChunk;
  constexpr int HEADS_PER_BLOCK = kMergeVecThreads / THREADS_PER_HEAD;
  static_assert(HEAD_DIM % kMergeChunk == 0 && kMergeVecThreads % THREADS_PER_HEAD == 0, "whole heads per block");
  const int64_t item = blockIdx.x;
  const int64_t head = int64_t(blockIdx.y) * HEADS_PER_BLOCK + threadIdx.x / THREADS_PER_HEAD;
  const int dim0 = (threadIdx.x % THREADS_PER_HEAD) * kMergeChunk;
  if (head >= p.num_heads) return;
  const int64_t row = p.out_row ? p.out_row[item] : item;
  if (row < 0) return;
  const int64_t first = p.indptr ? p.indptr[item] : 0;
  const int64_t count = p.indptr ? p.indptr[item + 1] - first : p.num_states;
  const float* s = p.s + item * p.s_item_stride + head * p.s_head_stride + first * p.s_state_stride;
  const TIn* v =
      static_cast<const TIn*>(p.v) + item * p.v_item_stride + head * p.v_head_stride + first * p.v_state_stride + dim0;
  float max_lse = neg_inf();
  for (int64_t j = 0; j < count; ++j) max_lse = fmaxf(max_lse, s[j * p.s_state_stride]);
  float sum = 0.0f, acc[kMergeChunk] = {};
#pragma unroll 4
  for (int64_t j = 0; j < count; ++j) {
    const float w = scale_from(s[j * p.s_state_stride], max_lse);
    float x[kMergeChunk];
    load_chunk(v + j * p.v_state_stride, x);
    sum += w;
#pragma unroll
    for (int k = 0; k < kMergeChunk; ++k) acc[k] += w * x[k];
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  alignas(16) TOut o[kMergeChunk];
#pragma unroll
  for (int k = 0; k < kMergeChunk; ++k) o[k] = Convert<TOut>::from_float(acc[k] * inv);
  TOut* out = static_cast<TOut*>(p.out) + row * p.out_row_stride + head * p.out_head_stride + dim0;
  static_assert(sizeof(TOut) * kMergeChunk == 16, "one 16-byte store per thread");
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(o);
  if (p.out_lse != nullptr && dim0 == 0) {
    p.out_lse[row * p.lse_row_stride + head * p.lse_head_stride] = merged_lse(max_lse, sum);
  }
}

// Whether merge_states_vec_kernel may serve p: every vector access 16-byte aligned.
template <typename TIn, typename TOut>
bool merge_states_aligned(const MergeParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto bytes_ok = [](int64_t stride, size_t elem) { return (stride * int64_t(elem)) % 16 == 0; };
  return aligned(p.v) && aligned(p.out) && bytes_ok(p.v_item_stride, sizeof(TIn)) &&
         bytes_ok(p.v_state_stride, sizeof(TIn)) && bytes_ok(p.v_head_stride, sizeof(TIn)) &&
         bytes_ok(p.out_row_stride, sizeof(TOut)) && bytes_ok(p.out_head_stride, sizeof(TOut));
}

template <typename TIn, typename TOut, int HEAD_DIM>
Status launch_merge_states_vec(const MergeParams& p, cudaStream_t stream, const char* what) {
  if (!merge_states_aligned<TIn, TOut>(p)) {
    return Status::Error(1, std::string(what) + ": states and output must be 16-byte aligned (pointers and strides)");
  }
  constexpr int heads_per_block = kMergeVecThreads / (HEAD_DIM / kMergeChunk);
  const dim3 grid(static_cast<unsigned>(p.num_items),
                  static_cast<unsigned>(ceil_div<int64_t>(p.num_heads, heads_per_block)));
  merge_states_vec_kernel<TIn, TOut, HEAD_DIM><<<grid, kMergeVecThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), (std::string(what) + " kernel launch").c_str());
}

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(32 * kMergeWarps) merge_two_kernel(const MergeTwoParams p) {
  constexpr int VEC = merge_vec<HEAD_DIM>();
  const int64_t row = blockIdx.x;
  const int64_t head = int64_t(blockIdx.y) * kMergeWarps + threadIdx.y;
  if (head >= p.num_heads) return;
  const int dim0 = threadIdx.x * VEC;
  const T* a = static_cast<const T*>(p.a) + row * p.a_row_stride + head * p.a_head_stride + dim0;
  const T* b = static_cast<const T*>(p.b) + row * p.b_row_stride + head * p.b_head_stride + dim0;
  T* out = static_cast<T*>(p.out) + row * p.out_row_stride + head * p.out_head_stride + dim0;
  const float la = p.a_lse[row * p.a_lse_row_stride + head];
  const float lb = p.b_lse[row * p.b_lse_row_stride + head];
  const bool use_b = p.mask == nullptr || p.mask[row * p.mask_stride] != 0;
  if (!use_b && p.out == p.a && p.out_lse == p.a_lse) return;  // row kept as is
  const float mx = use_b ? fmaxf(la, lb) : la;
  const float wa = use_b ? scale_from(la, mx) : 1.0f, wb = use_b ? scale_from(lb, mx) : 0.0f;
  const float sum = wa + wb, inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (dim0 < HEAD_DIM) {
    float r[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      r[k] = (wa * Convert<T>::to_float(a[k]) + wb * Convert<T>::to_float(b[k])) * inv;
    }
    // out may alias a: each lane writes exactly the dims it read.
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = Convert<T>::from_float(r[k]);
  }
  if (threadIdx.x == 0) p.out_lse[row * p.out_lse_row_stride + head] = merged_lse(mx, sum);
}

template <typename T, int HEAD_DIM>
Status launch_merge_states(const MergeParams& p, LaunchContext ctx) {
  if (p.num_items == 0 || p.num_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  return launch_merge_states_vec<T, T, HEAD_DIM>(p, static_cast<cudaStream_t>(ctx.stream), "merge_states");
}

template <typename T, int HEAD_DIM>
Status launch_merge_two(const MergeTwoParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.num_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  merge_two_kernel<T, HEAD_DIM>
      <<<merge_grid(p.rows, p.num_heads), dim3(32, kMergeWarps), 0, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "merge_state kernel launch");
}

}  // namespace kiln::attention
