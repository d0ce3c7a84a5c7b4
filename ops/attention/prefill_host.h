// Prefill attention on the CPU: the host backend of //ops/attention:prefill (attention.h has the
// contract), with the variants of the CUDA kernel: a custom mask, RoPE applied to q and k (rounded
// to the dtype after rotation, as the kernel stores them), ALiBi. Float32 arithmetic on the
// helpers of attention_host.h; one thread. Every page a call reads and every request's custom-mask
// byte range is checked first: a bad one returns Status::IndexError before anything is read
// through it or written.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/attention/attention.h"
#include "ops/attention/attention_host.h"
#include "ops/attention/state.h"
#include "ops/common/dtypes.h"

namespace kiln::attention::host {

// Request b's custom-mask bytes hold its qo_len x kv_len bits and lie in the mask.
inline Status check_mask(const PrefillParams& p, int64_t request, int64_t qo_len, int64_t kv_len) {
  const int64_t begin = p.mask_indptr[request], end = p.mask_indptr[request + 1];
  if (begin < 0 || end < begin || end > p.mask_bytes || (end - begin) * 8 < qo_len * kv_len) {
    return Status::IndexError("the custom mask of request " + std::to_string(request) + " is bytes [" +
                              std::to_string(begin) + ", " + std::to_string(end) + ") (mask_indptr) of " +
                              std::to_string(p.mask_bytes) + "; it needs " + std::to_string(qo_len * kv_len) +
                              " bits (qo_len * kv_len) inside the mask");
  }
  return Status::Ok();
}

// Row x (HEAD_DIM values of T) at position pos, RoPE-rotated and rounded to T, into out (float).
template <typename T, int HEAD_DIM>
void rope_row(const PrefillParams& p, const void* base, int64_t offset, int64_t pos, float* out) {
  constexpr int kHalf = HEAD_DIM / 2;
  for (int d = 0; d < kHalf; ++d) {
    const float angle = static_cast<float>(pos) * rope_frequency(p, d, HEAD_DIM);
    const float c = std::cos(angle), s = std::sin(angle);
    const float x = at<T>(base, offset + d), y = at<T>(base, offset + d + kHalf);
    out[d] = Convert<T>::to_float(Convert<T>::from_float(x * c - y * s));
    out[d + kHalf] = Convert<T>::to_float(Convert<T>::from_float(y * c + x * s));
  }
}

// Per work item, query and query head: softmax over the keys it sees.
template <typename T, int HEAD_DIM, bool SOFTCAP, bool CUSTOM_MASK, PrefillPosEncoding POS>
Status prefill(const PrefillParams& p) {
  constexpr bool kRope = POS == PrefillPosEncoding::kRopeLlama, kAlibi = POS == PrefillPosEncoding::kAlibi;
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "prefill: num_qo_heads must be a multiple of num_kv_heads");
  }
  if (CUSTOM_MASK && p.mask_indptr == nullptr) {  // (an empty mask may have no data pointer)
    return Status::Error(1, "prefill: this module applies a custom mask; mask_indptr is required");
  }
  const PagedKV& kv = p.kv;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  for (int64_t w = 0; w < p.work_capacity; ++w) {
    const int64_t request = p.work_request[w];
    if (request < 0) continue;
    if (Status st = check_pages(kv, request, 0, p.kv_len[request]); !st.ok()) return st;
    if constexpr (CUSTOM_MASK) {
      const int64_t qo_len = p.qo_indptr[request + 1] - p.qo_indptr[request];
      if (Status st = check_mask(p, request, qo_len, p.kv_len[request]); !st.ok()) return st;
    }
  }
  std::vector<float> logits, keys;  // keys: the request's rotated K (RoPE only)
  float q[HEAD_DIM];
  for (int64_t w = 0; w < p.work_capacity; ++w) {
    const int64_t request = p.work_request[w];
    if (request < 0) continue;
    const int64_t q_begin = p.qo_indptr[request], qo_len = p.qo_indptr[request + 1] - q_begin;
    const int64_t kv_len = p.kv_len[request], offset = kv_len - qo_len;
    const int32_t* pages = kv.page_indices + kv.page_indptr[request];
    auto key_offset = [&](int64_t j, int64_t kvh) {
      return pages[j / kv.page_size] * kv.k_page_stride + (j % kv.page_size) * kv.k_slot_stride +
             kvh * kv.k_head_stride;
    };
    if constexpr (kRope) {
      keys.resize(static_cast<size_t>(kv_len * p.num_kv_heads * HEAD_DIM));
      for (int64_t j = 0; j < kv_len; ++j)
        for (int64_t kvh = 0; kvh < p.num_kv_heads; ++kvh)
          rope_row<T, HEAD_DIM>(p, kv.k, key_offset(j, kvh), j, &keys[(j * p.num_kv_heads + kvh) * HEAD_DIM]);
    }
    const int64_t q_end = std::min<int64_t>(p.work_q_start[w] + kPrefillQueriesPerItem, qo_len);
    for (int64_t qi = p.work_q_start[w]; qi < q_end; ++qi) {
      const int64_t pos = qi + offset;
      const int64_t lo = p.window_left >= 0 ? std::max<int64_t>(0, pos - p.window_left) : 0;
      const int64_t hi = p.causal ? std::min(kv_len, pos + 1) : kv_len;
      for (int64_t h = 0; h < p.num_qo_heads; ++h) {
        const int64_t kvh = h / group;
        const int64_t qoff = (q_begin + qi) * p.q_stride_n + h * p.q_stride_h;
        if constexpr (kRope) {
          rope_row<T, HEAD_DIM>(p, p.q, qoff, pos, q);
        } else {
          for (int k = 0; k < HEAD_DIM; ++k) q[k] = at<T>(p.q, qoff + k);
        }
        const float slope = kAlibi ? alibi_slope(h, p.num_qo_heads) : 0.0f;
        logits.assign(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)), neg_inf());
        float mx = neg_inf();
        for (int64_t j = lo; j < hi; ++j) {
          if constexpr (CUSTOM_MASK) {
            const int64_t bit = p.mask_indptr[request] * 8 + qi * kv_len + j;
            if (((p.custom_mask[bit >> 3] >> (bit & 7)) & 1) == 0) continue;  // stays -inf
          }
          float dot = 0.0f;
          if constexpr (kRope) {
            const float* key = &keys[(j * p.num_kv_heads + kvh) * HEAD_DIM];
            for (int k = 0; k < HEAD_DIM; ++k) dot += q[k] * key[k];
          } else {
            const int64_t koff = key_offset(j, kvh);
            for (int k = 0; k < HEAD_DIM; ++k) dot += q[k] * at<T>(kv.k, koff + k);
          }
          float logit = dot * p.sm_scale;
          if constexpr (kAlibi) logit += slope * static_cast<float>(j - qi);
          if constexpr (SOFTCAP) logit = p.soft_cap * std::tanh(logit / p.soft_cap);
          logits[j - lo] = logit * kLog2e;
          mx = std::max(mx, logits[j - lo]);
        }
        float sum = 0.0f, o[HEAD_DIM] = {};
        for (int64_t j = lo; j < hi; ++j) {
          if (CUSTOM_MASK && logits[j - lo] == neg_inf()) continue;  // a masked key: no value read
          const float wgt = scale_from(logits[j - lo], mx);
          sum += wgt;
          const int64_t voff = pages[j / kv.page_size] * kv.v_page_stride + (j % kv.page_size) * kv.v_slot_stride +
                               kvh * kv.v_head_stride;
          for (int k = 0; k < HEAD_DIM; ++k) o[k] += wgt * at<T>(kv.v, voff + k);
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        T* out = static_cast<T*>(p.out) + (q_begin + qi) * p.out_stride_n + h * p.out_stride_h;
        for (int k = 0; k < HEAD_DIM; ++k) out[k] = Convert<T>::from_float(o[k] * inv);
        if (p.lse) p.lse[(q_begin + qi) * p.lse_stride_n + h] = merged_lse(mx, sum);
      }
    }
  }
  return Status::Ok();
}

}  // namespace kiln::attention::host
