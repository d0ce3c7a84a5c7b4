// Decode and prefill attention, merges, KV appends and append positions on the CPU: the host
// backend of the //ops/attention targets (see attention.h). Runs the same work list as the CUDA
// backend (direct items and float32 partials, then the merge), so split-KV plans are exercised
// wherever kiln runs. Float32 arithmetic; one thread. Every index a call reads is checked first,
// with the kernels' own functions (page_at, append_target, token_position): a bad one returns
// Status::IndexError before anything is read through it or written.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/attention/attention.h"
#include "ops/attention/state.h"
#include "ops/common/dtypes.h"

namespace kiln::attention::host {

template <typename T>
float at(const void* base, int64_t offset) {
  return Convert<T>::to_float(static_cast<const T*>(base)[offset]);
}

// An error record like the device's (ops/common/device_error.h), turned into a Status.
struct IndexCheck {
  int64_t record[4] = {};
  int64_t* errors() { return record; }
  bool failed() const { return record[0] != 0; }
  Status status() const {
    if (!failed()) return Status::Ok();
    return Status::IndexError(index_error(static_cast<ErrorCode>(record[0]), record[1], record[2], record[3]));
  }
};

// Every page holding tokens [begin, end) of `request` is an entry of page_indices and a page of
// the cache.
inline Status check_pages(const PagedKV& kv, int64_t request, int64_t begin, int64_t end) {
  IndexCheck check;
  const int64_t first = kv.page_indptr[request];
  for (int64_t page = begin / kv.page_size; page * kv.page_size < end; ++page) {
    if (page_at(kv, request, first, page, check.errors()) < 0) break;
  }
  return check.status();
}

// ROPE_LLAMA of one head's HEAD_DIM values at position `pos` (DecodeParams: dims i and i + D/2
// turn by pos x freq(i)), in float32 as the kernel does.
template <int HEAD_DIM>
void rope_llama(float* x, int64_t pos, const DecodeParams& p) {
  for (int i = 0; i < HEAD_DIM / 2; ++i) {
    const float angle =
        static_cast<float>(pos) * (p.rope_rcp_scale * std::exp2(static_cast<float>(i) * p.rope_freq_exp));
    const float c = std::cos(angle), s = std::sin(angle), lo = x[i], hi = x[i + HEAD_DIM / 2];
    x[i] = lo * c - hi * s;
    x[i + HEAD_DIM / 2] = hi * c + lo * s;
  }
}

// Attention of query j of `request` (q row request * q_len + j) in one query head over tokens
// [begin, end) of the request, of which it sees those up to its position L - q_len + j (and from
// that - window_left): o (the weighted sum divided by the sum) and lse, in base 2. KV: the
// cache's element type; its values are scaled by k_scale / v_scale (1 for a 16-bit cache). ROPE:
// q and each key rotated at their positions first.
template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP, bool ROPE>
void attend(const DecodeParams& p, int64_t request, int64_t j, int64_t head, int64_t begin, int64_t end, float* o,
            float* lse) {
  const PagedKV& kv = p.kv;
  const int64_t kv_head = head / (p.num_qo_heads / p.num_kv_heads);
  const int32_t* pages = kv.page_indices + kv.page_indptr[request];
  const int64_t pos = p.kv_len[request] - p.q_len + j;
  end = std::min(end, pos + 1);
  if (p.window_left >= 0) begin = std::max(begin, pos - p.window_left);
  float q[HEAD_DIM], key[HEAD_DIM];
  const int64_t q_row = request * p.q_len + j;
  for (int k = 0; k < HEAD_DIM; ++k) q[k] = at<T>(p.q, q_row * p.q_stride_b + head * p.q_stride_h + k);
  if constexpr (ROPE) rope_llama<HEAD_DIM>(q, pos, p);
  std::vector<float> logits(static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  float mx = neg_inf();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t page = pages[t / kv.page_size], slot = t % kv.page_size;
    const int64_t off = page * kv.k_page_stride + slot * kv.k_slot_stride + kv_head * kv.k_head_stride;
    for (int k = 0; k < HEAD_DIM; ++k) key[k] = at<KV>(kv.k, off + k);
    if constexpr (ROPE) rope_llama<HEAD_DIM>(key, t, p);
    float dot = 0.0f;
    for (int k = 0; k < HEAD_DIM; ++k) dot += q[k] * key[k];
    float logit = dot * p.k_scale * p.sm_scale;
    if constexpr (SOFTCAP) logit = p.soft_cap * std::tanh(logit / p.soft_cap);
    logits[t - begin] = logit * kLog2e;
    mx = std::max(mx, logits[t - begin]);
  }
  float sum = 0.0f;
  std::fill(o, o + HEAD_DIM, 0.0f);
  for (int64_t t = begin; t < end; ++t) {
    const float w = scale_from(logits[t - begin], mx);
    sum += w;
    const int64_t page = pages[t / kv.page_size], slot = t % kv.page_size;
    const int64_t off = page * kv.v_page_stride + slot * kv.v_slot_stride + kv_head * kv.v_head_stride;
    for (int k = 0; k < HEAD_DIM; ++k) o[k] += w * at<KV>(kv.v, off + k);
  }
  const float inv = sum > 0.0f ? p.v_scale / sum : 0.0f;
  for (int k = 0; k < HEAD_DIM; ++k) o[k] *= inv;
  *lse = merged_lse(mx, sum);
}

template <typename TIn, typename TOut, int HEAD_DIM>
void merge(const MergeParams& p) {
  for (int64_t item = 0; item < p.num_items; ++item) {
    const int64_t row = p.out_row ? p.out_row[item] : item;
    if (row < 0) continue;
    const int64_t first = p.indptr ? p.indptr[item] : 0;
    const int64_t count = p.indptr ? p.indptr[item + 1] - first : p.num_states;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* s = p.s + item * p.s_item_stride + h * p.s_head_stride;
      const int64_t v0 = item * p.v_item_stride + h * p.v_head_stride;
      float mx = neg_inf();
      for (int64_t j = 0; j < count; ++j) mx = std::max(mx, s[(first + j) * p.s_state_stride]);
      float sum = 0.0f, acc[HEAD_DIM] = {};
      for (int64_t j = 0; j < count; ++j) {
        const float w = scale_from(s[(first + j) * p.s_state_stride], mx);
        sum += w;
        for (int k = 0; k < HEAD_DIM; ++k) acc[k] += w * at<TIn>(p.v, v0 + (first + j) * p.v_state_stride + k);
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      TOut* out = static_cast<TOut*>(p.out) + row * p.out_row_stride + h * p.out_head_stride;
      for (int k = 0; k < HEAD_DIM; ++k) out[k] = Convert<TOut>::from_float(acc[k] * inv);
      if (p.out_lse) p.out_lse[row * p.lse_row_stride + h * p.lse_head_stride] = merged_lse(mx, sum);
    }
  }
}

template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP, bool ROPE>
Status decode(const DecodeParams& p) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "decode: num_qo_heads must be a multiple of num_kv_heads");
  }
  // An empty batch has no lengths to point at (a tensor of no elements may have no data).
  if (p.q_len < 1 || (p.kv_len == nullptr && p.work_capacity > 0)) {
    return Status::Error(1, "decode: q_len must be >= 1, with kv_len given");
  }
  for (int64_t w = 0; w < p.work_capacity; ++w) {
    if (p.work_request[w] < 0) continue;
    Status st = check_pages(p.kv, p.work_request[w], p.work_token_begin[w], p.work_token_end[w]);
    if (!st.ok()) return st;
  }
  float o[HEAD_DIM];
  for (int64_t w = 0; w < p.work_capacity; ++w) {
    const int64_t request = p.work_request[w];
    if (request < 0) continue;
    const int64_t out_index = p.work_out_index[w];
    for (int64_t j = 0; j < p.q_len; ++j) {
      for (int64_t h = 0; h < p.num_qo_heads; ++h) {
        float lse;
        attend<T, KV, HEAD_DIM, SOFTCAP, ROPE>(p, request, j, h, p.work_token_begin[w], p.work_token_end[w], o, &lse);
        if (out_index < 0) {
          const int64_t row = request * p.q_len + j;
          T* out = static_cast<T*>(p.out) + row * p.out_stride_b + h * p.out_stride_h;
          for (int k = 0; k < HEAD_DIM; ++k) out[k] = Convert<T>::from_float(o[k]);
          if (p.lse) p.lse[row * p.lse_stride_b + h] = lse;
        } else {
          const int64_t state = (out_index * p.q_len + j) * p.num_qo_heads + h;
          std::copy(o, o + HEAD_DIM, p.partial_out + state * HEAD_DIM);
          p.partial_lse[state] = lse;
        }
      }
    }
  }
  // The split-KV merge: per query j of the requests, their partial slots [slots, q_len, heads]
  // merged into out/lse rows request * q_len + j (CUDA merges inside the decode launch).
  for (int64_t j = 0; p.merge_capacity > 0 && j < p.q_len; ++j) {
    MergeParams m{};
    m.v = p.partial_out + j * p.num_qo_heads * HEAD_DIM;
    m.s = p.partial_lse + j * p.num_qo_heads;
    m.num_items = p.merge_capacity;
    m.num_heads = p.num_qo_heads;
    m.indptr = p.merge_indptr;
    m.out_row = p.merge_request;
    m.v_state_stride = p.q_len * p.num_qo_heads * HEAD_DIM;
    m.v_head_stride = HEAD_DIM;
    m.s_state_stride = p.q_len * p.num_qo_heads;
    m.s_head_stride = 1;
    m.out = static_cast<T*>(p.out) + j * p.out_stride_b;
    m.out_row_stride = p.q_len * p.out_stride_b;
    m.out_head_stride = p.out_stride_h;
    m.out_lse = p.lse ? p.lse + j * p.lse_stride_b : nullptr;
    m.lse_row_stride = p.q_len * p.lse_stride_b;
    m.lse_head_stride = 1;
    merge<float, T, HEAD_DIM>(m);
  }
  return Status::Ok();
}

template <typename T, int HEAD_DIM>
Status merge_two(const MergeTwoParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const bool use_b = p.mask == nullptr || p.mask[r * p.mask_stride] != 0;
    if (!use_b && p.out == p.a && p.out_lse == p.a_lse) continue;  // in place and masked: the row is kept
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float la = p.a_lse[r * p.a_lse_row_stride + h], lb = p.b_lse[r * p.b_lse_row_stride + h];
      const float mx = use_b ? std::max(la, lb) : la;
      const float wa = use_b ? scale_from(la, mx) : 1.0f, wb = use_b ? scale_from(lb, mx) : 0.0f;
      const float sum = wa + wb, inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int64_t ao = r * p.a_row_stride + h * p.a_head_stride, bo = r * p.b_row_stride + h * p.b_head_stride;
      T* out = static_cast<T*>(p.out) + r * p.out_row_stride + h * p.out_head_stride;
      for (int k = 0; k < HEAD_DIM; ++k) {
        const float v = (wa * at<T>(p.a, ao + k) + wb * at<T>(p.b, bo + k)) * inv;
        out[k] = Convert<T>::from_float(v);  // out may alias a: element k was read just above
      }
      p.out_lse[r * p.out_lse_row_stride + h] = merged_lse(mx, sum);
    }
  }
  return Status::Ok();
}

// A 16-bit cache receives the keys and values as they are; an fp8 one e4m3(x / scale).
template <typename T, typename KV, int HEAD_DIM>
Status append_paged_kv(const AppendParams& p) {
  const PagedKV& kv = p.kv;
  IndexCheck check;
  int64_t page = 0, slot = 0;
  for (int64_t i = 0; i < p.nnz && !check.failed(); ++i) append_target(p, i, check.errors(), &page, &slot);
  if (check.failed()) return check.status();  // nothing was written
  for (int64_t i = 0; i < p.nnz; ++i) {
    append_target(p, i, nullptr, &page, &slot);
    KV* k = static_cast<KV*>(const_cast<void*>(kv.k)) + page * kv.k_page_stride + slot * kv.k_slot_stride;
    KV* v = static_cast<KV*>(const_cast<void*>(kv.v)) + page * kv.v_page_stride + slot * kv.v_slot_stride;
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      const T* key = static_cast<const T*>(p.key) + i * p.key_stride_n + h * p.key_stride_h;
      const T* value = static_cast<const T*>(p.value) + i * p.value_stride_n + h * p.value_stride_h;
      if constexpr (sizeof(KV) == sizeof(T)) {
        std::copy(key, key + HEAD_DIM, k + h * kv.k_head_stride);
        std::copy(value, value + HEAD_DIM, v + h * kv.v_head_stride);
      } else {
        for (int d = 0; d < HEAD_DIM; ++d) {
          k[h * kv.k_head_stride + d] = Convert<KV>::from_float(Convert<T>::to_float(key[d]) / p.k_scale);
          v[h * kv.v_head_stride + d] = Convert<KV>::from_float(Convert<T>::to_float(value[d]) / p.v_scale);
        }
      }
    }
  }
  return Status::Ok();
}

inline Status batch_indices_positions(const PositionsParams& p) {
  IndexCheck check;
  check_append_indptr(p, check.errors());
  for (int64_t i = 0; i < p.nnz; ++i) token_position(p, i, check.errors());
  return check.status();
}

}  // namespace kiln::attention::host
