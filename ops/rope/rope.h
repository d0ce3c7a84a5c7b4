// Rotary positional embedding (RoPE): the parameters, the per-token position and the frequencies,
// shared by the CUDA and the host backends.
//
// For token t at position pos and rotary pair i (0 <= i < rotary_dim / 2), with (cos, sin) of the
// angle pos * freq(i) (or read from a cos/sin cache row):
//   NeoX style:         (x[i], x[i + rotary_dim/2]) -> (x1 cos - x2 sin, x2 cos + x1 sin)
//   interleaved (GPT-J): (x[2i], x[2i + 1])          -> the same rotation
// Elements at and past rotary_dim are not rotated: in place they are never written; into separate
// outputs they are copied bit for bit.
//   freq(i) = theta^(-2i / rotary_dim) / rope_scale                          (plain RoPE)
//   Llama 3.1: f = theta^(-2i / rotary_dim); s = clamp(f * smooth_a + smooth_b, 0, 1);
//              freq(i) = (1 - s) * f / rope_scale + s * f   (smooth_a = smooth_b = 0 gives plain RoPE)
//
// Layout: q [nnz, q_heads, head_dim] and k [nnz, k_heads, head_dim], each contiguous in its last
// dimension with free token and head strides (element units, int64); outputs likewise (in place:
// the inputs themselves). Arithmetic in float32, each output rounded once. The element type is the
// module's specialisation (kiln::spec::dtype). Framework free.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::rope {

// Where a token's position comes from.
enum class PosMode : int {
  kIndptr = 0,  // request b holds tokens [indptr[b], indptr[b+1]); pos = offsets[b] + t - indptr[b]
  kPosIds = 1,  // pos = pos_ids[t]
  kCosSin = 2,  // pos = positions[t], a row of cos_sin_cache [max_pos, rotary_dim] (cos | sin)
};

// The largest rotary_dim: its cos and sin (rotary_dim floats) are staged in shared memory.
inline constexpr int64_t kMaxRotaryDim = 8192;

struct RopeParams {
  void* q_out;
  void* k_out;
  const void* q;
  const void* k;
  int64_t nnz, q_heads, k_heads, head_dim, rotary_dim;
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h;
  int64_t qo_stride_n, qo_stride_h, ko_stride_n, ko_stride_h;
  bool interleave;
  bool copy_tail;  // outputs are separate tensors: copy the dims past rotary_dim
  PosMode mode;
  const int32_t* indptr;   // kIndptr: [batch + 1]
  const int32_t* offsets;  // kIndptr: [batch]
  int64_t batch;
  const void* pos;  // kPosIds / kCosSin: [nnz], int32 or int64
  bool pos64;
  const float* cos_sin;  // kCosSin
  int64_t max_pos, cos_sin_stride;
  float rope_theta, rope_rcp_scale, smooth_a, smooth_b;
  int64_t* errors;  // the device's index-error record (null on the host)
};

// Token t's position; false (and the error recorded) when it has none: a token outside every
// request of indptr, or a cache position outside [0, max_pos).
KILN_HOST_DEVICE bool token_position(const RopeParams& p, int64_t t, int64_t* pos) {
  if (p.mode == PosMode::kIndptr) {
    if (p.batch <= 0 || t < p.indptr[0] || t >= p.indptr[p.batch]) {
      record_error(p.errors, ErrorCode::kRopeIndptr, t, p.batch > 0 ? p.indptr[p.batch] : 0, p.nnz);
      return false;
    }
    int64_t lo = 0, hi = p.batch - 1;  // the last b with indptr[b] <= t
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (p.indptr[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    if (t >= p.indptr[lo + 1]) {  // indptr decreases somewhere: the search found no request
      record_error(p.errors, ErrorCode::kRopeIndptr, t, p.indptr[p.batch], p.nnz);
      return false;
    }
    *pos = int64_t(p.offsets[lo]) + t - p.indptr[lo];
    return true;
  }
  const int64_t v = p.pos64 ? static_cast<const int64_t*>(p.pos)[t] : static_cast<const int32_t*>(p.pos)[t];
  if (p.mode == PosMode::kCosSin && (v < 0 || v >= p.max_pos)) {
    record_error(p.errors, ErrorCode::kCosSinRow, t, v, p.max_pos);
    return false;
  }
  *pos = v;
  return true;
}

// The cos and sin of rotary pair i of a token at `pos`.
KILN_HOST_DEVICE void cos_sin(const RopeParams& p, int64_t pos, int64_t i, float* c, float* s) {
  if (p.mode == PosMode::kCosSin) {
    const float* row = p.cos_sin + pos * p.cos_sin_stride;
    *c = row[i];
    *s = row[p.rotary_dim / 2 + i];
    return;
  }
  const float f = powf(p.rope_theta, -2.0f * static_cast<float>(i) / static_cast<float>(p.rotary_dim));
  const float smooth = fminf(1.0f, fmaxf(0.0f, f * p.smooth_a + p.smooth_b));
  const float freq = (1.0f - smooth) * f * p.rope_rcp_scale + smooth * f;
  const float angle = static_cast<float>(pos) * freq;
  *c = cosf(angle);
  *s = sinf(angle);
}

// Implemented once per backend for the module's dtype (rope_cuda.cu, rope_host.cc).
Status apply_rope(const RopeParams& p, LaunchContext ctx);

}  // namespace kiln::rope
