// kiln element types, shared by device code, the CPU backend and the generated configs.
//
//   kiln::f16_t   IEEE binary16     (__half under nvcc; a 16-bit storage struct otherwise)
//   kiln::bf16_t  bfloat16          (__nv_bfloat16 under nvcc; a 16-bit storage struct otherwise)
//   kiln::e4m3_t  fp8 E4M3 "fn"     (__nv_fp8_e4m3 under nvcc; an 8-bit storage struct otherwise):
//                 bias 7, no infinities, S.1111.111 is NaN, largest finite 448 (torch.float8_e4m3fn)
//   kiln::e5m2_t  fp8 E5M2          (__nv_fp8_e5m2 under nvcc; an 8-bit storage struct otherwise):
//                 bias 15, IEEE-style infinities and NaNs, largest finite 57344 (torch.float8_e5m2)
//   float         binary32
//
// Convert<T>::to_float / from_float convert with round-to-nearest-even, the rounding torch uses,
// so the CPU backend produces the same bits as a float32 computation rounded by torch. The fp8
// from_float saturate: E4M3 to +-448, E5M2 to +-57344, infinities too (what torch gives after
// clamping: its own casts overflow to NaN and to infinity); NaN stays NaN.
// Framework free: no torch, no pybind11, no DLPack here.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/common/macros.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kiln {

// Bit-exact storage types for the host compiler; layout-compatible with __half/__nv_bfloat16.
struct host_f16 {
  uint16_t bits;
};
struct host_bf16 {
  uint16_t bits;
};
struct host_e4m3 {
  uint8_t bits;
};
struct host_e5m2 {
  uint8_t bits;
};

#if defined(__CUDACC__)
using f16_t = __half;
using bf16_t = __nv_bfloat16;
using e4m3_t = __nv_fp8_e4m3;
using e5m2_t = __nv_fp8_e5m2;
#else
using f16_t = host_f16;
using bf16_t = host_bf16;
using e4m3_t = host_e4m3;
using e5m2_t = host_e5m2;
#endif

static_assert(sizeof(f16_t) == 2 && sizeof(bf16_t) == 2, "16-bit element types");
static_assert(sizeof(e4m3_t) == 1 && sizeof(e5m2_t) == 1, "8-bit element types");

namespace detail {

KILN_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KILN_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round-to-nearest-even of the low `shift` bits of `m` away (shift >= 1).
inline uint32_t round_shift(uint32_t m, uint32_t shift) {
  const uint32_t kept = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

}  // namespace detail

// float -> binary16, round to nearest even; overflow to +-inf, NaN stays NaN.
inline uint16_t float_to_f16_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  const uint32_t exp = abs >> 23;
  if (exp < 113) {  // below 2^-14: a subnormal half (or zero): k * 2^-24 with k = m >> (126 - exp)
    if (exp < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    return static_cast<uint16_t>(sign | detail::round_shift(m, 126u - exp));
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits; a carry
  // into the exponent is the correctly rounded result.
  const uint32_t h = ((exp - 112u) << 10) | ((abs & 0x7fffffu) >> 13);
  const uint32_t rest = abs & 0x1fffu;
  return static_cast<uint16_t>(sign | (h + ((rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ? 1u : 0u)));
}

inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;  // man * 2^-24
    return sign ? -mag : mag;
  }
  if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (man << 13));
  return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// float -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  return detail::bits_float(static_cast<uint32_t>(b) << 16);
}

// fp8 -> float, exact (every fp8 value is a float). E4M3 "fn": exponent bias 7, subnormals
// m * 2^-9, no infinities, exponent and mantissa all ones (0x7f, 0xff) is NaN.
inline float e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 0xfu && man == 0x7u) return detail::bits_float(sign | 0x7fc00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
    return sign ? -mag : mag;
  }
  return detail::bits_float(sign | ((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
}

// float -> E4M3 bits, round to nearest even, saturated to +-448 (infinities too); NaN -> NaN.
// The host's encoder, and the device's below sm_89 (which has no fp8 conversion instruction; the
// toolkit's __nv_cvt_float_to_fp8, the same rounding, emulates it there through double).
KILN_HOST_DEVICE uint8_t float_to_e4m3_satfinite(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  const uint32_t exp = abs >> 23;
  if (exp < 121) {  // below 2^-6: a subnormal E4M3, m * 2^-9 with m = round(|f| * 2^9) in [0, 8]
    const float scaled = detail::bits_float(abs) * 512.0f;  // exact: a power-of-two scaling
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

// E5M2: exponent bias 15, subnormals m * 2^-16, exponent all ones: infinity (mantissa 0) or NaN.
inline float e5m2_bits_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 2) & 0x1fu;
  const uint32_t man = b & 0x3u;
  if (exp == 0x1fu) return detail::bits_float(sign | 0x7f800000u | (man << 21));
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 1.52587890625e-05f;  // man * 2^-16
    return sign ? -mag : mag;
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 21));  // rebias 15 -> 127
}

// float -> E5M2 bits, round to nearest even, saturated to +-57344 (infinities too); NaN -> NaN.
// Used as float_to_e4m3_satfinite is.
KILN_HOST_DEVICE uint8_t float_to_e5m2_satfinite(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x47600000u) return static_cast<uint8_t>(sign | 0x7bu);  // >= 57344 (and inf): saturate
  const uint32_t exp = abs >> 23;
  if (exp < 113) {  // below 2^-14: a subnormal E5M2, m * 2^-16 with m = round(|f| * 2^16) in [0, 4]
    const float scaled = detail::bits_float(abs) * 65536.0f;  // exact: a power-of-two scaling
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);  // m == 4 is 2^-14, the smallest normal: the same bits
  }
  // Normal: rebias (127 -> 15), keep 2 mantissa bits rounded to nearest even (a carry into the
  // exponent is the correctly rounded result); what rounds past 57344 saturates.
  const uint32_t kept = ((exp - 112u) << 2) | ((abs >> 21) & 0x3u);
  const uint32_t rest = abs & 0x1fffffu;
  const uint32_t r = kept + ((rest > 0x100000u || (rest == 0x100000u && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint8_t>(sign | (r > 0x7bu ? 0x7bu : r));
}

// Conversions between an element type and float, usable in device and host code.
template <typename T>
struct Convert;

template <>
struct Convert<float> {
  static KILN_HOST_DEVICE float to_float(float x) { return x; }
  static KILN_HOST_DEVICE float from_float(float x) { return x; }
};

template <>
struct Convert<host_f16> {
  static inline float to_float(host_f16 x) { return f16_bits_to_float(x.bits); }
  static inline host_f16 from_float(float x) { return host_f16{float_to_f16_bits(x)}; }
};

template <>
struct Convert<host_bf16> {
  static inline float to_float(host_bf16 x) { return bf16_bits_to_float(x.bits); }
  static inline host_bf16 from_float(float x) { return host_bf16{float_to_bf16_bits(x)}; }
};

template <>
struct Convert<host_e4m3> {
  static inline float to_float(host_e4m3 x) { return e4m3_bits_to_float(x.bits); }
  static inline host_e4m3 from_float(float x) { return host_e4m3{float_to_e4m3_satfinite(x)}; }
};

template <>
struct Convert<host_e5m2> {
  static inline float to_float(host_e5m2 x) { return e5m2_bits_to_float(x.bits); }
  static inline host_e5m2 from_float(float x) { return host_e5m2{float_to_e5m2_satfinite(x)}; }
};

#if defined(__CUDACC__)
template <>
struct Convert<__half> {
  static KILN_HOST_DEVICE float to_float(__half x) { return __half2float(x); }
  static KILN_HOST_DEVICE __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Convert<__nv_bfloat16> {
  static KILN_HOST_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static KILN_HOST_DEVICE __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct Convert<__nv_fp8_e4m3> {
  static KILN_HOST_DEVICE float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
  static KILN_HOST_DEVICE __nv_fp8_e4m3 from_float(float x) { return __nv_fp8_e4m3(x); }  // SATFINITE
};

template <>
struct Convert<__nv_fp8_e5m2> {
  static KILN_HOST_DEVICE float to_float(__nv_fp8_e5m2 x) { return static_cast<float>(x); }
  static KILN_HOST_DEVICE __nv_fp8_e5m2 from_float(float x) { return __nv_fp8_e5m2(x); }  // SATFINITE
};
#endif

// The short name of an element type, as the dispatch axis and the error messages spell it.
template <typename T>
constexpr const char* dtype_name();
template <>
constexpr const char* dtype_name<float>() {
  return "f32";
}
template <>
constexpr const char* dtype_name<f16_t>() {
  return "f16";
}
template <>
constexpr const char* dtype_name<bf16_t>() {
  return "bf16";
}
template <>
constexpr const char* dtype_name<e4m3_t>() {
  return "e4m3";
}
template <>
constexpr const char* dtype_name<e5m2_t>() {
  return "e5m2";
}

}  // namespace kiln
