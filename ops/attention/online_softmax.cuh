// The online-softmax step of the attention kernels, written once for decode and the two prefill
// kernels (sm80 and sm90a). A row of a tile's logits is spread over a few lanes, each holding part
// of it: the four lanes of a quad in the prefill kernels (an mma.sync C fragment, or a wgmma
// accumulator, rows on the M side), the eight lanes with the same lane % 4 in decode (S^T = K Q^T:
// a query head is a column of the C fragment, its keys spread over the rows).
#pragma once

#include "ops/attention/state.h"

namespace kiln::attention {

// exp2 on the special-function unit (the softmax's inputs are <= 0; -inf gives 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The max of `x` over the lanes that hold one row: xor partners kStride, 2 kStride, .. up to
// kLanes lanes (quads: 1, 4; decode's columns: 4, 8).
template <int kStride, int kLanes>
__device__ __forceinline__ float row_max_over_lanes(float x) {
#pragma unroll
  for (int d = kStride; d < kStride * kLanes; d *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}

// The sum of `x` over the same lanes (a row's share of l, once at the end).
template <int kStride, int kLanes>
__device__ __forceinline__ float row_sum_over_lanes(float x) {
#pragma unroll
  for (int d = kStride; d < kStride * kLanes; d *= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

// One row's running max `m` and sum `l` after a tile whose logits in this lane have the maximum
// `partial_max` (in the units the caller's `kfac` turns into the log2 domain): the row's max over
// its lanes is taken, m moves to max(m, row max * kfac), and l is multiplied by the factor
// returned, which the row of O must be multiplied by too (1 when m did not move). `m_use` gets the
// offset of the tile's probabilities exp2(s * kfac - m_use): m, or 0 for a row with no visible key
// yet (every logit -inf, so exp2(-inf) = 0, never NaN).
template <int kStride = 1, int kLanes = 4>
__device__ __forceinline__ float online_softmax_step(float partial_max, float kfac, float& m, float& l, float& m_use) {
  const float row_max = row_max_over_lanes<kStride, kLanes>(partial_max);
  const float m_new = fmaxf(m, row_max * kfac);
  const float rescale = scale_from(m, m_new);
  l *= rescale;
  m = m_new;
  m_use = m_new == neg_inf() ? 0.0f : m_new;
  return rescale;
}

}  // namespace kiln::attention
