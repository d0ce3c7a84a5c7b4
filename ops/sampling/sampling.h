// Sampling at the end of a decode step: the parameters and entry points shared by the CUDA and the
// host backends, and the arithmetic both use, so that the two draw the same token for the same
// seed (every step below is integer arithmetic or one correctly rounded float operation; the CUDA
// module is compiled with --fmad=false, so no multiply-add is fused on one side only).
//
// One row of `vocab` values: probabilities p (float32) or logits l (the module's dtype).
//   key(i)    the value's float bits mapped so that unsigned order is float order; invalid entries
//             (NaN; -inf logits; probabilities that are not finite and >= 0) get key 0, below all.
//   weight(i) a fixed-point weight relative to the row's largest valid value vmax, in units of
//             2^-40 (kOne = 2^40 is the weight of vmax):
//               probs:  round(p / vmax * 2^40)
//               logits: round(exp((l - vmax) / T) * 2^40), exp by portable_exp below; T <= 0 or
//                       NaN is the T -> 0 limit (greedy: weight kOne where l == vmax, else 0); a
//                       row whose max is +inf splits its mass over its +inf entries.
//             Values below 2^-41 of the max round to weight 0 and are never drawn.
//   Filters, each a threshold on the key (so ties at a threshold all stay):
//     top-k: key >= the k-th largest key (k <= 0 or k >= vocab: no filter).
//     top-p: the smallest prefix of the keys in descending order whose weight reaches
//            ceil(top_p * W) (W: the weight of the domain), the crossing token included: key >= the
//            crossing key. top_p >= 1: no filter. The domain is the whole row, or the top-k set
//            for filter order kTopKFirst (top-k, renormalise, top-p).
//     min-p: value >= min_p * vmax.
//   Draw: K = the kept weight; t = floor(u * K) with u a 64-bit Philox word as a fraction of 2^64;
//   the token is the first index (in vocabulary order) whose running kept weight exceeds t. K == 0
//   (no valid entry) draws -1.
// Thresholds are found by radix selection over the keys (digits of 11, 11 and 10 bits, a count and
// a weight histogram per digit), stopping early once the selected bin holds exactly what is kept.
// A top_k_first top-p over a top-k set of at most kCandidates entries is computed on the gathered
// set instead: an entry is kept when the weight of the larger keys is below the target, which is
// the same set.
//
// The random stream: Philox4x32-10 keyed by the seed, counter (offset lo, offset hi, output row,
// draw); the output row, not the input row (`indices`), so the same seed, offset and row give the
// same draw whatever the batch size and the other rows hold.
//
// The seed and offset are numbers, or int64 tensors (one value, or one per output row) read on the
// device, so a captured CUDA graph can draw fresh numbers on every replay.
//
// Layout: input rows of `vocab` elements, contiguous in the last dimension, row stride in elements.
// Framework free.
#pragma once

#include <cstdint>

#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

#if !defined(__CUDACC__)
#include <cmath>
#include <cstring>
#endif

namespace kiln::sampling {

// Index errors of the sampling family (ops/common/device_error.h): codes and messages.
enum class ErrorCode : int64_t {
  kSamplingIndex = error_code("sampling", 1),  // a sampler's indices[i] is not a row of its probs/logits
  kDraftTokenId = error_code("sampling", 2),   // a draft token id of speculative sampling is not in the vocabulary
};
inline constexpr ErrorText kErrorTexts[] = {
    {int64_t(ErrorCode::kSamplingIndex),
     "indices[{position}] = {value} is not a row of the probabilities/logits: valid are [0, {bound})"},
    {int64_t(ErrorCode::kDraftTokenId),
     "draft_token_ids (flattened)[{position}] = {value} is not a token of the vocabulary: valid are [0, {bound})"},
};
KILN_REGISTER_ERROR_TEXTS(kErrorTexts)

// What a row call produces.
enum class Output : int { kSample = 0, kProbs = 1, kMaskedLogits = 2, kSoftmax = 3 };
// How top-k and top-p combine (FlashInfer's filter_apply_order).
enum class Order : int { kTopKFirst = 0, kJoint = 1 };

inline constexpr uint64_t kOne = uint64_t(1) << 40;     // the fixed-point weight of the row's max
inline constexpr int64_t kMaxVocab = int64_t(1) << 23;  // kOne * vocab stays below 2^64
inline constexpr int kThreads = 1024;                   // one CTA per row
// top_k_first top-k + top-p draws whose top-k set holds at most this many entries run top-p and
// the draw over the gathered set (one entry per thread), with the same result as over the row.
inline constexpr int kCandidates = kThreads;
inline constexpr int kBins = 1 << 11;  // bins of the widest radix digit

// Where a call's random numbers come from: the scalars, or per-row (or length-1) int64 arrays.
struct Stream {
  uint64_t seed = 0, offset = 0;
  const int64_t* seeds = nullptr;    // [seeds_len], or null: `seed`
  const int64_t* offsets = nullptr;  // [offsets_len], or null: `offset`
  int64_t seeds_len = 0, offsets_len = 0;
};

struct RowParams {
  const void* input;  // [rows_in, vocab]: probs (float32) or logits (the module's dtype)
  int64_t rows, rows_in, vocab, in_stride;
  const void* indices;  // [rows] int32/int64 row of the input per output row, or null (row r)
  bool indices64;
  bool logits;  // the input holds logits (weights exp((l - max) / T)), else probabilities
  Output output;
  Order order;
  // Per-row arrays (null: the scalar applies to every row).
  const float* temperature;
  float temperature_val;
  const void* top_k;  // int32 or int64
  bool top_k64;
  int64_t top_k_val;  // <= 0: no top-k
  const float* top_p;
  float top_p_val;  // >= 1: no top-p
  const float* min_p;
  float min_p_val;  // <= 0: no min-p
  Stream rng;
  void* samples;  // kSample: [rows] int32 or int64
  bool samples64;
  void* out;  // kProbs / kSoftmax: [rows, vocab] float32; kMaskedLogits: the input's dtype
  int64_t out_stride;
  int64_t* errors;  // the device's index-error record (null on the host)
  bool vec16;       // set by the CUDA launcher: every input row is 16-byte aligned (vector loads)
};

struct SpecParams {
  const float* draft_probs;  // [batch, n, vocab]
  const void* draft_ids;     // [batch, n] int32 or int64
  bool draft_ids64;
  const float* target_probs;  // [batch, n + 1, vocab]
  int64_t batch, n, vocab;
  int64_t draft_stride_b, draft_stride_n, target_stride_b, target_stride_n, ids_stride_b;
  Stream rng;
  int32_t* out_ids;   // [batch, n + 1], -1 past the first rejection
  int32_t* accepted;  // [batch], += the positions whose acceptance test passes
  int32_t* emitted;   // [batch], += the draft tokens emitted
  int64_t* errors;
};

// The radix digits, most significant first: 11, 11 and 10 bits of the 32-bit key.
inline constexpr int kLevels = 3;
KILN_HOST_DEVICE constexpr int digit_bits(int level) {
  return level < 2 ? 11 : 10;
}
// The number of key bits at and below this level's digit (the bits above it form the prefix).
KILN_HOST_DEVICE constexpr int digit_top(int level) {
  return 32 - 11 * (level < 2 ? level : 2);
}

// ---------------------------------------------------------------------------------------------
// Bit casts, the order-preserving key and the fixed-point weight.

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

KILN_HOST_DEVICE bool is_nan(float f) {
  return (float_bits(f) & 0x7fffffffu) > 0x7f800000u;
}

// Unsigned order of the result is the float order of f, -0 and +0 one key (they compare equal, so
// they tie at a threshold); 0 is reserved for invalid entries.
KILN_HOST_DEVICE uint32_t ordered_key(float f) {
  const uint32_t u = f == 0.0f ? 0u : float_bits(f);
  const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k == 0u ? 1u : k;  // only -NaN patterns map to 0; they are invalid anyway
}

KILN_HOST_DEVICE bool valid_value(float v, bool logits) {
  if (is_nan(v)) return false;
  return logits ? v > -INFINITY : (v >= 0.0f && v < INFINITY);
}

KILN_HOST_DEVICE uint32_t key_of(float v, bool logits) {
  return valid_value(v, logits) ? ordered_key(v) : 0u;
}

// The largest key below which nothing is kept for a value threshold v (min-p): key >= key_at(v)
// <=> value >= v for valid values.
KILN_HOST_DEVICE uint32_t key_at(float v) {
  return ordered_key(v);
}

KILN_HOST_DEVICE uint64_t fix(float r) {      // r in [0, 1] -> round(r * 2^40), round to nearest even
  const float scaled = r * 1099511627776.0f;  // exact: a power of two
#if defined(__CUDA_ARCH__)
  return __float2ull_rn(scaled);
#else
  return static_cast<uint64_t>(std::nearbyint(scaled));
#endif
}

// exp(x) for x <= 0 with the same bits on the host and the device (fmaf and exact scalings only):
// x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), exp(r) by its degree-6 Taylor polynomial
// (truncation error < 2^-26 relative), times 2^k. Below -30, where the weight rounds to 0, 0.
KILN_HOST_DEVICE float portable_exp(float x) {
  if (!(x > -30.0f)) return 0.0f;
  if (x >= 0.0f) return 1.0f;  // x == 0 (the max) or a rounding above it
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln2's leading 16 bits: k * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  const float k = rintf(x * kLog2e);
  float r = fmaf(-k, kLn2Hi, x);
  r = fmaf(-k, kLn2Lo, r);
  float p = 1.0f / 720.0f;
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  return p * bits_float(uint32_t(127 + int(k)) << 23);  // 2^k, k in [-44, 0]: exact
}

// The weight of value v of a row whose largest valid value is vmax (see the file comment).
KILN_HOST_DEVICE uint64_t weight_of(float v, float vmax, bool logits, float temperature) {
  if (!valid_value(v, logits)) return 0;
  if (!logits) return vmax > 0.0f ? fix(v / vmax) : 0;
  if (vmax == INFINITY) return v == INFINITY ? kOne : 0;
  if (!(temperature > 0.0f)) return v == vmax ? kOne : 0;
  return fix(portable_exp((v - vmax) / temperature));
}

// Softmax's numerator exp((l - max) / T) in float (the expf of each backend), with the same special
// cases as weight_of.
KILN_HOST_DEVICE float softmax_numerator(float l, float lmax, float temperature) {
  if (!valid_value(l, true)) return 0.0f;
  if (lmax == INFINITY) return l == INFINITY ? 1.0f : 0.0f;
  if (!(temperature > 0.0f)) return l == lmax ? 1.0f : 0.0f;
  return expf((l - lmax) / temperature);
}

// Speculative sampling's residual max(q - p, 0); 0 where either is not a valid probability.
KILN_HOST_DEVICE float residual(float q, float p) {
  if (!valid_value(q, false) || !valid_value(p, false)) return 0.0f;
  const float d = q - p;
  return d > 0.0f ? d : 0.0f;
}

// floor(u * k / 2^64): the 64-bit fraction u scaled to [0, k).
KILN_HOST_DEVICE uint64_t scale_u64(uint64_t u, uint64_t k) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(u, k);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(u) * k) >> 64);
#endif
}

// ceil(top_p * w), clamped to [1, w] (w > 0): the weight the top-p prefix must reach.
KILN_HOST_DEVICE uint64_t top_p_target(float top_p, uint64_t w) {
  double t = ceil(double(top_p) * double(w));
  uint64_t target = t >= double(w) ? w : (t < 1.0 ? 1 : uint64_t(t));
  return target < 1 ? 1 : target;
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).

struct U32x4 {
  uint32_t x, y, z, w;
};

KILN_HOST_DEVICE void mul_hilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  *lo = uint32_t(p);
}

KILN_HOST_DEVICE U32x4 philox(uint64_t seed, U32x4 c) {
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hilo(0xD2511F53u, c.x, &hi0, &lo0);
    mul_hilo(0xCD9E8D57u, c.z, &hi1, &lo1);
    c = U32x4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The two 64-bit uniform words of draw `draw` of output row `row`.
struct Uniforms {
  uint64_t a, b;
};

KILN_HOST_DEVICE Uniforms uniforms(uint64_t seed, uint64_t offset, int64_t row, uint32_t draw) {
  const U32x4 r = philox(seed, U32x4{uint32_t(offset), uint32_t(offset >> 32), uint32_t(row), draw});
  return {(uint64_t(r.x) << 32) | r.y, (uint64_t(r.z) << 32) | r.w};
}

// The uniforms of output row `row` from a call's stream.
KILN_HOST_DEVICE Uniforms row_uniforms(const Stream& s, int64_t row, uint32_t draw) {
  const uint64_t seed = s.seeds ? uint64_t(s.seeds[s.seeds_len == 1 ? 0 : row]) : s.seed;
  const uint64_t offset = s.offsets ? uint64_t(s.offsets[s.offsets_len == 1 ? 0 : row]) : s.offset;
  return uniforms(seed, offset, row, draw);
}

// u as a double in [0, 1) (its top 53 bits).
KILN_HOST_DEVICE double unit_double(uint64_t u) {
  return double(u >> 11) * (1.0 / 9007199254740992.0);
}

// Speculative sampling's acceptance test of a draft token with draft probability p and target
// probability q: accept with probability min(1, q / p), as u * p < q (p == 0 accepts when q > 0).
KILN_HOST_DEVICE bool accept_draft(uint64_t u, float p, float q) {
  return unit_double(u) * double(p) < double(q);
}

// Per-row parameter values.
KILN_HOST_DEVICE float row_temperature(const RowParams& p, int64_t r) {
  return p.temperature ? p.temperature[r] : p.temperature_val;
}
KILN_HOST_DEVICE int64_t row_top_k(const RowParams& p, int64_t r) {
  if (!p.top_k) return p.top_k_val;
  return p.top_k64 ? static_cast<const int64_t*>(p.top_k)[r] : static_cast<const int32_t*>(p.top_k)[r];
}
KILN_HOST_DEVICE float row_top_p(const RowParams& p, int64_t r) {
  return p.top_p ? p.top_p[r] : p.top_p_val;
}
KILN_HOST_DEVICE float row_min_p(const RowParams& p, int64_t r) {
  return p.min_p ? p.min_p[r] : p.min_p_val;
}
KILN_HOST_DEVICE int64_t row_index(const RowParams& p, int64_t r) {
  if (!p.indices) return r;
  return p.indices64 ? static_cast<const int64_t*>(p.indices)[r] : static_cast<const int32_t*>(p.indices)[r];
}
KILN_HOST_DEVICE int64_t draft_id(const SpecParams& p, int64_t b, int64_t j) {
  const int64_t at = b * p.ids_stride_b + j;
  return p.draft_ids64 ? static_cast<const int64_t*>(p.draft_ids)[at] : static_cast<const int32_t*>(p.draft_ids)[at];
}

// Implemented once per backend for the module's dtype (sampling_cuda.cu, sampling_host.cc).
Status sample_rows(const RowParams& p, LaunchContext ctx);
Status chain_speculative(const SpecParams& p, LaunchContext ctx);

}  // namespace kiln::sampling
