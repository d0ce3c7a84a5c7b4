// //ops:rope, host backend: the entry points of rope.h for this module's dtype. The same float32
// arithmetic as the CUDA kernels, one token after another on the calling thread; every token's
// position is checked before anything is written. Copied into the specialisation's generated
// directory, next to its spec_config.h.
#include <cstdint>
#include <cstring>
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
    if (!token_position(p.at, t, p.nnz, p.errors, &positions[t])) {
      return Status::IndexError(index_error(static_cast<ErrorCode>(record[0]), record[1], record[2], record[3]));
    }
  }
  const int64_t half = p.rotary_dim / 2;
  std::vector<float> cs(static_cast<size_t>(p.rotary_dim));
  for (int64_t t = 0; t < p.nnz; ++t) {
    for (int64_t i = 0; i < half; ++i) cos_sin(p.at, p.rotary_dim, positions[t], i, &cs[i], &cs[half + i]);
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

// float -> E5M2 bits, round to nearest even, saturated to +-57344 (infinities too); NaN -> NaN:
// the device's __nv_cvt_float_to_fp8(SATFINITE, E5M2). Bias 15, two mantissa bits, subnormals
// m * 2^-16 below 2^-14.
uint8_t float_to_e5m2_satfinite(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  const uint32_t exp = abs >> 23;
  if (exp < 113) {  // below 2^-14: m * 2^-16 with m = round(|f| * 2^16) in [0, 4]
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 65536.0f;  // exact: a power-of-two scaling
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);  // m == 4 is 2^-14, the smallest normal: the same bits
  }
  // Normal: rebias (127 -> 15), keep two mantissa bits rounded to nearest even; past 57344 (0x7b),
  // infinities included, saturate.
  const uint32_t kept = ((exp - 112u) << 2) | ((abs >> 21) & 0x3u);
  const uint32_t rest = abs & 0x1fffffu;
  const uint32_t r = kept + ((rest > 0x100000u || (rest == 0x100000u && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint8_t>(sign | (r > 0x7bu ? 0x7bu : r));
}

uint8_t to_fp8(float v, bool e5m2) {
  return e5m2 ? float_to_e5m2_satfinite(v) : float_to_e4m3_satfinite(v);
}

template <typename T>
Status run_quantize(const RopeQuantParams& params) {
  using C = Convert<T>;
  RopeQuantParams p = params;
  int64_t record[4] = {0, 0, 0, 0};
  p.errors = record;
  std::vector<int64_t> positions(static_cast<size_t>(p.nnz));
  for (int64_t t = 0; t < p.nnz; ++t) {
    if (!token_position(p.at, t, p.nnz, p.errors, &positions[t])) {
      return Status::IndexError(index_error(static_cast<ErrorCode>(record[0]), record[1], record[2], record[3]));
    }
  }
  const int64_t half = p.rope_dim / 2;
  std::vector<float> cs(static_cast<size_t>(p.rope_dim));
  for (int64_t t = 0; t < p.nnz; ++t) {
    for (int64_t i = 0; i < half; ++i) cos_sin(p.at, p.rope_dim, positions[t], i, &cs[i], &cs[half + i]);
    for (int64_t row = 0; row < p.q_heads + p.k_heads; ++row) {
      const bool is_q = row < p.q_heads;
      const int64_t h = is_q ? row : row - p.q_heads;
      const float scale = is_q ? p.scale_q : p.scale_kv;
      const int rope = is_q ? kQRope : kKRope, nope = is_q ? kQNope : kKNope;
      const T* src = static_cast<const T*>(p.in[rope]) + t * p.stride_n[rope] + h * p.stride_h[rope];
      uint8_t* dst = static_cast<uint8_t*>(p.out[rope]) + t * p.stride_n[4 + rope] + h * p.stride_h[4 + rope];
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = p.interleave ? 2 * i : i, b = p.interleave ? 2 * i + 1 : i + half;
        const float x1 = C::to_float(src[a]), x2 = C::to_float(src[b]), c = cs[i], s = cs[half + i];
        dst[a] = to_fp8((x1 * c - x2 * s) * scale, p.e5m2);
        dst[b] = to_fp8((x2 * c + x1 * s) * scale, p.e5m2);
      }
      const T* nsrc = static_cast<const T*>(p.in[nope]) + t * p.stride_n[nope] + h * p.stride_h[nope];
      uint8_t* ndst = static_cast<uint8_t*>(p.out[nope]) + t * p.stride_n[4 + nope] + h * p.stride_h[4 + nope];
      for (int64_t j = 0; j < p.nope_dim; ++j) ndst[j] = to_fp8(C::to_float(nsrc[j]) * scale, p.e5m2);
    }
  }
  return Status::Ok();
}

}  // namespace

Status apply_rope(const RopeParams& p, LaunchContext) {
  return run<spec::dtype>(p);
}

Status rope_quantize(const RopeQuantParams& p, LaunchContext) {
  return run_quantize<spec::dtype>(p);
}

}  // namespace kiln::rope
