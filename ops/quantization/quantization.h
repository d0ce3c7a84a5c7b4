// fp8 (E4M3 "fn") quantisation: the parameters and entry points shared by the CUDA and the host
// backends, and the one rounding both use.
//
//   scale = absmax / 448                      (float32 division; 448 = E4M3's largest finite value)
//   q     = e4m3(x / scale)                   (float32 division, then round to nearest even,
//                                              saturated at +-448; q = 0 where scale == 0)
// per_token_group_quant: absmax over each group of group_size consecutive elements of a row; one
//   float32 scale per (row, group), stored at scales[row * scale_stride_row + g * scale_stride_group].
// scaled_fp8_quant: one scale for the whole tensor, either given (static) or computed from the
//   tensor's absmax (dynamic: the scale buffer receives absmax / 448).
//
// Layout: input [rows, cols] and out [rows, cols] (E4M3 bytes), each contiguous in its last
// dimension with a free row stride (element units, int64). The input element type is the module's
// specialisation (kiln::spec::dtype). Framework free.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::quantization {

inline constexpr float kE4M3Max = 448.0f;

struct GroupQuantParams {
  void* out;  // E4M3 bytes
  float* scales;
  const void* input;
  int64_t rows, cols, group_size;
  int64_t in_stride, out_stride;
  int64_t scale_stride_row, scale_stride_group;
};

struct TensorQuantParams {
  void* out;     // E4M3 bytes
  float* scale;  // [1]: read (static) or written (dynamic)
  const void* input;
  int64_t rows, cols;
  int64_t in_stride, out_stride;
  bool dynamic;
};

// float -> E4M3 bits, round to nearest even, saturated to +-448 (infinities too); NaN -> NaN.
// The host's encoder (the CUDA kernels use the toolkit's __nv_cvt_float_to_fp8 with SATFINITE,
// the same rounding).
inline uint8_t float_to_e4m3_satfinite(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  const uint32_t exp = abs >> 23;
  if (exp < 121) {  // below 2^-6: a subnormal E4M3, m * 2^-9 with m = round(|f| * 2^9) in [0, 8]
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 512.0f;  // exact: a power-of-two scaling
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);  // m == 8 is 2^-6, the smallest normal: the same bits
  }
  // Normal: rebias (127 -> 7), keep 3 mantissa bits rounded to nearest even; a carry into the
  // exponent is the correctly rounded result, and the largest results stay <= 448 (checked above).
  const uint32_t kept = ((exp - 120u) << 3) | ((abs >> 20) & 0x7u);
  const uint32_t rest = abs & 0xfffffu;
  const uint32_t r = kept + ((rest > 0x80000u || (rest == 0x80000u && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint8_t>(sign | (r > 0x7eu ? 0x7eu : r));
}

// Implemented once per backend for the module's input dtype (quantization_cuda.cu, _host.cc).
Status per_token_group_quant(const GroupQuantParams& p, LaunchContext ctx);
Status scaled_fp8_quant(const TensorQuantParams& p, LaunchContext ctx);

}  // namespace kiln::quantization
