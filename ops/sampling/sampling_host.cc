// //ops:sampling, host backend: the entry points of sampling.h for this module's dtype. The same
// algorithm as the CUDA kernels, step for step, on the calling thread: the same radix levels and
// histograms (so the same thresholds), the same integer weights, the same Philox draws, so a
// seed gives the CUDA backend's tokens (the weights of logits use portable_exp, identical on both;
// softmax and the renormalised probabilities are sums in another order: here in double, in the
// kernels a float32 tree, so the two agree to ~1e-6 relative, the tree's rounding).
// Indices are checked before anything is written. Copied into the specialisation's generated
// directory, next to its spec_config.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/sampling/sampling.h"
#include "spec_config.h"

namespace kiln::sampling {

namespace {

using T = spec::dtype;
using C = Convert<T>;

struct Selection {
  uint32_t digit = 0, count = 0;
  uint64_t above_count = 0, above_weight = 0, weight = 0, want = 0;
};

struct Row {
  const T* x;
  int64_t vocab;
  bool logits;
  float vmax, temperature;

  float value(int64_t i) const { return C::to_float(x[i]); }
  uint32_t key(int64_t i) const { return key_of(value(i), logits); }
  uint64_t weight(int64_t i) const { return weight_of(value(i), vmax, logits, temperature); }
};

// radix_level of sampling.cuh: the histograms of one digit and the bin where the running count
// (or weight) first reaches `want`, in descending order.
template <typename InDomain>
Selection radix_level(const Row& row, int level, uint32_t prefix, uint64_t want, bool by_weight, float top_p,
                      InDomain in_domain, std::vector<uint64_t>& count, std::vector<uint64_t>& weight) {
  const int hi = digit_top(level);
  const int shift = hi - digit_bits(level);
  const int mask = (1 << digit_bits(level)) - 1;
  std::fill(count.begin(), count.end(), 0);
  std::fill(weight.begin(), weight.end(), 0);
  for (int64_t i = 0; i < row.vocab; ++i) {
    const uint32_t key = row.key(i);
    if (level > 0 && (key >> hi) != (prefix >> hi)) continue;
    if (!in_domain(key)) continue;
    const uint32_t d = (key >> shift) & uint32_t(mask);
    count[d] += 1;
    if (by_weight) weight[d] += row.weight(i);
  }
  uint64_t c_total = 0, w_total = 0;
  for (int b = 0; b <= mask; ++b) {
    c_total += count[b];
    w_total += weight[b];
  }
  if (by_weight && level == 0) want = w_total > 0 ? top_p_target(top_p, w_total) : 0;
  Selection s;
  s.want = want;
  s.above_count = c_total;
  s.above_weight = w_total;
  uint64_t c_run = 0, w_run = 0;
  for (int bin = mask; bin >= 0; --bin) {
    const uint64_t run = by_weight ? w_run : c_run;
    const uint64_t here = by_weight ? weight[bin] : count[bin];
    if (want > 0 && run < want && want <= run + here) {
      s.digit = uint32_t(bin);
      s.count = uint32_t(count[bin]);
      s.above_count = c_run;
      s.above_weight = w_run;
      s.weight = weight[bin];
      break;
    }
    c_run += count[bin];
    w_run += weight[bin];
  }
  return s;
}

struct Threshold {
  uint32_t key = 0;
  uint64_t kept_weight = 0;
  uint64_t kept_count = 0;
  bool found = false;
};

Threshold top_k_threshold(const Row& row, int64_t k, std::vector<uint64_t>& count, std::vector<uint64_t>& weight) {
  Threshold t;
  uint32_t prefix = 0;
  uint64_t rank = uint64_t(k);
  for (int level = 0; level < kLevels; ++level) {
    const Selection s =
        radix_level(row, level, prefix, rank, false, 1.0f, [](uint32_t) { return true; }, count, weight);
    prefix |= s.digit << (digit_top(level) - digit_bits(level));
    rank -= s.above_count;
    if (s.count == rank || level == kLevels - 1) {
      t.key = prefix;
      t.kept_count = uint64_t(k) - rank + s.count;
      t.found = true;
      break;
    }
  }
  return t;
}

Threshold top_p_threshold(const Row& row, float top_p, uint32_t domain_key, std::vector<uint64_t>& count,
                          std::vector<uint64_t>& weight) {
  Threshold t;
  uint32_t prefix = 0;
  uint64_t want = 0, above_weight = 0;
  for (int level = 0; level < kLevels; ++level) {
    const Selection s = radix_level(
        row, level, prefix, want, true, top_p, [domain_key](uint32_t key) { return key >= domain_key; }, count, weight);
    if (s.want == 0) return t;
    prefix |= s.digit << (digit_top(level) - digit_bits(level));
    want = s.want - s.above_weight;
    above_weight += s.above_weight;
    if (s.count == 1 || level == kLevels - 1) {
      t.key = prefix;
      t.kept_weight = above_weight + s.weight;
      t.found = true;
      break;
    }
  }
  return t;
}

// candidate_top_p_draw of sampling.cuh: top-p and the draw over the top-k set (key >= keep).
int64_t candidate_top_p_draw(const Row& row, uint32_t keep, float top_p, uint64_t u) {
  struct Candidate {
    int64_t index;
    uint32_t key;
    uint64_t weight;
  };
  std::vector<Candidate> cand;
  for (int64_t i = 0; i < row.vocab; ++i) {
    if (row.key(i) >= keep) cand.push_back({i, row.key(i), row.weight(i)});
  }
  uint64_t domain = 0;
  for (const Candidate& c : cand) domain += c.weight;
  if (domain == 0) return -1;
  const uint64_t want = top_p_target(top_p, domain);
  uint32_t crossing = 0xffffffffu;
  for (const Candidate& c : cand) {
    uint64_t above = 0;
    for (const Candidate& d : cand) above += d.key > c.key ? d.weight : 0;
    if (above < want) crossing = std::min(crossing, c.key);
  }
  uint64_t kept_weight = 0;
  for (const Candidate& c : cand) kept_weight += c.key >= crossing ? c.weight : 0;
  const uint64_t target = scale_u64(u, kept_weight);
  uint64_t cum = 0;
  for (const Candidate& c : cand) {  // in vocabulary order
    if (c.key < crossing) continue;
    cum += c.weight;
    if (cum > target) return c.index;
  }
  return -1;
}

// block_draw of sampling.cuh.
template <typename W>
int64_t draw(int64_t n, W weight, uint64_t total, bool total_known, uint64_t u) {
  if (!total_known) {
    total = 0;
    for (int64_t i = 0; i < n; ++i) total += weight(i);
  }
  if (total == 0) return -1;
  const uint64_t target = scale_u64(u, total);
  uint64_t cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += weight(i);
    if (cum > target) return i;
  }
  return -1;
}

void write_sample(const RowParams& p, int64_t r, int64_t token) {
  if (p.samples64) {
    static_cast<int64_t*>(p.samples)[r] = token;
  } else {
    static_cast<int32_t*>(p.samples)[r] = int32_t(token);
  }
}

}  // namespace

Status sample_rows(const RowParams& p, LaunchContext) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t src = row_index(p, r);
    if (src < 0 || src >= p.rows_in) {
      return Status::IndexError(index_error(ErrorCode::kSamplingIndex, r, src, p.rows_in));
    }
  }
  std::vector<uint64_t> count(kBins), weight(kBins);
  for (int64_t r = 0; r < p.rows; ++r) {
    Row row{static_cast<const T*>(p.input) + row_index(p, r) * p.in_stride, p.vocab, p.logits, -INFINITY,
            p.logits ? row_temperature(p, r) : 1.0f};
    for (int64_t i = 0; i < p.vocab; ++i) {
      const float v = row.value(i);
      if (valid_value(v, p.logits)) row.vmax = std::fmax(row.vmax, v);
    }
    if (p.output == Output::kSoftmax) {
      float* out = static_cast<float*>(p.out) + r * p.out_stride;
      double z = 0.0;  // (a float sum of 128256 terms in order drifts ~1e-4 from the kernels' tree)
      for (int64_t i = 0; i < p.vocab; ++i) z += softmax_numerator(row.value(i), row.vmax, row.temperature);
      for (int64_t i = 0; i < p.vocab; ++i) {
        out[i] = z > 0.0 ? static_cast<float>(softmax_numerator(row.value(i), row.vmax, row.temperature) / z) : 0.0f;
      }
      continue;
    }
    const int64_t k = row_top_k(p, r);
    const float top_p = row_top_p(p, r);
    const float min_p = row_min_p(p, r);
    uint32_t keep = 0;
    uint64_t kept_weight = 0;
    bool weight_known = false;
    uint64_t kept_count = 0;
    if (k > 0 && k < p.vocab) {
      const Threshold t = top_k_threshold(row, k, count, weight);
      keep = t.key;
      kept_count = t.kept_count;
    }
    if (p.output == Output::kSample && k > 0 && k < p.vocab && top_p < 1.0f && p.order == Order::kTopKFirst &&
        !(min_p > 0.0f) && kept_count <= uint64_t(kCandidates)) {
      write_sample(p, r, candidate_top_p_draw(row, keep, top_p, row_uniforms(p.rng, r, 0).a));
      continue;
    }
    if (top_p < 1.0f) {
      const uint32_t domain = p.order == Order::kTopKFirst ? keep : 0u;
      const Threshold t = top_p_threshold(row, top_p, domain, count, weight);
      if (t.found) {
        weight_known = p.order == Order::kTopKFirst || !(k > 0 && k < p.vocab);
        kept_weight = t.kept_weight;
        keep = std::max(keep, t.key);
      }
    }
    if (min_p > 0.0f && row.vmax > 0.0f) {
      keep = std::max(keep, key_at(min_p * row.vmax));
      weight_known = false;
    }
    if (p.output == Output::kSample) {
      const uint64_t u = row_uniforms(p.rng, r, 0).a;
      const int64_t token = draw(
          p.vocab, [&](int64_t i) { return row.key(i) >= keep ? row.weight(i) : uint64_t(0); }, kept_weight,
          weight_known, u);
      write_sample(p, r, token);
    } else if (p.output == Output::kProbs) {
      double sum = 0.0;  // in double, as the softmax's
      for (int64_t i = 0; i < p.vocab; ++i) {
        const float v = row.value(i);
        if (key_of(v, false) >= keep && valid_value(v, false)) sum += v;
      }
      float* out = static_cast<float*>(p.out) + r * p.out_stride;
      for (int64_t i = 0; i < p.vocab; ++i) {
        const float v = row.value(i);
        out[i] = (valid_value(v, false) && key_of(v, false) >= keep && sum > 0.0) ? static_cast<float>(v / sum) : 0.0f;
      }
    } else {  // kMaskedLogits
      T* out = static_cast<T*>(p.out) + r * p.out_stride;
      for (int64_t i = 0; i < p.vocab; ++i) out[i] = row.key(i) >= keep ? row.x[i] : C::from_float(-INFINITY);
    }
  }
  return Status::Ok();
}

Status chain_speculative(const SpecParams& p, LaunchContext) {
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.n; ++j) {
      const int64_t d = draft_id(p, b, j);
      if (d < 0 || d >= p.vocab)
        return Status::IndexError(index_error(ErrorCode::kDraftTokenId, b * p.n + j, d, p.vocab));
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    int32_t* out = p.out_ids + b * (p.n + 1);
    int64_t emitted = p.n, accepted = 0;
    for (int64_t j = 0; j < p.n; ++j) {
      const int64_t d = draft_id(p, b, j);
      const float q = p.target_probs[b * p.target_stride_b + j * p.target_stride_n + d];
      const float dp = p.draft_probs[b * p.draft_stride_b + j * p.draft_stride_n + d];
      const bool ok = accept_draft(row_uniforms(p.rng, b, uint32_t(j)).a, dp, q);
      accepted += ok;
      if (!ok && emitted == p.n) emitted = j;
    }
    for (int64_t j = 0; j < emitted; ++j) out[j] = int32_t(draft_id(p, b, j));
    p.accepted[b] += int32_t(accepted);
    p.emitted[b] += int32_t(emitted);
    const int64_t e = emitted;
    const float* q = p.target_probs + b * p.target_stride_b + e * p.target_stride_n;
    const float* dp = e < p.n ? p.draft_probs + b * p.draft_stride_b + e * p.draft_stride_n : nullptr;
    const uint64_t u = row_uniforms(p.rng, b, uint32_t(e)).b;
    int64_t token = -1;
    if (dp != nullptr) {
      float m = -INFINITY;
      for (int64_t i = 0; i < p.vocab; ++i) m = std::fmax(m, residual(q[i], dp[i]));
      token = draw(
          p.vocab, [&](int64_t i) { return m > 0.0f ? fix(residual(q[i], dp[i]) / m) : uint64_t(0); }, 0, false, u);
    }
    if (token < 0) {
      float m = -INFINITY;
      for (int64_t i = 0; i < p.vocab; ++i) {
        if (valid_value(q[i], false)) m = std::fmax(m, q[i]);
      }
      token = draw(p.vocab, [&](int64_t i) { return weight_of(q[i], m, false, 1.0f); }, 0, false, u);
    }
    out[e] = int32_t(token);
    for (int64_t j = e + 1; j <= p.n; ++j) out[j] = -1;
  }
  return Status::Ok();
}

}  // namespace kiln::sampling
