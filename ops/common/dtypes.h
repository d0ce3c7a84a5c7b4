// kiln element types, shared by device code, the CPU backend and the generated configs.
//
//   kiln::f16_t   IEEE binary16     (__half under nvcc; a 16-bit storage struct otherwise)
//   kiln::bf16_t  bfloat16          (__nv_bfloat16 under nvcc; a 16-bit storage struct otherwise)
//   float         binary32
//
// Convert<T>::to_float / from_float convert with round-to-nearest-even, the rounding torch uses,
// so the CPU backend produces the same bits as a float32 computation rounded by torch. Framework
// free: no torch, no pybind11, no DLPack here.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/common/macros.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kiln {

// Bit-exact storage types for the host compiler; layout-compatible with __half/__nv_bfloat16.
struct host_f16 {
  uint16_t bits;
};
struct host_bf16 {
  uint16_t bits;
};

#if defined(__CUDACC__)
using f16_t = __half;
using bf16_t = __nv_bfloat16;
#else
using f16_t = host_f16;
using bf16_t = host_bf16;
#endif

static_assert(sizeof(f16_t) == 2 && sizeof(bf16_t) == 2, "16-bit element types");

namespace detail {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
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

}  // namespace kiln
