// Attention family, decode part: the parameters and entry points shared by the CUDA and host
// backends of //ops:attention (one module per dtype x kv dtype x head_dim x soft-cap
// specialisation).
//
// Decode: one query token per request (or a few: q_len, see DecodeParams) against its paged KV
// cache.
//   logit[t] = q . k[t] * sm_scale                       (soft-cap: cap * tanh(logit / cap))
//   out      = sum_t softmax(logit)[t] * v[t]
// k[t] and v[t] above are the cache's values times the per-tensor k_scale and v_scale (an fp8 E4M3
// cache holds k / k_scale and v / v_scale; both are 1 unless given).
//   lse      = log2(sum_t exp(logit[t]))                  (base 2, FlashInfer's convention)
// The work is a list of (request, token range) items made by the Python plan; an item either
// writes the request's output directly or a float32 partial (out_idx >= 0) that the merge step
// combines. Tokens outside a sliding window are never in an item's range.
//
// Paged KV layout: token t of request b lives in page indices[indptr[b] + t / page_size], slot
// t % page_size; element (page, slot, head, dim) is at page*page_stride + slot*slot_stride +
// head*head_stride + dim (NHD and HND caches differ only in these strides). Last dim contiguous.
//
// Merge: combine S attention states (v, lse) of one row into one; the states of item i are at
// i*item_stride + (indptr ? indptr[i] + j : j)*state_stride for j in [0, count(i)).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::attention {

// Index errors of the attention family (ops/common/device_error.h): codes and messages.
enum class ErrorCode : int64_t {
  kPageSlot = error_code("attention", 1),          // indptr[b] + t / page_size points past kv_indices
  kPageId = error_code("attention", 2),            // kv_indices[i] is not a page of the cache
  kBatchIndex = error_code("attention", 3),        // batch_indices[i] is not a request of the batch
  kPosition = error_code("attention", 4),          // positions[i] is past what the request's pages hold
  kLastPageLen = error_code("attention", 5),       // kv_last_page_len[b] is outside [1, page_size]
  kAppendIndptr = error_code("attention", 6),      // append_indptr does not cover [0, nnz) in order
  kNegativePosition = error_code("attention", 7),  // seq_lens[b] is shorter than what request b appends
};
inline constexpr ErrorText kErrorTexts[] = {
    {int64_t(ErrorCode::kPageSlot),
     "the page table of request {position} points at kv_indices[{value}], past its {bound} entries "
     "(kv_indptr does not match kv_indices)"},
    {int64_t(ErrorCode::kPageId),
     "kv_indices[{position}] = {value} is not a page of the cache: valid page ids are [0, {bound})"},
    {int64_t(ErrorCode::kBatchIndex),
     "batch_indices[{position}] = {value} is not a request of the batch: valid are [0, {bound})"},
    {int64_t(ErrorCode::kPosition),
     "positions[{position}] = {value} is not a position of its request: valid are [0, {bound}) (its pages "
     "and kv_last_page_len)"},
    {int64_t(ErrorCode::kLastPageLen), "kv_last_page_len[{position}] = {value} is outside [1, page_size = {bound}]"},
    {int64_t(ErrorCode::kAppendIndptr),
     "append_indptr must start at 0, never decrease and end at most at nnz = {bound}: token {position} lies "
     "in no request"},
    {int64_t(ErrorCode::kNegativePosition),
     "seq_lens[{position}] = {value} is shorter than the {bound} token(s) request {position} appends"},
};
KILN_REGISTER_ERROR_TEXTS(kErrorTexts)

// Kernels read page ids through load_page(): an entry of page_indices outside [0, num_indices)
// is never read, and a page id outside [0, num_pages) is never used; such a token's work is
// skipped and the first error recorded (ops/common/device_error.h). The sm90a prefill kernel's
// TMA producer checks a request's entry range once and passes ids on as TMA coordinates
// unchecked (one past the cache reads zeros), while a warp of its own checks every id and records
// the error; its gather producer (small pages, strides TMA rejects) checks each row's id as it
// loads it.
struct PagedKV {
  const void* k;
  const void* v;
  int64_t k_page_stride, k_slot_stride, k_head_stride;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int32_t* page_indptr;   // [batch + 1]
  const int32_t* page_indices;  // [num_indices]
  int64_t page_size;
  int64_t num_pages;    // pages in the cache: valid page ids are [0, num_pages)
  int64_t num_indices;  // entries of page_indices
};

// The page id of a request's `page`-th page (first = page_indptr[request]), or -1 when the entry
// lies outside page_indices or names no page of the cache. No side effect, so the loads of a
// tile's pages issue together; record_page_error says why afterwards, off the hot path.
KILN_HOST_DEVICE int64_t load_page(const PagedKV& kv, int64_t first, int64_t page) {
  const int64_t at = first + page;
  const int64_t id = at >= 0 && at < kv.num_indices ? kv.page_indices[at] : -1;
  return id < kv.num_pages ? id : -1;
}

KILN_HOST_DEVICE void record_page_error(const PagedKV& kv, int64_t request, int64_t first, int64_t page,
                                        int64_t* errors) {
  const int64_t at = first + page;
  if (at < 0 || at >= kv.num_indices) {
    record_error(errors, ErrorCode::kPageSlot, request, at, kv.num_indices);
  } else {
    record_error(errors, ErrorCode::kPageId, at, kv.page_indices[at], kv.num_pages);
  }
}

// load_page, recording the error of a page that is not there.
KILN_HOST_DEVICE int64_t page_at(const PagedKV& kv, int64_t request, int64_t first, int64_t page, int64_t* errors) {
  const int64_t id = load_page(kv, first, page);
  if (id < 0) record_page_error(kv, request, first, page, errors);
  return id;
}

// Decode runs one CTA per (work item, kv head, chunk of the GQA group, chunk of the request's
// queries): its query rows (a head of the chunk x a query of the chunk) fill up to two MMA n-tiles
// of 8. The head chunk is the largest divisor of the group size that fits beside the queries. The
// binding exports this table, so the Python schedule counts CTAs with the kernel's own numbers.
constexpr int kMaxHeadsPerCta = 16;  // query rows a CTA: two n-tiles of the MMAs' N (8 each)

inline int heads_per_cta(int64_t group_size) {
  for (int h = kMaxHeadsPerCta; h > 1; --h) {
    if (group_size % h == 0) return h;
  }
  return 1;
}

// (heads, queries) of one decode CTA for q_len queries per request (multi-token decode): every
// query of a head in one CTA where q_len <= 16 (each K/V byte then serves them all), with as many
// of the group's heads as fit beside them; longer q_len in near-equal chunks of at most 16.
struct DecodeCtaShape {
  int heads, queries;
};

inline DecodeCtaShape decode_cta_shape(int64_t group_size, int64_t q_len) {
  if (q_len <= 1) return {heads_per_cta(group_size), 1};
  if (q_len >= kMaxHeadsPerCta) {
    const int64_t chunks = (q_len + kMaxHeadsPerCta - 1) / kMaxHeadsPerCta;
    return {1, static_cast<int>((q_len + chunks - 1) / chunks)};
  }
  int h = static_cast<int>(kMaxHeadsPerCta / q_len);
  while (h > 1 && group_size % h != 0) --h;
  return {h, static_cast<int>(q_len)};
}

// CTAs per decode work item: kv heads x head chunks x query chunks.
inline int64_t decode_ctas_per_item(int64_t num_qo_heads, int64_t num_kv_heads, int64_t q_len) {
  const int64_t group = num_qo_heads / num_kv_heads;
  const DecodeCtaShape s = decode_cta_shape(group, q_len);
  return num_kv_heads * (group / s.heads) * ((q_len + s.queries - 1) / s.queries);
}

// Multi-token decode (q_len > 1, speculative decoding's verification): request b's queries are
// rows b * q_len + j of q/out/lse, query j at position L - q_len + j of the request's L tokens
// (all in the cache already), causal among themselves: it sees keys t <= L - q_len + j (and
// t >= that - window_left with a window). Partial slots then hold [q_len, num_qo_heads] rows.
// ROPE_LLAMA modules rotate q (at its position) and every key (at its token index) inside the
// kernel, over dims (i, i + head_dim / 2) by the angle position x freq(i), freq(i) =
// rope_rcp_scale x 2^(i x rope_freq_exp) (rope_freq_exp = -2 log2(rope_theta) / head_dim).
struct DecodeParams {
  const void* q;  // [batch * q_len, num_qo_heads, head_dim]
  int64_t q_stride_b, q_stride_h;
  PagedKV kv;
  int64_t num_qo_heads, num_kv_heads;
  const int32_t* kv_len;  // [batch]: each request's tokens L (query positions, the causal mask)
  int64_t q_len;          // queries per request, >= 1
  int32_t window_left;    // < 0: no window (q_len 1: the plan's token ranges already apply it)
  float rope_rcp_scale, rope_freq_exp;
  // Work list (capacity entries; an entry with request < 0 is padding, for CUDA graphs).
  const int32_t* work_request;
  const int32_t* work_token_begin;
  const int32_t* work_token_end;
  const int32_t* work_out_index;    // -1: write out/lse directly; else the partial slot
  const int32_t* work_merge_index;  // -1: not split; else the item's merge entry m
  int64_t work_capacity;
  // Merge list: request merge_request[m] combines partial slots [merge_indptr[m], merge_indptr[m+1]).
  const int32_t* merge_request;
  const int32_t* merge_indptr;
  int64_t merge_capacity;
  // [merge_capacity][CTAs per work item] arrival counts, all zero between launches: on CUDA the
  // last CTA of a split request to finish merges its slots and zeroes the count (so the same
  // buffer serves every later launch and CUDA-graph replay). The host backend does not use it.
  int32_t* merge_counter;
  void* out;  // [batch * q_len, num_qo_heads, head_dim], the dtype of q
  int64_t out_stride_b, out_stride_h;
  float* lse;  // [batch * q_len, num_qo_heads] or null
  int64_t lse_stride_b;
  float* partial_out;  // [slots, q_len * num_qo_heads, head_dim] float32
  float* partial_lse;  // [slots, q_len * num_qo_heads] float32
  float sm_scale;
  float soft_cap;  // used only by soft-cap specialisations
  // Per-tensor scales of the cache: logits use k * k_scale and out v * v_scale (an fp8 cache
  // stores k / k_scale and v / v_scale; 1 for a 16-bit cache unless the caller scales it).
  float k_scale, v_scale;
};

// Prefill: every query token of a request attends to the request's keys. Query i of a request
// with qo_len queries and kv_len keys sits at position i + kv_len - qo_len, so with `causal` it
// sees keys j <= i + kv_len - qo_len (the mask aligned to the end), and with window_left >= 0 only
// keys j >= i + kv_len - qo_len - window_left. Queries are packed: request b's are rows
// qo_indptr[b] .. qo_indptr[b+1] of q/out/lse. Ragged (contiguous per request) KV is the paged
// case with page_size 1 and identity page indices. A work item is (request, first query of a
// 128-query tile); the kernel's grid is work items x query heads, in the order prefill_cta gives.
constexpr int kPrefillQueriesPerItem = 128;  // queries per prefill work item (the plan's tile)

// Which prefill kernel a call asks for (PrefillParams::kernel). The sm90a kernel serves a call
// only where prefill_sm90_supported() says so (a 9.0a build on a 9.0 device, 16-byte aligned
// strides, a page size it can tile); anything else runs the FA2 kernel.
constexpr int32_t kPrefillKernelFA2 = 0;        // mma.sync, cp.async (sm80+): prefill.cuh
constexpr int32_t kPrefillKernelFA3 = 1;        // wgmma, TMA, warp-specialised (sm90a): prefill_sm90.cuh
constexpr int32_t kPrefillKernelFA3Strict = 2;  // FA3, and an error instead of a fallback (tests)

struct PrefillParams {
  const void* q;  // [total_q, num_qo_heads, head_dim]
  int64_t q_stride_n, q_stride_h;
  const int32_t* qo_indptr;  // [batch + 1]
  const int32_t* kv_len;     // [batch]
  PagedKV kv;
  int64_t num_qo_heads, num_kv_heads;
  const int32_t* work_request;  // [capacity]; < 0: padding
  const int32_t* work_q_start;  // [capacity]
  int64_t work_capacity;
  void* out;  // [total_q, num_qo_heads, head_dim]
  int64_t out_stride_n, out_stride_h;
  float* lse;  // [total_q, num_qo_heads] or null
  int64_t lse_stride_n;
  float sm_scale;
  float soft_cap;
  bool causal;
  int32_t window_left;  // < 0: no window
  int32_t kernel;       // kPrefillKernelFA2 or kPrefillKernelFA3
  // Set by single prefill (one page per request) and the ragged wrapper (one-token pages with
  // identity indices): each request's keys are consecutive cache rows, which lets the sm90a
  // kernel load a whole KV tile with one TMA box. Never set for a real paged cache.
  bool kv_contiguous;
  int64_t kv_num_pages;  // pages in the cache (the TMA tensor map's extent)
  int64_t q_rows;        // rows of q (total_q)
  // The variants' inputs, read only by modules built with the custom_mask or pos_encoding axis
  // (kept last, so the plain kernels' parameter offsets do not move). See PrefillPosEncoding.
  // Custom mask: request b's bit i * kv_len + j, counted little-endian from byte mask_indptr[b]
  // of custom_mask (FlashInfer's packbits(..., bitorder="little") per request), says whether its
  // query i sees key j. A byte outside [mask_indptr[b], mask_indptr[b + 1]) or [0, mask_bytes)
  // is never read: its bits count as 0 (the Python plan checks the ranges cover every bit).
  const uint8_t* custom_mask;
  const int32_t* mask_indptr;  // [batch + 1], byte offsets
  int64_t mask_bytes;
  float rope_rcp_scale, rope_theta;  // kRopeLlama: 1 / rope_scale and rope_theta
};

// Position encodings applied inside the prefill kernels (FlashInfer's pos_encoding_mode):
//   kRopeLlama: q and k rotated as the kernel loads them, query i at position i + kv_len - qo_len
//     and key j at j; the pair (d, d + head_dim / 2) turns by pos * freq(d), freq(d) =
//     rope_theta^(-2d / head_dim) / rope_scale (NeoX / Llama pairing), the rotated values rounded
//     to the query's dtype as the kernel stores them.
//   kAlibi: logit = q.k * sm_scale + slope(h) * (j - i) before the soft-cap, i the query's index
//     in its request, slope of alibi_slope.
enum class PrefillPosEncoding : int { kNone = 0, kRopeLlama = 1, kAlibi = 2 };

// The BUILD file's pos_encoding values ("none", "rope" for ROPE_LLAMA, "alibi"), as spec::pos_encoding
// spells them.
constexpr PrefillPosEncoding prefill_pos_encoding(std::string_view name) {
  return name == "rope"    ? PrefillPosEncoding::kRopeLlama
         : name == "alibi" ? PrefillPosEncoding::kAlibi
                           : PrefillPosEncoding::kNone;
}

// ALiBi's slope of query head h of num_heads (Press et al.; FlashInfer's get_alibi_slopes): with
// n the largest power of two <= num_heads, 2^(-8 (h + 1) / n) for h < n, else
// 2^(-4 (2 (h - n) + 1) / n).
KILN_HOST_DEVICE float alibi_slope(int64_t head, int64_t num_heads) {
  int64_t n = 1;
  while (2 * n <= num_heads) n *= 2;
  const float e = head < n ? -8.0f * static_cast<float>(head + 1) : -4.0f * static_cast<float>(2 * (head - n) + 1);
  return exp2f(e / static_cast<float>(n));
}

// kRopeLlama's frequency of rotary pair d (d < head_dim / 2).
KILN_HOST_DEVICE float rope_frequency(const PrefillParams& p, int64_t d, int64_t head_dim) {
  return powf(p.rope_theta, -2.0f * static_cast<float>(d) / static_cast<float>(head_dim)) * p.rope_rcp_scale;
}

struct MergeParams {
  const void* v;  // states, element type: float (decode partials) or the module's dtype
  const float* s;
  int64_t num_items, num_heads;
  int64_t num_states;      // states per item when indptr is null
  const int32_t* indptr;   // nullable: per-item state ranges
  const int32_t* out_row;  // nullable: output row of item i (identity when null; < 0: skip)
  int64_t v_item_stride, v_state_stride, v_head_stride;
  int64_t s_item_stride, s_state_stride, s_head_stride;
  void* out;  // the module's dtype
  int64_t out_row_stride, out_head_stride;
  float* out_lse;  // nullable
  int64_t lse_row_stride, lse_head_stride;
};

// merge_state / merge_state_in_place: two states per row; where mask is given and false, the
// row keeps a exactly (copied, or untouched in place). `out`/`out_lse` may alias `a`/`a_lse`.
struct MergeTwoParams {
  const void* a;
  const float* a_lse;
  const void* b;
  const float* b_lse;
  const uint8_t* mask;  // nullable, [rows]: row r's flag at mask[r * mask_stride] (0: one flag for all)
  int64_t mask_stride;
  void* out;
  float* out_lse;
  int64_t rows, num_heads;
  int64_t a_row_stride, a_head_stride, b_row_stride, b_head_stride, out_row_stride, out_head_stride;
  int64_t a_lse_row_stride, b_lse_row_stride, out_lse_row_stride;  // lse head stride is 1
};

// Append: token i goes to request batch_indices[i] (in [0, batch)) at position positions[i], which
// must lie within the request's pages: [0, (pages - 1) * page_size + last_page_len[b]). A token
// that breaks either is recorded and not written.
struct AppendParams {
  const void* key;  // [nnz, num_kv_heads, head_dim]
  const void* value;
  int64_t key_stride_n, key_stride_h, value_stride_n, value_stride_h;
  const int32_t* batch_indices;  // [nnz]
  const int32_t* positions;      // [nnz]
  const int32_t* last_page_len;  // [batch]
  int64_t nnz, num_kv_heads, batch;
  PagedKV kv;  // k/v are written through
  // An fp8 cache receives e4m3(key / k_scale) and e4m3(value / v_scale), saturated at +-448
  // (1 and unused for 16-bit caches).
  float k_scale, v_scale;
};

// Where append token i goes: the page id and slot, or false after recording why it cannot be
// written (both backends check through this one function).
KILN_HOST_DEVICE bool append_target(const AppendParams& p, int64_t i, int64_t* errors, int64_t* page, int64_t* slot) {
  const int64_t b = p.batch_indices[i];
  if (b < 0 || b >= p.batch) {
    record_error(errors, ErrorCode::kBatchIndex, i, b, p.batch);
    return false;
  }
  const int64_t first = p.kv.page_indptr[b], pages = p.kv.page_indptr[b + 1] - first;
  const int64_t last = p.last_page_len[b];
  if (pages > 0 && (last < 1 || last > p.kv.page_size)) {
    record_error(errors, ErrorCode::kLastPageLen, b, last, p.kv.page_size);
    return false;
  }
  const int64_t kv_len = pages > 0 ? (pages - 1) * p.kv.page_size + last : 0;
  const int64_t pos = p.positions[i];
  if (pos < 0 || pos >= kv_len) {
    record_error(errors, ErrorCode::kPosition, i, pos, kv_len);
    return false;
  }
  *page = page_at(p.kv, b, first, pos / p.kv.page_size, errors);
  *slot = pos % p.kv.page_size;
  return *page >= 0;
}

// get_batch_indices_positions: token i of the packed appends belongs to the request b with
// append_indptr[b] <= i < append_indptr[b + 1] and sits at position seq_lens[b] - (its count) +
// (i - append_indptr[b]) (seq_lens: the lengths after the append). Tokens from append_indptr[batch]
// up to nnz are padding (FlashInfer's contract: a caller may size its buffers past the real
// tokens): batch index -1, position left as it is. An append_indptr that does not start at 0 and
// rise to at most nnz, or a seq_len shorter than the request's count, is recorded and gives -1 for
// the tokens concerned.
struct PositionsParams {
  const int32_t* append_indptr;  // [batch + 1]
  const int32_t* seq_lens;       // [batch]
  int64_t batch, nnz;
  int32_t* batch_indices;  // [nnz], written
  int32_t* positions;      // [nnz], written (padding tokens: not written)
};

// The whole of append_indptr: from 0, never decreasing, to at most nnz (what the per-token search
// assumes). Run once per call, also when there is no token.
KILN_HOST_DEVICE void check_append_indptr(const PositionsParams& p, int64_t* errors) {
  bool ok = p.append_indptr[0] == 0 && p.append_indptr[p.batch] <= p.nnz;
  for (int64_t b = 0; ok && b < p.batch; ++b) ok = p.append_indptr[b + 1] >= p.append_indptr[b];
  if (!ok) {
    record_error(errors, ErrorCode::kAppendIndptr, 0, 0, p.nnz);
    return;
  }
  for (int64_t b = 0; b < p.batch; ++b) {  // every request, also one that appends nothing
    const int64_t count = p.append_indptr[b + 1] - p.append_indptr[b];
    if (p.seq_lens[b] < count) record_error(errors, ErrorCode::kNegativePosition, b, p.seq_lens[b], count);
  }
}

KILN_HOST_DEVICE void token_position(const PositionsParams& p, int64_t i, int64_t* errors) {
  if (p.append_indptr[p.batch] <= i && p.append_indptr[p.batch] <= p.nnz && p.append_indptr[0] == 0) {
    p.batch_indices[i] = -1;  // padding past the real tokens
    return;
  }
  int64_t lo = 0, hi = p.batch;  // the last b with append_indptr[b] <= i (any order: checked below)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (p.append_indptr[mid] <= i ? lo : hi) = mid;
  }
  const int64_t b = lo, begin = p.append_indptr[b], end = p.batch > 0 ? p.append_indptr[b + 1] : 0;
  int32_t bi = -1, pos = -1;
  if (p.batch == 0 || begin > i || i >= end || p.append_indptr[0] != 0 || p.append_indptr[p.batch] > p.nnz) {
    record_error(errors, ErrorCode::kAppendIndptr, i, 0, p.nnz);
  } else if (p.seq_lens[b] < end - begin) {
    record_error(errors, ErrorCode::kNegativePosition, b, p.seq_lens[b], end - begin);
  } else {
    bi = static_cast<int32_t>(b);
    pos = static_cast<int32_t>(p.seq_lens[b] - (end - begin) + (i - begin));
  }
  p.batch_indices[i] = bi;
  p.positions[i] = pos;
}

// Implemented once per backend for the module's dtype, head_dim and soft-cap flag.
Status decode(const DecodeParams& p, LaunchContext ctx);
Status prefill(const PrefillParams& p, LaunchContext ctx);
Status merge_states(const MergeParams& p, LaunchContext ctx);  // v of the module's dtype
Status merge_two(const MergeTwoParams& p, LaunchContext ctx);
Status append_paged_kv(const AppendParams& p, LaunchContext ctx);
Status batch_indices_positions(const PositionsParams& p, LaunchContext ctx);

}  // namespace kiln::attention
