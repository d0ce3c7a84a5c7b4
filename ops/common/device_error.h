// Index errors found on the device: a kernel that reads an index out of its range (a page id past
// the cache, a batch index past the batch, a position past the request's length, a GEMM segment
// past the rows of its input, a weight index past the weights) records the first
// one in a small per-device record and skips the work that index would have done, so it never
// reads or writes memory it does not own. The Python side reads the record (kiln.check_errors,
// a later plan(), or after every call with KILN_VALIDATE_INDICES=1) and raises a clear error.
//
// The record is four int64 in device memory, zero while no error was found:
//   [0] code (ErrorCode), [1] position (the index into the array holding the bad value),
//   [2] the bad value, [3] the bound it broke (values must be in [0, bound)).
// The host backend checks the same things before it touches anything and returns an error Status
// at once instead (kiln::index_error builds its message from the same table).
#pragma once

#include <cstdint>
#include <string>

#include "ops/common/macros.h"

namespace kiln {

enum class ErrorCode : int64_t {
  kNone = 0,
  kPageSlot = 1,          // indptr[b] + t / page_size points past the page list (kv_indices)
  kPageId = 2,            // kv_indices[i] is not a page of the cache
  kBatchIndex = 3,        // batch_indices[i] is not a request of the batch
  kPosition = 4,          // positions[i] is past what the request's pages hold
  kLastPageLen = 5,       // kv_last_page_len[b] is outside [1, page_size]
  kAppendIndptr = 6,      // append_indptr does not cover [0, nnz) in order
  kNegativePosition = 7,  // seq_lens[b] is shorter than what request b appends
  kSegmentEnd = 8,        // a grouped GEMM's segment ends past the rows of its input
  kSegmentStart = 9,      // a grouped GEMM's segment starts below 0 or after its own end
  kWeightIndex = 10,      // weight_indices[s] is not a weight of the grouped GEMM
  kRopeIndptr = 11,       // a RoPE token lies in no request of indptr
  kCosSinRow = 12,        // a RoPE position is not a row of cos_sin_cache
  kSamplingIndex = 13,    // a sampler's indices[i] is not a row of its probs/logits
  kDraftTokenId = 14,     // a draft token id of speculative sampling is not in the vocabulary
  kExpertId = 15,         // topk_ids[i] is neither an expert nor -1 (MoE routing)
  kSourceIndex = 16,      // src_idx[r] is neither a flat index t * top_k + j nor -1 (MoE unpermute)
};

// The message of each code, with {position}, {value} and {bound} filled in by the reader. The
// bindings export this table, so the Python message and the C++ codes cannot drift apart.
struct ErrorText {
  ErrorCode code;
  const char* text;
};
inline constexpr ErrorText kErrorTexts[] = {
    {ErrorCode::kPageSlot,
     "the page table of request {position} points at kv_indices[{value}], past its {bound} entries "
     "(kv_indptr does not match kv_indices)"},
    {ErrorCode::kPageId,
     "kv_indices[{position}] = {value} is not a page of the cache: valid page ids are [0, {bound})"},
    {ErrorCode::kBatchIndex,
     "batch_indices[{position}] = {value} is not a request of the batch: valid are [0, {bound})"},
    {ErrorCode::kPosition,
     "positions[{position}] = {value} is not a position of its request: valid are [0, {bound}) (its pages "
     "and kv_last_page_len)"},
    {ErrorCode::kLastPageLen, "kv_last_page_len[{position}] = {value} is outside [1, page_size = {bound}]"},
    {ErrorCode::kAppendIndptr,
     "append_indptr must start at 0, never decrease and end at most at nnz = {bound}: token {position} lies "
     "in no request"},
    {ErrorCode::kNegativePosition,
     "seq_lens[{position}] = {value} is shorter than the {bound} token(s) request {position} appends"},
    {ErrorCode::kSegmentEnd,
     "segment {position} ends at row {value}, past the {bound} rows of the input: the segment bounds "
     "(seg_indptr, seg_lens or offs) do not fit it"},
    {ErrorCode::kSegmentStart,
     "segment {position} starts at row {value}, outside [0, {bound}] (0 to its own end): segment bounds "
     "must start at 0 and never decrease"},
    {ErrorCode::kWeightIndex, "weight_indices[{position}] = {value} is not a weight: valid are [0, {bound})"},
    {ErrorCode::kRopeIndptr,
     "token {position} lies in no request of indptr (which ends at {value}): indptr must start at 0, never "
     "decrease and end at nnz = {bound}"},
    {ErrorCode::kCosSinRow, "positions[{position}] = {value} is not a row of cos_sin_cache: valid are [0, {bound})"},
    {ErrorCode::kSamplingIndex,
     "indices[{position}] = {value} is not a row of the probabilities/logits: valid are [0, {bound})"},
    {ErrorCode::kDraftTokenId,
     "draft_token_ids (flattened)[{position}] = {value} is not a token of the vocabulary: valid are [0, {bound})"},
    {ErrorCode::kExpertId,
     "topk_ids[{position}] (flat) = {value} is not an expert: valid are [0, {bound}), or -1 for a slot routed "
     "to no expert of this rank"},
    {ErrorCode::kSourceIndex,
     "src_idx[{position}] = {value} is not a flat index t * top_k + j: valid are [0, {bound}), or -1 for an "
     "unused row"},
};

// Record the first error of a launch (later ones are dropped: one clear message is enough).
KILN_HOST_DEVICE void record_error(int64_t* record, ErrorCode code, int64_t position, int64_t value, int64_t bound) {
  if (record == nullptr) return;
#if defined(__CUDA_ARCH__)
  auto* word = reinterpret_cast<unsigned long long*>(record);
  if (atomicCAS(word, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    record[1] = position;
    record[2] = value;
    record[3] = bound;
    __threadfence();
  }
#else
  if (record[0] == 0) {
    record[0] = static_cast<int64_t>(code);
    record[1] = position;
    record[2] = value;
    record[3] = bound;
  }
#endif
}

// The message of a record, for the host backend's Status (the Python reader formats its own).
inline std::string index_error(ErrorCode code, int64_t position, int64_t value, int64_t bound) {
  std::string text = "index error";
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == code) text = e.text;
  }
  auto put = [&](const std::string& key, int64_t v) {
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key)) {
      text.replace(at, key.size(), std::to_string(v));
    }
  };
  put("{position}", position);
  put("{value}", value);
  put("{bound}", bound);
  return text;
}

}  // namespace kiln
