// The online-softmax step of the attention kernels, written once for decode and the two prefill
// kernels (sm80 and sm90a). A row of a tile's logits lies in the four lanes of a quad (an mma.sync
// C fragment, or a wgmma accumulator), each lane holding part of the row.
#pragma once

#include "ops/attention/state.h"

namespace kiln::attention {

// One row's running max `m` and sum `l` after a tile whose logits in this lane have the maximum
// `partial_max` (in the units the caller's `kfac` turns into the log2 domain): the quad's max is
// taken, m moves to max(m, row max * kfac), and l is multiplied by the factor returned, which the
// row of O must be multiplied by too (1 when m did not move). `m_use` gets the offset of the tile's
// probabilities exp2(s * kfac - m_use): m, or 0 for a row with no visible key yet (every logit
// -inf, so exp2(-inf) = 0, never NaN).
__device__ __forceinline__ float online_softmax_step(float partial_max, float kfac, float& m, float& l, float& m_use) {
  float row_max = fmaxf(partial_max, __shfl_xor_sync(0xffffffffu, partial_max, 1));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
  const float m_new = fmaxf(m, row_max * kfac);
  const float rescale = scale_from(m, m_new);
  l *= rescale;
  m = m_new;
  m_use = m_new == neg_inf() ? 0.0f : m_new;
  return rescale;
}

}  // namespace kiln::attention
