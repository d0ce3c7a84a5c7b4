// //ops:moe, host backend: the entry points of moe.h for this module's dtype, on the calling
// thread. The same float32 arithmetic and selection order (moe.h's beats()) as the CUDA kernels;
// ids outside [-1, E) and src_idx entries outside [-1, n) are an IndexError before anything is
// written. Copied into the specialisation's generated directory, next to its spec_config.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/moe/moe.h"
#include "spec_config.h"

namespace kiln::moe {

namespace {

using T = spec::dtype;
using C = Convert<T>;

// The index among `keys` (skipping `excluded`) that wins under beats().
int64_t best_of(const std::vector<float>& keys, const std::vector<char>& excluded) {
  float best = 0.f;
  int64_t id = -1;
  for (int64_t e = 0; e < int64_t(keys.size()); ++e) {
    if (!excluded[e] && beats(keys[e], e, best, id)) best = keys[e], id = e;
  }
  return id;
}

}  // namespace

Status topk(const TopkParams& p, LaunchContext) {
  const int64_t E = p.experts;
  std::vector<float> score(E), key(E);
  std::vector<char> excluded(E);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const T* x = static_cast<const T*>(p.logits) + t * p.logit_stride;
    if (p.scoring == Scoring::kSoftmax) {
      float m = -INFINITY, s = 0.f;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, C::to_float(x[e]));
      for (int64_t e = 0; e < E; ++e) s += score[e] = expf(C::to_float(x[e]) - m);
      const float inv = 1.0f / s;
      for (int64_t e = 0; e < E; ++e) score[e] *= inv;
    } else {
      for (int64_t e = 0; e < E; ++e) score[e] = sigmoid(C::to_float(x[e]));
    }
    for (int64_t e = 0; e < E; ++e) key[e] = score[e] + (p.bias != nullptr ? p.bias[e] : 0.f);
    std::fill(excluded.begin(), excluded.end(), 0);
    if (p.num_groups > 0) {
      const int64_t G = p.num_groups, gsize = E / G;
      std::vector<float> gkey(G);
      std::vector<char> gtaken(G, 0), none(G, 0);
      for (int64_t g = 0; g < G; ++g) {
        float b1 = 0.f, b2 = 0.f;
        int64_t i1 = -1, i2 = -1;
        for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
          if (beats(key[e], e, b1, i1)) {
            b2 = b1, i2 = i1, b1 = key[e], i1 = e;
          } else if (beats(key[e], e, b2, i2)) {
            b2 = key[e], i2 = e;
          }
        }
        gkey[g] = b1 + b2;
      }
      for (int r = 0; r < p.topk_group; ++r) gtaken[best_of(gkey, gtaken)] = 1;
      for (int64_t e = 0; e < E; ++e) excluded[e] = !gtaken[e / gsize];
    }
    float sum = 0.f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t e = best_of(key, excluded);
      excluded[e] = 1;
      p.ids[t * p.top_k + j] = static_cast<int32_t>(e);
      p.weights[t * p.top_k + j] = score[e];
      sum += score[e];
    }
    const float factor = (p.renormalize ? 1.0f / sum : 1.0f) * p.scale;
    for (int j = 0; j < p.top_k; ++j) p.weights[t * p.top_k + j] *= factor;
  }
  return Status::Ok();
}

Status sort(const SortParams& p, LaunchContext) {
  const int64_t E = p.experts, bs = p.block_size;
  // The local expert of each id (expert parallelism: ids of other ranks' experts give no row).
  std::vector<int32_t> local(p.n);
  for (int64_t i = 0; i < p.n; ++i) {
    const int32_t e = p.ids[i];
    if (e < -1 || e >= p.total_experts) {
      return Status::IndexError(index_error(ErrorCode::kExpertId, i, e, p.total_experts));
    }
    const int64_t l = int64_t(e) - p.first_expert;
    local[i] = e >= 0 && l >= 0 && l < E ? static_cast<int32_t>(l) : -1;
  }
  std::vector<int64_t> count(E, 0), start(E), pstart(E);
  for (int64_t i = 0; i < p.n; ++i) {
    if (local[i] >= 0) ++count[local[i]];
  }
  int64_t row = 0, slot = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[e] = row, pstart[e] = slot;
    row += count[e];
    if (bs > 0) slot += (count[e] + bs - 1) / bs * bs;
    if (p.offs != nullptr) p.offs[e] = static_cast<int32_t>(row);
  }
  if (p.num_post_pad != nullptr) p.num_post_pad[0] = static_cast<int32_t>(slot);
  if (bs > 0 && p.sorted_ids != nullptr) {
    const int64_t len = p.n + E * (bs - 1), blocks = (len + bs - 1) / bs;
    std::fill(p.sorted_ids, p.sorted_ids + len, static_cast<int32_t>(p.n));
    if (p.expert_ids != nullptr) {
      std::fill(p.expert_ids, p.expert_ids + blocks, -1);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t padded = (count[e] + bs - 1) / bs * bs;
        for (int64_t b = pstart[e] / bs; b < (pstart[e] + padded) / bs; ++b) p.expert_ids[b] = static_cast<int32_t>(e);
      }
    }
  }
  if (p.src_idx != nullptr) std::fill(p.src_idx + row, p.src_idx + p.n, -1);
  std::vector<int64_t> within(E, 0);
  for (int64_t i = 0; i < p.n; ++i) {
    const int32_t e = local[i];
    if (e < 0) continue;
    const int64_t w = within[e]++;
    if (p.src_idx != nullptr) p.src_idx[start[e] + w] = static_cast<int32_t>(i);
    if (bs > 0 && p.sorted_ids != nullptr) p.sorted_ids[pstart[e] + w] = static_cast<int32_t>(i);
  }
  return Status::Ok();
}

Status gather(const GatherParams& p, LaunchContext) {
  const int64_t bound = p.tokens * p.top_k;
  for (int64_t r = 0; r < p.n; ++r) {
    const int32_t s = p.src_idx[r];
    if (s < -1 || s >= bound) return Status::IndexError(index_error(ErrorCode::kSourceIndex, r, s, bound));
  }
  for (int64_t r = 0; r < p.n; ++r) {
    const int32_t s = p.src_idx[r];
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    if (s < 0) {
      std::fill(out, out + p.hidden_size, C::from_float(0.f));
    } else {
      const T* in = static_cast<const T*>(p.hidden) + (s / p.top_k) * p.in_stride;
      std::copy(in, in + p.hidden_size, out);
    }
  }
  return Status::Ok();
}

Status unpermute(const UnpermuteParams& p, LaunchContext) {
  for (int64_t r = 0; r < p.n; ++r) {
    const int32_t s = p.src_idx[r];
    if (s < -1 || s >= p.n) return Status::IndexError(index_error(ErrorCode::kSourceIndex, r, s, p.n));
  }
  std::fill(p.inv, p.inv + p.n, -1);
  for (int64_t r = 0; r < p.n; ++r) {
    if (p.src_idx[r] >= 0) p.inv[p.src_idx[r]] = static_cast<int32_t>(r);
  }
  std::vector<float> acc(p.hidden_size);
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int32_t r = p.inv[t * p.top_k + k];
      if (r < 0) continue;
      const float w = p.weights[t * p.weight_stride + k];
      const T* row = static_cast<const T*>(p.rows) + r * p.rows_stride;
      for (int64_t h = 0; h < p.hidden_size; ++h) acc[h] += w * C::to_float(row[h]);
    }
    T* out = static_cast<T*>(p.out) + t * p.out_stride;
    for (int64_t h = 0; h < p.hidden_size; ++h) out[h] = C::from_float(acc[h]);
  }
  return Status::Ok();
}

namespace {

// Weight element k of row `row` of expert e, dequantised (fp8 times its scale) or converted.
float weight(const ExpertsParams& p, int64_t e, int64_t row, int64_t k) {
  const int64_t at = e * p.w_expert_stride + row * p.w_row_stride + k;
  if (!p.w_fp8) return C::to_float(static_cast<const T*>(p.w)[at]);
  const float v = Convert<e4m3_t>::to_float(static_cast<const e4m3_t*>(p.w)[at]);
  if (p.scale_mode == 1) return v * p.w_scale[e];
  return v * p.w_scale[(e * p.scale_rows + row / kScaleBlock) * p.scale_cols + k / kScaleBlock];
}

}  // namespace

Status experts(const ExpertsParams& p, LaunchContext) {
  for (int64_t e = 0, prev = 0; e < p.experts; ++e) {
    const int64_t end = p.offs[e];
    if (end > p.rows) return Status::IndexError(index_error(ErrorCode::kSegmentEnd, e, end, p.rows));
    if (prev > end) return Status::IndexError(index_error(ErrorCode::kSegmentStart, e, prev, end));
    prev = end;
  }
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  for (int64_t e = 0; e < p.experts; ++e) {
    float q[kExpertActParams] = {};
    const T* bias = nullptr;
    if (p.generic) {
      act_params_of(p.epi, e, q);
      if (p.epi.bias != nullptr) bias = static_cast<const T*>(p.epi.bias) + e * p.epi.bias_stride;
    }
    for (int64_t r = e > 0 ? p.offs[e - 1] : 0; r < p.offs[e]; ++r) {
      const T* xr = x + r * p.x_stride;
      for (int64_t c = 0; c < p.cols; ++c) {
        float g = 0.f, u = 0.f;
        for (int64_t k = 0; k < p.depth; ++k) {
          const float xv = C::to_float(xr[k]);
          g += weight(p, e, p.gate_row0 + c, k) * xv;
          if (p.gated) u += weight(p, e, p.up_row0 + c, k) * xv;
        }
        float v = g;
        if (p.generic) {
          if (bias != nullptr) {
            g += C::to_float(bias[p.gate_row0 + c]);
            if (p.gated) u += C::to_float(bias[p.up_row0 + c]);
          }
          v = apply_expert_act(p.epi.act, g, p.gated ? u : 0.f, q[0], q[1], q[2]);
        } else if (p.gated) {
          v = (p.act == activation::Act::kGeluTanh ? activation::apply<activation::Act::kGeluTanh>(g)
                                                   : activation::apply<activation::Act::kSilu>(g)) *
              u;
        }
        out[r * p.out_stride + c] = C::from_float(v);
      }
    }
  }
  return Status::Ok();
}

Status dequant(const DequantParams& p, LaunchContext) {
  const auto* w = static_cast<const e4m3_t*>(p.w);
  T* out = static_cast<T*>(p.out);
  for (int64_t e = 0; e < p.experts; ++e) {
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t c = 0; c < p.cols; ++c) {
        const float s = p.scale_mode == 1
                            ? p.scale[e]
                            : p.scale[(e * p.scale_rows + r / kScaleBlock) * p.scale_cols + c / kScaleBlock];
        const int64_t at = (e * p.rows + r) * p.cols + c;
        out[at] = C::from_float(s * Convert<e4m3_t>::to_float(w[at]));
      }
    }
  }
  return Status::Ok();
}

Status expert_act(const ExpertActParams& p, LaunchContext) {
  for (int64_t e = 0, prev = 0; e < p.experts; ++e) {
    const int64_t end = p.offs[e];
    if (end > p.rows) return Status::IndexError(index_error(ErrorCode::kSegmentEnd, e, end, p.rows));
    if (prev > end) return Status::IndexError(index_error(ErrorCode::kSegmentStart, e, prev, end));
    prev = end;
  }
  const bool gated = is_gated(p.act);
  std::vector<float> g(p.cols), u(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t e = expert_of_row(p.offs, p.experts, r);
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    if (e >= p.experts) {
      std::fill(out, out + p.cols, C::from_float(0.f));
      continue;
    }
    float q[kExpertActParams];
    act_params_of(p, e, q);
    const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
    const T* bias = p.bias != nullptr ? static_cast<const T*>(p.bias) + e * p.bias_stride : nullptr;
    for (int64_t c = 0; c < p.cols; ++c) {
      g[c] = C::to_float(in[p.gate_col0 + c]) + (bias != nullptr ? C::to_float(bias[p.gate_col0 + c]) : 0.f);
      if (gated) u[c] = C::to_float(in[p.up_col0 + c]) + (bias != nullptr ? C::to_float(bias[p.up_col0 + c]) : 0.f);
    }
    for (int64_t c = 0; c < p.cols; ++c) {
      out[c] = C::from_float(apply_expert_act(p.act, g[c], gated ? u[c] : 0.f, q[0], q[1], q[2]));
    }
  }
  return Status::Ok();
}

}  // namespace kiln::moe
