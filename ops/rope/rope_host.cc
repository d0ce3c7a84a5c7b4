// //ops:rope, host backend: the entry point of rope.h for this module's dtype. The same float32
// arithmetic as the CUDA kernel, one token after another on the calling thread; every token's
// position is checked before anything is written. Copied into the specialisation's generated
// directory, next to its spec_config.h.
#include <vector>

#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/rope/rope.h"
#include "spec_config.h"

namespace kiln::rope {

namespace {

template <typename T>
Status run(const RopeParams& params) {
  using C = Convert<T>;
  RopeParams p = params;
  int64_t record[4] = {0, 0, 0, 0};
  p.errors = record;
  std::vector<int64_t> positions(static_cast<size_t>(p.nnz));
  for (int64_t t = 0; t < p.nnz; ++t) {
    if (!token_position(p, t, &positions[t])) {
      return Status::IndexError(index_error(static_cast<ErrorCode>(record[0]), record[1], record[2], record[3]));
    }
  }
  const int64_t half = p.rotary_dim / 2;
  std::vector<float> cs(static_cast<size_t>(p.rotary_dim));
  for (int64_t t = 0; t < p.nnz; ++t) {
    for (int64_t i = 0; i < half; ++i) cos_sin(p, positions[t], i, &cs[i], &cs[half + i]);
    for (int64_t row = 0; row < p.q_heads + p.k_heads; ++row) {
      const bool is_q = row < p.q_heads;
      const int64_t h = is_q ? row : row - p.q_heads;
      const T* src = static_cast<const T*>(is_q ? p.q : p.k) +
                     (is_q ? t * p.q_stride_n + h * p.q_stride_h : t * p.k_stride_n + h * p.k_stride_h);
      T* dst = static_cast<T*>(is_q ? p.q_out : p.k_out) +
               (is_q ? t * p.qo_stride_n + h * p.qo_stride_h : t * p.ko_stride_n + h * p.ko_stride_h);
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = p.interleave ? 2 * i : i, b = p.interleave ? 2 * i + 1 : i + half;
        const float x1 = C::to_float(src[a]), x2 = C::to_float(src[b]), c = cs[i], s = cs[half + i];
        dst[a] = C::from_float(x1 * c - x2 * s);
        dst[b] = C::from_float(x2 * c + x1 * s);
      }
      if (p.copy_tail) {
        for (int64_t j = p.rotary_dim; j < p.head_dim; ++j) dst[j] = src[j];
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status apply_rope(const RopeParams& p, LaunchContext) {
  return run<spec::dtype>(p);
}

}  // namespace kiln::rope
