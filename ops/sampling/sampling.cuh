// Sampling CUDA kernels and their launchers (see sampling.h for the contract and the arithmetic).
//
// One CTA of kThreads (1024) threads per row, a grid-stride loop over rows. A row is read in a few
// passes (from L2 while it fits; a 128256-entry row is 501 KiB of float32): its max; per radix
// digit of the top-k and top-p thresholds one pass building a count and a weight histogram in
// shared memory (2048 bins: 8 + 16 KiB), the selected bin found by a block scan over the bins in
// descending order; then one pass for the kept weight where the thresholds did not give it, and
// the draw: tiles of kThreads x kPerThread consecutive entries, a block sum per tile until the
// running weight passes the target, then a block scan inside that tile. No sort, no rejection
// loop, and every sum is an integer, so the result does not depend on the order of the atomics.
//
// softmax (sm90+): a cluster of CTAs per row, the row read once (softmax.cuh); the row kernel
// where that does not apply.
//
// chain_speculative: one CTA per request; thread 0 runs the acceptance tests, the block draws the
// resampled or bonus token with the same draw.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/common/reduce.cuh"
#include "ops/common/vec.cuh"
#include "ops/sampling/sampling.h"
#include "ops/sampling/softmax.cuh"

namespace kiln::sampling {

constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 8;  // consecutive entries per thread in a draw tile
constexpr int kBinsPerThread = kBins / kThreads;
static_assert(kBins % kThreads == 0, "bins are split evenly over the threads");

struct Shared {
  uint32_t count[kBins];
  uint64_t weight[kBins];
  uint64_t scan_u64[kWarps];
  float scan_f32[kWarps];
  // The selected bin of a radix level: digit, what lies above it, and what it holds.
  uint32_t sel_digit, sel_count;
  uint64_t sel_above_count, sel_above_weight, sel_weight, sel_want;
  int64_t found;
  float row_max;  // the row's largest valid value, when a radix level computed it
  // The top-k set gathered for top-p and the draw (candidate_top_p_draw): index, key and weight.
  int32_t cand_index[kCandidates];
  uint32_t cand_key[kCandidates];
  uint64_t cand_weight[kCandidates];
  uint32_t cand_count;
};

template <typename T>
__device__ __forceinline__ float load(const T* x, int64_t i) {
  return Convert<T>::to_float(x[i]);
}

// f(i, value) for every entry i < n of a row, the entries split over the block: 16-byte vectors,
// two in flight per thread, where the row is 16-byte aligned (`vec`), single elements otherwise
// and for the tail. A streaming pass over a 0.5 MB row is latency-bound in one CTA: the bytes in
// flight per thread set its speed.
template <typename T, typename F>
__device__ __forceinline__ void for_each_value(const T* x, int64_t n, bool vec, F&& f) {
  constexpr int V = 16 / int(sizeof(T));
  using Vt = Vec<T, V>;
  int64_t done = 0;
  if (vec) {
    const int64_t nv = n / V;
    int64_t j = threadIdx.x;
    for (; j + kThreads < nv; j += 2 * kThreads) {
      const Vt a = Vt::load_ro(x + j * V);
      const Vt b = Vt::load_ro(x + (j + kThreads) * V);
#pragma unroll
      for (int e = 0; e < V; ++e) f(j * V + e, a.get(e));
#pragma unroll
      for (int e = 0; e < V; ++e) f((j + kThreads) * V + e, b.get(e));
    }
    if (j < nv) {
      const Vt a = Vt::load_ro(x + j * V);
#pragma unroll
      for (int e = 0; e < V; ++e) f(j * V + e, a.get(e));
    }
    done = nv * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) f(i, load(x, i));
}

__device__ __forceinline__ float block_max(float v, Shared& s) {
  return kiln::block_max(v, s.scan_f32);
}

__device__ __forceinline__ float block_sum_f32(float v, Shared& s) {
  return kiln::block_sum(v, s.scan_f32);
}

// Exclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ __forceinline__ uint64_t block_exclusive_scan(uint64_t v, Shared& s, uint64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  if (lane == 31) s.scan_u64[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    uint64_t w = lane < kWarps ? s.scan_u64[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t up = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += up;
    }
    if (lane < kWarps) s.scan_u64[lane] = w;  // inclusive warp totals
  }
  __syncthreads();
  const uint64_t before = warp > 0 ? s.scan_u64[warp - 1] : 0;
  *total = s.scan_u64[kWarps - 1];
  __syncthreads();
  return before + incl - v;
}

__device__ __forceinline__ uint64_t block_sum_u64(uint64_t v, Shared& s) {
  uint64_t total;
  block_exclusive_scan(v, s, &total);
  return total;
}

// One radix level over the entries whose key matches `prefix` above this level's digit and lies in
// the domain: a count and a weight histogram of the digit, then the bin, in descending order, where
// the running count (by_weight false) or weight (true) first reaches `want`. At level 0 of a weight
// selection `want` is top_p_target(top_p, the domain's weight). Results in s.sel_*, for every thread.
// with_max: the same pass also finds the row's largest valid value (s.row_max; top-k's first level
// needs no weights, so it can run before the max is known, and the max costs no pass of its own).
template <typename T, typename InDomain>
__device__ void radix_level(const T* x, const RowParams& p, float vmax, float temperature, int level, uint32_t prefix,
                            uint64_t want, bool by_weight, float top_p, InDomain in_domain, Shared& s,
                            bool with_max = false) {
  const int hi = digit_top(level);
  const int shift = hi - digit_bits(level);
  const int mask = (1 << digit_bits(level)) - 1;
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.count[b] = 0;
    s.weight[b] = 0;
  }
  __syncthreads();
  float local_max = -INFINITY;
  for_each_value(x, p.vocab, p.vec16, [&](int64_t, float v) {
    if (with_max && valid_value(v, p.logits)) local_max = fmaxf(local_max, v);
    const uint32_t key = key_of(v, p.logits);
    if (level > 0 && (key >> hi) != (prefix >> hi)) return;
    if (!in_domain(key)) return;
    const uint32_t d = (key >> shift) & uint32_t(mask);
    atomicAdd(&s.count[d], 1u);
    if (!by_weight) return;  // a count selection (top-k) needs no weights: no exp, no 64-bit atomics
    const uint64_t w = weight_of(v, vmax, p.logits, temperature);
    if (w != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&s.weight[d]), static_cast<unsigned long long>(w));
  });
  __syncthreads();
  if (with_max) {
    local_max = block_max(local_max, s);
    if (threadIdx.x == 0) s.row_max = local_max;  // read after the scans' barriers below
  }
  // Thread t owns the descending positions t * kBinsPerThread + j: bin mask - position.
  uint64_t c_local[kBinsPerThread], w_local[kBinsPerThread];
  uint64_t c_sum = 0, w_sum = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int bin = mask - int(threadIdx.x) * kBinsPerThread - j;
    c_local[j] = bin >= 0 ? s.count[bin] : 0;
    w_local[j] = bin >= 0 ? s.weight[bin] : 0;
    c_sum += c_local[j];
    w_sum += w_local[j];
  }
  uint64_t c_total, w_total;
  uint64_t c_run = block_exclusive_scan(c_sum, s, &c_total);
  uint64_t w_run = block_exclusive_scan(w_sum, s, &w_total);
  if (by_weight && level == 0) want = w_total > 0 ? top_p_target(top_p, w_total) : 0;
  if (threadIdx.x == 0) {
    s.sel_want = want;
    s.sel_digit = 0;
    s.sel_count = 0;
    s.sel_above_count = c_total;
    s.sel_above_weight = w_total;
    s.sel_weight = 0;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const uint64_t run = by_weight ? w_run : c_run;
    const uint64_t here = by_weight ? w_local[j] : c_local[j];
    if (want > 0 && run < want && want <= run + here) {  // exactly one bin of one thread
      s.sel_digit = uint32_t(mask - int(threadIdx.x) * kBinsPerThread - j);
      s.sel_count = uint32_t(c_local[j]);
      s.sel_above_count = c_run;
      s.sel_above_weight = w_run;
      s.sel_weight = w_local[j];
    }
    c_run += c_local[j];
    w_run += w_local[j];
  }
  __syncthreads();
}

// The state of a threshold search: the key prefix found so far and what lies above it.
struct Threshold {
  uint32_t key = 0;          // keep key >= this
  uint64_t kept_weight = 0;  // the weight of what is kept (of the search's domain; top-p)
  uint64_t kept_count = 0;   // the entries kept (top-k: k, or more with ties at the threshold)
  bool found = false;
};

// The k-th largest key of the row (count selection; no weights). Its first level also finds the
// row's max (s.row_max).
template <typename T>
__device__ Threshold top_k_threshold(const T* x, const RowParams& p, float temperature, int64_t k, Shared& s) {
  Threshold t;
  uint32_t prefix = 0;
  uint64_t rank = uint64_t(k);
  for (int level = 0; level < kLevels; ++level) {
    radix_level(
        x, p, 0.0f, temperature, level, prefix, rank, false, 1.0f, [](uint32_t) { return true; }, s, level == 0);
    prefix |= s.sel_digit << (digit_top(level) - digit_bits(level));
    rank -= s.sel_above_count;
    if (s.sel_count == rank || level == kLevels - 1) {
      t.key = prefix;
      t.kept_count = uint64_t(k) - rank + s.sel_count;  // everything above the bin, and the bin
      t.found = true;
      break;
    }
  }
  return t;
}

// The crossing key of top-p over the entries with key >= domain_key (weight selection).
template <typename T>
__device__ Threshold top_p_threshold(const T* x, const RowParams& p, float vmax, float temperature, float top_p,
                                     uint32_t domain_key, Shared& s) {
  Threshold t;
  uint32_t prefix = 0;
  uint64_t want = 0, above_weight = 0;
  for (int level = 0; level < kLevels; ++level) {
    radix_level(
        x, p, vmax, temperature, level, prefix, want, true, top_p,
        [domain_key](uint32_t key) { return key >= domain_key; }, s);
    if (s.sel_want == 0) return t;  // nothing of weight: no threshold (the draw gives -1)
    prefix |= s.sel_digit << (digit_top(level) - digit_bits(level));
    want = s.sel_want - s.sel_above_weight;
    above_weight += s.sel_above_weight;
    if (s.sel_count == 1 || level == kLevels - 1) {
      t.key = prefix;
      t.kept_weight = above_weight + s.sel_weight;
      t.found = true;
      break;
    }
  }
  return t;
}

// The first index of [0, n) whose running weight exceeds floor(u * K) (K the total), or -1 when
// the total is 0. `weight(i)` is called for i < n only.
template <typename W>
__device__ int64_t block_draw(int64_t n, W weight, uint64_t total, bool total_known, uint64_t u, Shared& s) {
  if (!total_known) {
    uint64_t local = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) local += weight(i);
    total = block_sum_u64(local, s);
  }
  if (total == 0) return -1;
  const uint64_t target = scale_u64(u, total);
  uint64_t running = 0;
  constexpr int64_t kTile = int64_t(kThreads) * kPerThread;
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t first = base + int64_t(threadIdx.x) * kPerThread;
    uint64_t w[kPerThread], local = 0;
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
      w[e] = first + e < n ? weight(first + e) : 0;
      local += w[e];
    }
    uint64_t tile_total;
    const uint64_t before = block_exclusive_scan(local, s, &tile_total);
    if (running + tile_total > target) {
      uint64_t cum = running + before;
      if (cum <= target && target < cum + local) {
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
          cum += w[e];
          if (cum > target) {
            s.found = first + e;
            break;
          }
        }
      }
      __syncthreads();
      const int64_t found = s.found;
      __syncthreads();
      return found;
    }
    running += tile_total;
  }
  return -1;  // not reached: target < total
}

__device__ __forceinline__ uint32_t block_min_u32(uint32_t v, Shared& s) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) s.scan_u64[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? uint32_t(s.scan_u64[threadIdx.x & 31]) : 0xffffffffu;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

// top_k_first top-p and the draw over the top-k set gathered into shared memory (at most
// kCandidates entries, key >= keep): the same tokens as the row passes (top_p_threshold, then
// block_draw), from one pass over the row instead of 3-4. Candidate c is kept by top-p when the
// weight of the candidates with a larger key is below the target, so the kept set is every key >=
// the smallest kept key (ties at the crossing stay); the draw is the inverse CDF in vocabulary
// order, a candidate's running weight the kept weight of the candidates of smaller index.
// Returns the token, or -1 when the top-k set has no weight.
template <typename T>
__device__ int64_t candidate_top_p_draw(const T* x, const RowParams& p, float vmax, float temperature, uint32_t keep,
                                        float top_p, uint64_t u, Shared& s) {
  if (threadIdx.x == 0) s.cand_count = 0;
  __syncthreads();
  for_each_value(x, p.vocab, p.vec16, [&](int64_t i, float v) {
    const uint32_t key = key_of(v, p.logits);
    if (key < keep) return;
    const uint32_t slot = atomicAdd(&s.cand_count, 1u);
    if (slot >= uint32_t(kCandidates)) return;  // cannot happen: the caller checked the count
    s.cand_index[slot] = int32_t(i);
    s.cand_key[slot] = key;
    s.cand_weight[slot] = weight_of(v, vmax, p.logits, temperature);
  });
  __syncthreads();
  const int n = int(min(s.cand_count, uint32_t(kCandidates)));
  const bool mine = int(threadIdx.x) < n;  // one candidate per thread (kCandidates == kThreads)
  const uint32_t my_key = mine ? s.cand_key[threadIdx.x] : 0u;
  const uint64_t my_weight = mine ? s.cand_weight[threadIdx.x] : 0;
  const int32_t my_index = mine ? s.cand_index[threadIdx.x] : 0;
  const uint64_t domain = block_sum_u64(my_weight, s);  // top_p_threshold's first-level total
  if (domain == 0) return -1;
  const uint64_t want = top_p_target(top_p, domain);
  uint64_t above = 0;
  for (int j = 0; j < n; ++j) above += s.cand_key[j] > my_key ? s.cand_weight[j] : 0;
  const uint32_t crossing = block_min_u32(mine && above < want ? my_key : 0xffffffffu, s);
  const bool kept = mine && my_key >= crossing;
  const uint64_t kept_weight = block_sum_u64(kept ? my_weight : 0, s);
  const uint64_t target = scale_u64(u, kept_weight);  // kept_weight >= the max's weight > 0
  if (threadIdx.x == 0) s.found = -1;
  __syncthreads();
  if (kept && my_weight > 0) {
    uint64_t before = 0;
    for (int j = 0; j < n; ++j) {
      if (s.cand_index[j] < my_index && s.cand_key[j] >= crossing) before += s.cand_weight[j];
    }
    if (before <= target && target < before + my_weight) s.found = my_index;
  }
  __syncthreads();
  const int64_t found = s.found;
  __syncthreads();
  return found;
}

__device__ __forceinline__ void write_sample(const RowParams& p, int64_t r, int64_t token) {
  if (p.samples64) {
    static_cast<int64_t*>(p.samples)[r] = token;
  } else {
    static_cast<int32_t*>(p.samples)[r] = int32_t(token);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) row_kernel(const RowParams p) {
  __shared__ Shared s;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t src = row_index(p, r);
    if (src < 0 || src >= p.rows_in) {
      if (threadIdx.x == 0) {
        record_error(p.errors, ErrorCode::kSamplingIndex, r, src, p.rows_in);
        if (p.output == Output::kSample) write_sample(p, r, -1);
      }
      continue;
    }
    const T* x = static_cast<const T*>(p.input) + src * p.in_stride;
    const float temperature = p.logits ? row_temperature(p, r) : 1.0f;
    const int64_t k = p.output == Output::kSoftmax ? 0 : row_top_k(p, r);
    const bool use_top_k = k > 0 && k < p.vocab;
    // The filters: one threshold key each, combined as their maximum. Top-k first (its first level
    // also finds the max), else a pass for the max alone.
    uint32_t keep = 0;
    float vmax = -INFINITY;
    uint64_t kept_count = 0;
    if (use_top_k) {
      const Threshold t = top_k_threshold(x, p, temperature, k, s);
      keep = t.key;
      kept_count = t.kept_count;
      vmax = s.row_max;
    } else {
      for_each_value(x, p.vocab, p.vec16, [&](int64_t, float v) {
        if (valid_value(v, p.logits)) vmax = fmaxf(vmax, v);
      });
      vmax = block_max(vmax, s);
    }

    if (p.output == Output::kSoftmax) {  // float arithmetic, no filters
      float* out = static_cast<float*>(p.out) + r * p.out_stride;
      float local = 0.0f;
      for_each_value(x, p.vocab, p.vec16, [&](int64_t, float v) { local += softmax_numerator(v, vmax, temperature); });
      const float z = block_sum_f32(local, s);
      for_each_value(x, p.vocab, p.vec16, [&](int64_t i, float v) {
        const float e = softmax_numerator(v, vmax, temperature);
        out[i] = z > 0.0f ? e / z : 0.0f;
      });
      continue;
    }

    const float top_p = row_top_p(p, r);
    const float min_p = row_min_p(p, r);
    if (p.output == Output::kSample && use_top_k && top_p < 1.0f && p.order == Order::kTopKFirst && !(min_p > 0.0f) &&
        kept_count <= uint64_t(kCandidates)) {  // the common decode step
      const int64_t token = candidate_top_p_draw(x, p, vmax, temperature, keep, top_p, row_uniforms(p.rng, r, 0).a, s);
      if (threadIdx.x == 0) write_sample(p, r, token);
      continue;
    }
    uint64_t kept_weight = 0;
    bool weight_known = false;
    if (top_p < 1.0f) {  // NaN: no filter
      const uint32_t domain = p.order == Order::kTopKFirst ? keep : 0u;
      const Threshold t = top_p_threshold(x, p, vmax, temperature, top_p, domain, s);
      if (t.found) {
        // top_k_first: the search's domain is the top-k set, so its kept weight is the row's; a
        // joint search over the whole row gives it only when no top-k threshold applies.
        weight_known = p.order == Order::kTopKFirst || !use_top_k;
        kept_weight = t.kept_weight;
        keep = max(keep, t.key);
      }
    }
    if (min_p > 0.0f && vmax > 0.0f) {
      keep = max(keep, key_at(min_p * vmax));
      weight_known = false;
    }

    if (p.output == Output::kSample) {
      if (!weight_known) {  // the kept weight, in a vectorised pass (the draw's own would be scalar)
        uint64_t local = 0;
        for_each_value(x, p.vocab, p.vec16, [&](int64_t, float v) {
          if (key_of(v, p.logits) >= keep) local += weight_of(v, vmax, p.logits, temperature);
        });
        kept_weight = block_sum_u64(local, s);
        weight_known = true;
      }
      const uint64_t u = row_uniforms(p.rng, r, 0).a;
      const int64_t token = block_draw(
          p.vocab,
          [&](int64_t i) {
            const float v = load(x, i);
            return key_of(v, p.logits) >= keep ? weight_of(v, vmax, p.logits, temperature) : uint64_t(0);
          },
          kept_weight, weight_known, u, s);
      if (threadIdx.x == 0) write_sample(p, r, token);
    } else if (p.output == Output::kProbs) {
      float local = 0.0f;
      for_each_value(x, p.vocab, p.vec16, [&](int64_t, float v) {
        if (key_of(v, false) >= keep && valid_value(v, false)) local += v;
      });
      const float sum = block_sum_f32(local, s);
      float* out = static_cast<float*>(p.out) + r * p.out_stride;
      for_each_value(x, p.vocab, p.vec16, [&](int64_t i, float v) {
        out[i] = (valid_value(v, false) && key_of(v, false) >= keep && sum > 0.0f) ? v / sum : 0.0f;
      });
    } else {  // kMaskedLogits
      T* out = static_cast<T*>(p.out) + r * p.out_stride;
      // to_float then from_float is exact for every element type: the kept logits are copied.
      for_each_value(x, p.vocab, p.vec16, [&](int64_t i, float v) {
        out[i] = Convert<T>::from_float(key_of(v, true) >= keep ? v : -INFINITY);
      });
    }
  }
}

__global__ void __launch_bounds__(kThreads) speculative_kernel(const SpecParams p) {
  __shared__ Shared s;
  __shared__ int64_t emitted_s;
  const int64_t b = blockIdx.x;
  if (b >= p.batch) return;
  int32_t* out = p.out_ids + b * (p.n + 1);
  if (threadIdx.x == 0) {
    int64_t emitted = p.n, accepted = 0;
    bool bad = false;
    for (int64_t j = 0; j < p.n; ++j) {
      const int64_t d = draft_id(p, b, j);
      if (d < 0 || d >= p.vocab) {
        record_error(p.errors, ErrorCode::kDraftTokenId, b * p.n + j, d, p.vocab);
        bad = true;
        break;
      }
      const float q = p.target_probs[b * p.target_stride_b + j * p.target_stride_n + d];
      const float dp = p.draft_probs[b * p.draft_stride_b + j * p.draft_stride_n + d];
      const bool ok = accept_draft(row_uniforms(p.rng, b, uint32_t(j)).a, dp, q);
      accepted += ok;
      if (!ok && emitted == p.n) emitted = j;
    }
    if (bad) {
      for (int64_t j = 0; j <= p.n; ++j) out[j] = -1;
      emitted = -1;
    } else {
      for (int64_t j = 0; j < emitted; ++j) out[j] = int32_t(draft_id(p, b, j));
      p.accepted[b] += int32_t(accepted);
      p.emitted[b] += int32_t(emitted);
    }
    emitted_s = emitted;
  }
  __syncthreads();
  const int64_t e = emitted_s;
  if (e < 0) return;
  const float* q = p.target_probs + b * p.target_stride_b + e * p.target_stride_n;
  const float* dp = e < p.n ? p.draft_probs + b * p.draft_stride_b + e * p.draft_stride_n : nullptr;
  const uint64_t u = row_uniforms(p.rng, b, uint32_t(e)).b;
  int64_t token = -1;
  if (dp != nullptr) {  // rejected at e: draw from max(q - p, 0)
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) m = fmaxf(m, residual(q[i], dp[i]));
    m = block_max(m, s);
    token = block_draw(
        p.vocab, [&](int64_t i) { return m > 0.0f ? fix(residual(q[i], dp[i]) / m) : uint64_t(0); }, 0, false, u, s);
  }
  if (token < 0) {  // all accepted (the bonus token), or no residual mass: draw from q
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
      if (valid_value(q[i], false)) m = fmaxf(m, q[i]);
    }
    m = block_max(m, s);
    token = block_draw(p.vocab, [&](int64_t i) { return weight_of(q[i], m, false, 1.0f); }, 0, false, u, s);
  }
  if (threadIdx.x == 0) {
    out[e] = int32_t(token);
    for (int64_t j = e + 1; j <= p.n; ++j) out[j] = -1;
  }
}

inline unsigned grid_for(int64_t rows) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(sm_count()) * 16)));
}

template <typename T>
Status launch_rows(const RowParams& p, LaunchContext ctx) {
  if (p.rows == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  RowParams q = p;
  q.errors = ctx.errors;
  q.vec16 = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && (p.in_stride * int64_t(sizeof(T))) % 16 == 0;
  if (launch_softmax_clusters<T>(q, static_cast<cudaStream_t>(ctx.stream))) {
    return cuda_status(cudaGetLastError(), "softmax kernel launch");
  }
  row_kernel<T><<<grid_for(p.rows), kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(q);
  return cuda_status(cudaGetLastError(), "sampling kernel launch");
}

inline Status launch_speculative(const SpecParams& p, LaunchContext ctx) {
  if (p.batch == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  SpecParams q = p;
  q.errors = ctx.errors;
  speculative_kernel<<<unsigned(p.batch), kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(q);
  return cuda_status(cudaGetLastError(), "chain_speculative_sampling kernel launch");
}

}  // namespace kiln::sampling
