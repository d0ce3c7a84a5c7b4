// Rotary positional embedding (RoPE), and RoPE fused with fp8 quantisation (rope_quantize): the
// parameters, the per-token position and the frequencies, shared by the CUDA and the host backends.
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
// the inputs themselves). indptr, offsets and positions are int32 or int64. Arithmetic in float32,
// each output rounded once. The element type is the module's specialisation (kiln::spec::dtype).
// Framework free.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::rope {

// Index errors of the RoPE family (ops/common/device_error.h): codes and messages.
enum class ErrorCode : int64_t {
  kRopeIndptr = error_code("rope", 1),  // a RoPE token lies in no request of indptr
  kCosSinRow = error_code("rope", 2),   // a position is not a row of cos_sin_cache
};
inline constexpr ErrorText kErrorTexts[] = {
    {int64_t(ErrorCode::kRopeIndptr),
     "token {position} lies in no request of indptr (which ends at {value}): indptr must start at 0, never "
     "decrease and end at nnz = {bound}"},
    {int64_t(ErrorCode::kCosSinRow),
     "positions[{position}] = {value} is not a row of cos_sin_cache: valid are [0, {bound})"},
};
KILN_REGISTER_ERROR_TEXTS(kErrorTexts)

// Where a token's position comes from.
enum class PosMode : int {
  kIndptr = 0,  // request b holds tokens [indptr[b], indptr[b+1]); pos = offsets[b] + t - indptr[b]
  kPosIds = 1,  // pos = pos_ids[t]
  kCosSin = 2,  // pos = positions[t], a row of cos_sin_cache [max_pos, rotary_dim] (cos | sin)
};

// The largest rotary_dim: its cos and sin (rotary_dim floats) are staged in shared memory.
inline constexpr int64_t kMaxRotaryDim = 8192;

// Each token's position and its angles: shared by apply_rope's and rope_quantize's kernels.
struct Positions {
  PosMode mode;
  const void* indptr;   // kIndptr: [batch + 1], int32 or int64 (indptr64)
  const void* offsets;  // kIndptr: [batch], int32 or int64 (offsets64)
  bool indptr64, offsets64;
  int64_t batch;
  const void* pos;  // kPosIds / kCosSin: [nnz], int32 or int64
  bool pos64;
  const float* cos_sin;  // kCosSin
  int64_t max_pos, cos_sin_stride;
  float rope_theta, rope_rcp_scale, smooth_a, smooth_b;
};

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
  Positions at;
  int64_t* errors;  // the device's index-error record (null on the host)
};

// rope_quantize (FlashInfer's rope_quantize_fp8): q and k each come as a rotary part (rope_dim,
// rotated by cos_sin_cache rows) and the rest (nope_dim, not rotated); both are multiplied by the
// scale (quant_scale_q for q, quant_scale_kv for k) in float32 and rounded once to fp8 (nearest
// even, saturated at the format's largest finite value: 448 E4M3, 57344 E5M2).
// Tensors: in[0..3] = q_rope [nnz, q_heads, rope_dim], k_rope [nnz, k_heads, rope_dim] (MLA: one
// head, its head stride unused), q_nope [nnz, q_heads, nope_dim], k_nope [nnz, k_heads, nope_dim];
// out[i] is in[i]'s fp8 output, of its shape. Token and head strides (elements): stride_n[i],
// stride_h[i] of in[i], stride_n[4 + i], stride_h[4 + i] of out[i]. Last dims contiguous.
inline constexpr int kQRope = 0, kKRope = 1, kQNope = 2, kKNope = 3;

struct RopeQuantParams {
  const void* in[4];  // the module's dtype
  void* out[4];       // fp8 bytes
  int64_t stride_n[8], stride_h[8];
  int64_t nnz, q_heads, k_heads, rope_dim, nope_dim;
  bool interleave;
  bool e5m2;  // the outputs are float8_e5m2 (else float8_e4m3fn)
  float scale_q, scale_kv;
  Positions at;  // mode kCosSin
  int64_t* errors;
};

template <typename I>
KILN_HOST_DEVICE int64_t index_at(const void* p, int64_t i) {
  return static_cast<int64_t>(static_cast<const I*>(p)[i]);
}

KILN_HOST_DEVICE int64_t load_index(const void* p, bool is64, int64_t i) {
  return is64 ? index_at<int64_t>(p, i) : index_at<int32_t>(p, i);
}

// Token t's position; false (and the error recorded) when it has none: a token outside every
// request of indptr, or a cache position outside [0, max_pos).
KILN_HOST_DEVICE bool token_position(const Positions& p, int64_t t, int64_t nnz, int64_t* errors, int64_t* pos) {
  if (p.mode == PosMode::kIndptr) {
    const int64_t end = p.batch > 0 ? load_index(p.indptr, p.indptr64, p.batch) : 0;
    if (p.batch <= 0 || t < load_index(p.indptr, p.indptr64, 0) || t >= end) {
      record_error(errors, ErrorCode::kRopeIndptr, t, end, nnz);
      return false;
    }
    int64_t lo = 0, hi = p.batch - 1;  // the last b with indptr[b] <= t
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (load_index(p.indptr, p.indptr64, mid) <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    if (t >= load_index(p.indptr, p.indptr64, lo + 1)) {  // indptr decreases somewhere: no request
      record_error(errors, ErrorCode::kRopeIndptr, t, end, nnz);
      return false;
    }
    *pos = load_index(p.offsets, p.offsets64, lo) + t - load_index(p.indptr, p.indptr64, lo);
    return true;
  }
  const int64_t v = load_index(p.pos, p.pos64, t);
  if (p.mode == PosMode::kCosSin && (v < 0 || v >= p.max_pos)) {
    record_error(errors, ErrorCode::kCosSinRow, t, v, p.max_pos);
    return false;
  }
  *pos = v;
  return true;
}

// The cos and sin of rotary pair i (of rotary_dim / 2) of a token at `pos`.
KILN_HOST_DEVICE void cos_sin(const Positions& p, int64_t rotary_dim, int64_t pos, int64_t i, float* c, float* s) {
  if (p.mode == PosMode::kCosSin) {
    const float* row = p.cos_sin + pos * p.cos_sin_stride;
    *c = row[i];
    *s = row[rotary_dim / 2 + i];
    return;
  }
  const float f = powf(p.rope_theta, -2.0f * static_cast<float>(i) / static_cast<float>(rotary_dim));
  const float smooth = fminf(1.0f, fmaxf(0.0f, f * p.smooth_a + p.smooth_b));
  const float freq = (1.0f - smooth) * f * p.rope_rcp_scale + smooth * f;
  const float angle = static_cast<float>(pos) * freq;
  *c = cosf(angle);
  *s = sinf(angle);
}

// Implemented once per backend for the module's dtype (rope_cuda.cu, rope_host.cc).
Status apply_rope(const RopeParams& p, LaunchContext ctx);
Status rope_quantize(const RopeQuantParams& p, LaunchContext ctx);

}  // namespace kiln::rope
