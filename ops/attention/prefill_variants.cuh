// The device pieces of the prefill kernel's variants (prefill.cuh, FlashInfer's names): a custom
// mask, RoPE applied inside the kernel, ALiBi. attention.h (PrefillParams, PrefillPosEncoding)
// has their definitions; each is a compile-time option of prefill_paged_kernel, so the plain
// kernel's code is the same whether these exist or not.
//
// Layouts assumed: K and Q tiles in shared memory as prefill.cuh stages them, rows of CHUNKS
// 16-byte chunks with the XOR swizzle swz(); the custom mask as attention.h describes it (bits
// little-endian from a request's first byte, row-major over [qo_len, kv_len]).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/attention.h"
#include "ops/common/mma.cuh"

namespace kiln::attention {

// Chunk `chunk` of row `row` in a swizzled [rows][CHUNKS] tile: the XOR spreads the 8 rows an
// ldmatrix reads over all banks.
template <int CHUNKS>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * CHUNKS + (chunk ^ (row & 7));
}

// ---- custom mask ------------------------------------------------------------------------------

// Bit k (k < TILE) of the result is mask bit bit0 + k: the visibility of keys key0 .. key0 + TILE
// - 1 for one query row (bit0 = the request's first bit + qi * kv_len + key0). Bytes outside
// [begin, end) are not read and give 0 bits. TILE / 8 + 1 byte loads.
template <int TILE>
__device__ __forceinline__ uint64_t mask_row_bits(const uint8_t* mask, int64_t begin, int64_t end, int64_t bit0) {
  static_assert(TILE == 32 || TILE == 64, "a tile's bits fit one 64-bit word");
  constexpr int kBytes = TILE / 8;
  const int64_t byte0 = bit0 >> 3;
  const int shift = static_cast<int>(bit0 & 7);
  uint64_t word = 0;
#pragma unroll
  for (int i = 0; i < kBytes; ++i) {
    const int64_t b = byte0 + i;
    const uint64_t v = b >= begin && b < end ? __ldg(mask + b) : 0u;
    word |= v << (8 * i);
  }
  const int64_t b = byte0 + kBytes;
  const uint64_t extra = b >= begin && b < end ? __ldg(mask + b) : 0u;  // the bits shifted in
  if constexpr (TILE == 64) {
    return shift == 0 ? word : (word >> shift) | (extra << (64 - shift));
  } else {
    return (word | (extra << 32)) >> shift;
  }
}

// The bits of row word w (mask_row_bits) that lane t of a quad tests, packed: its keys are
// n * 8 + 2 t + j (the C fragments' columns, n < TILE / 8, j < 2), bit 2 n + j of the result.
template <int TILE>
__device__ __forceinline__ uint32_t quad_lane_bits(uint64_t w, int t) {
  w >>= 2 * t;
  uint32_t out = 0;
#pragma unroll
  for (int n = 0; n < TILE / 8; ++n) out |= static_cast<uint32_t>((w >> (8 * n)) & 3u) << (2 * n);
  return out;
}

// ---- RoPE ---------------------------------------------------------------------------------------

// sin and cos of x: x reduced to [-pi, pi] by k * 2 pi in two parts (2 pi = kTwoPiHi + kTwoPiLo to
// ~2^-48), then the special-function unit's approximations (|error| < 2^-21 there). Agrees with
// sinf/cosf to about 1e-6 for the angles RoPE makes (pos * freq, pos < 2^24), without sinf's
// slow path for large arguments, which needs local memory.
__device__ __forceinline__ void rope_sincos(float x, float* s, float* c) {
  constexpr float kInvTwoPi = 0.159154943091895336f;
  constexpr float kTwoPiHi = 6.28318548202514648f;      // 2 pi rounded to float
  constexpr float kTwoPiLo = -1.74845553146951266e-7f;  // 2 pi - kTwoPiHi
  const float k = rintf(x * kInvTwoPi);
  float r = fmaf(-k, kTwoPiHi, x);
  r = fmaf(-k, kTwoPiLo, r);
  __sincosf(r, s, c);
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// The frequencies of the head_dim / 2 rotary pairs, into shared memory (once per CTA).
template <int HEAD_DIM, int THREADS>
__device__ __forceinline__ void rope_frequencies(const PrefillParams& p, float* freq) {
  for (int d = threadIdx.x; d < HEAD_DIM / 2; d += THREADS) freq[d] = rope_frequency(p, d, HEAD_DIM);
}

// Rotates rows [0, ROWS) of a swizzled [ROWS][CHUNKS] tile of T in place, row r at position
// pos0 + r: element d pairs with d + HEAD_DIM / 2, the same lane of chunk c + CHUNKS / 2, so a
// thread takes whole chunk pairs (its chunk c = threadIdx.x % (CHUNKS / 2) is the same for every
// row it takes). The caller synchronises before (the tile has landed) and after.
template <typename T, int HEAD_DIM, int THREADS, int ROWS>
__device__ __forceinline__ void rope_rotate_tile(uint4* tile, int pos0, const float* freq) {
  constexpr int CHUNKS = HEAD_DIM * int(sizeof(T)) / 16, HALF = CHUNKS / 2, VEC = 16 / int(sizeof(T));
  constexpr int STEP = THREADS / HALF;
  static_assert(THREADS % HALF == 0 && ROWS % STEP == 0, "whole chunk pairs per step");
  const int c = threadIdx.x % HALF, r0 = threadIdx.x / HALF;
  const float* f = freq + c * VEC;
  // One row at a time (not unrolled): the kernel's O accumulators are live around this, so the
  // registers of several rows in flight would spill.
#pragma unroll 1
  for (int r = r0; r < ROWS; r += STEP) {
    uint4* lo = tile + swz<CHUNKS>(r, c);
    uint4* hi = tile + swz<CHUNKS>(r, c + HALF);
    const uint4 a = *lo, b = *hi;
    uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
    const float pos = static_cast<float>(pos0 + r);
#pragma unroll
    for (int w = 0; w < 4; ++w) {  // two elements a word
      const float2 xa = unpack2<T>(x[w]), ya = unpack2<T>(y[w]);
      float s0, c0, s1, c1;
      rope_sincos(pos * f[2 * w], &s0, &c0);
      rope_sincos(pos * f[2 * w + 1], &s1, &c1);
      x[w] = pack2<T>(xa.x * c0 - ya.x * s0, xa.y * c1 - ya.y * s1);
      y[w] = pack2<T>(ya.x * c0 + xa.x * s0, ya.y * c1 + xa.y * s1);
    }
    *lo = make_uint4(x[0], x[1], x[2], x[3]);
    *hi = make_uint4(y[0], y[1], y[2], y[3]);
  }
}

}  // namespace kiln::attention
