// Merging attention states on CUDA (see attention.h and state.h):
//   merge_states_kernel  S states per row -> one (the split-KV merge of decode, and the public
//                        merge_states); states may be float32 partials or the module's dtype
//   merge_two_kernel     two states per row, optional mask (merge_state, merge_state_in_place)
// One warp per (row, head); each lane owns VEC consecutive dims; float32 arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

template <typename TIn, typename TOut, int HEAD_DIM>
__global__ void __launch_bounds__(32 * kMergeWarps) merge_states_kernel(const MergeParams p) {
  constexpr int VEC = merge_vec<HEAD_DIM>();
  const int64_t item = blockIdx.x;
  const int64_t head = int64_t(blockIdx.y) * kMergeWarps + threadIdx.y;
  if (head >= p.num_heads) return;
  const int64_t row = p.out_row ? p.out_row[item] : item;
  if (row < 0) return;
  const int64_t first = p.indptr ? p.indptr[item] : 0;
  const int64_t count = p.indptr ? p.indptr[item + 1] - first : p.num_states;
  const float* s = p.s + item * p.s_item_stride + head * p.s_head_stride;
  const TIn* v = static_cast<const TIn*>(p.v) + item * p.v_item_stride + head * p.v_head_stride;
  const int dim0 = threadIdx.x * VEC;

  // The weights: lanes take states j = lane, lane + 32, ... (loads in parallel), then warp sums.
  float max_lse = neg_inf();
  for (int64_t j = threadIdx.x; j < count; j += 32) max_lse = fmaxf(max_lse, s[(first + j) * p.s_state_stride]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += 32) sum += scale_from(s[(first + j) * p.s_state_stride], max_lse);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  // The values: batches of kBatch states, every load of a batch issued before its FMAs.
  constexpr int kBatch = 8;
  float acc[VEC] = {};
  for (int64_t j0 = 0; j0 < count; j0 += kBatch) {
    float w[kBatch], x[kBatch][VEC];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t j = j0 + b;
      w[b] = j < count ? scale_from(s[(first + j) * p.s_state_stride], max_lse) : 0.0f;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        x[b][k] = (j < count && dim0 < HEAD_DIM) ? Convert<TIn>::to_float(v[(first + j) * p.v_state_stride + dim0 + k])
                                                 : 0.0f;
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += w[b] * x[b][k];
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (dim0 < HEAD_DIM) {
    TOut* out = static_cast<TOut*>(p.out) + row * p.out_row_stride + head * p.out_head_stride + dim0;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = Convert<TOut>::from_float(acc[k] * inv);
  }
  if (p.out_lse != nullptr && threadIdx.x == 0) {
    p.out_lse[row * p.lse_row_stride + head * p.lse_head_stride] = merged_lse(max_lse, sum);
  }
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
  if (p.mask != nullptr && p.mask[row] == 0 && p.out == p.a && p.out_lse == p.a_lse) return;  // row kept as is
  const bool use_b = p.mask == nullptr || p.mask[row] != 0;
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

inline dim3 merge_grid(int64_t rows, int64_t heads) {
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(ceil_div<int64_t>(heads, kMergeWarps)));
}

template <typename T, int HEAD_DIM>
Status launch_merge_states(const MergeParams& p, LaunchContext ctx) {
  if (p.num_items == 0 || p.num_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  merge_states_kernel<T, T, HEAD_DIM>
      <<<merge_grid(p.num_items, p.num_heads), dim3(32, kMergeWarps), 0, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "merge_states kernel launch");
}

template <typename T, int HEAD_DIM>
Status launch_merge_two(const MergeTwoParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.num_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  merge_two_kernel<T, HEAD_DIM>
      <<<merge_grid(p.rows, p.num_heads), dim3(32, kMergeWarps), 0, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "merge_state kernel launch");
}

// The split-KV merge of a decode launch: float32 partial slots -> out/lse (same stream).
template <typename T, int HEAD_DIM>
Status launch_merge_decode_partials(const DecodeParams& d, cudaStream_t stream) {
  MergeParams p{};
  p.v = d.partial_out;
  p.s = d.partial_lse;
  p.num_items = d.merge_capacity;
  p.num_heads = d.num_qo_heads;
  p.indptr = d.merge_indptr;
  p.out_row = d.merge_request;
  p.v_state_stride = d.num_qo_heads * HEAD_DIM;
  p.v_head_stride = HEAD_DIM;
  p.s_state_stride = d.num_qo_heads;
  p.s_head_stride = 1;
  p.out = d.out;
  p.out_row_stride = d.out_stride_b;
  p.out_head_stride = d.out_stride_h;
  p.out_lse = d.lse;
  p.lse_row_stride = d.lse_stride_b;
  p.lse_head_stride = 1;
  merge_states_kernel<float, T, HEAD_DIM>
      <<<merge_grid(p.num_items, p.num_heads), dim3(32, kMergeWarps), 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "decode merge kernel launch");
}

}  // namespace kiln::attention
