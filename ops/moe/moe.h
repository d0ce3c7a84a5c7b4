// Mixture of experts, routing and data movement: the parameters and entry points shared by the
// CUDA and the host backends (moe_cuda.cu, moe_host.cc). Framework free.
//
//   topk:      router_logits [T, E] -> topk_weights float32 [T, k], topk_ids int32 [T, k]
//              scores = softmax(logits) or sigmoid(logits); keys = scores + correction_bias (bias
//              only for selection); plain top-k over the keys, or grouped (DeepSeek-V3): the best
//              topk_group of num_expert_group groups by the sum of each group's two largest keys,
//              then top-k among the experts of those groups. Weights are the unbiased scores of the
//              chosen experts, divided by their sum when renormalize, then times scale
//              (routed_scaling_factor). Ties go to the lower expert (and group) id; chosen experts
//              are written in descending key order.
//   sort:      topk_ids [n = T*k] -> rows grouped by ascending expert, in ascending flat index t*k+j
//              within an expert (a stable sort): src_idx [n] (row -> flat index; -1 for rows past the
//              last routed one), offs [E] (cumulative row ends), and vLLM's align outputs:
//              sorted_ids [n + E*(block_size-1)] (each expert's run padded to a multiple of
//              block_size with the value n), expert_ids [ceil(len / block_size)] (-1 for blocks past
//              the padded total), num_post_pad [1]. Expert id -1 gives no row; an id outside
//              [-1, E) gives no row and is an index error.
//   gather:    permuted[r] = hidden[src_idx[r] / k] (zero where src_idx[r] == -1)
//   unpermute: out[t] = sum_j w[t, j] * rows[row of t*k+j] over the flat indices that have a row
//              (inv: scratch [n], the inverse of src_idx, built by the call).
//   experts:   the small-batch expert GEMMs (few rows per expert): for the rows [offs[e-1], offs[e])
//              of x and each output column c, gated: out[r, c] = act(w[e, gate_row0 + c] . x[r]) *
//              (w[e, up_row0 + c] . x[r]) (the up projection with its activation fused), plain:
//              out[r, c] = w[e, c] . x[r] (the down projection); float32 dot products, rounded once.
//              generic (cutlass_fused_moe's other activations): out[r, c] = expert_act's activation
//              of the dot products of rows gate_row0 + c (and up_row0 + c) plus their bias, with the
//              expert's parameters, rounded once (the activation fused into the up projection).
//              Weights of the module's dtype, or fp8 e4m3 with per-expert or 128 x 128 block scales.
//   expert_act: the activation between the two projections, with per-expert parameters (FlashInfer's
//              cutlass_fused_moe activation types): for each row r of expert e (offs) and column
//              c < cols, gated: out[r, c] = act(in[r, gate_col0 + c] + b, in[r, up_col0 + c] + b'),
//              plain: out[r, c] = act(in[r, gate_col0 + c] + b) (b, b' the expert's bias at those
//              columns, or 0); float32 arithmetic, rounded once. Rows past offs[E-1] (no expert) are
//              zero.
//   The sort maps ids for expert parallelism: with first_expert f and total_experts N, id e in
//   [f, f + E) is local expert e - f, an id in [0, N) outside it (another rank's expert) gives no
//   row, like -1; anything else is an index error against [0, N).
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/activation/activation.h"
#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::moe {

// Index errors of the MoE family (ops/common/device_error.h): codes and messages.
enum class ErrorCode : int64_t {
  kExpertId = error_code("moe", 1),      // topk_ids[i] is neither an expert nor -1
  kSourceIndex = error_code("moe", 2),   // src_idx[r] is neither a flat index t * top_k + j nor -1
  kSegmentEnd = error_code("moe", 3),    // an expert's rows end past the rows of the input
  kSegmentStart = error_code("moe", 4),  // an expert's rows start below 0 or after their own end
};
inline constexpr ErrorText kErrorTexts[] = {
    {int64_t(ErrorCode::kExpertId),
     "topk_ids[{position}] (flat) = {value} is not an expert: valid are [0, {bound}), or -1 for a slot routed "
     "to no expert of this rank"},
    {int64_t(ErrorCode::kSourceIndex),
     "src_idx[{position}] = {value} is not a flat index t * top_k + j: valid are [0, {bound}), or -1 for an "
     "unused row"},
    {int64_t(ErrorCode::kSegmentEnd),
     "segment {position} ends at row {value}, past the {bound} rows of the input: the expert offsets "
     "(offs) do not fit it"},
    {int64_t(ErrorCode::kSegmentStart),
     "segment {position} starts at row {value}, outside [0, {bound}] (0 to its own end): expert offsets "
     "must start at 0 and never decrease"},
};
KILN_REGISTER_ERROR_TEXTS(kErrorTexts)

enum class Scoring : int { kSoftmax = 0, kSigmoid = 1 };
inline constexpr int kNumScorings = 2;
// The most experts one call routes: the routing kernels keep a token's scores and the sort's
// per-warp counters in shared memory (48 KiB without opt-in), and a lane owns E / 32 experts in
// one 32-bit mask.
inline constexpr int64_t kMaxExperts = 1024;

struct TopkParams {
  float* weights;      // [tokens, top_k]
  int32_t* ids;        // [tokens, top_k]
  const void* logits;  // [tokens, experts] of the module's dtype, row stride logit_stride
  const float* bias;   // [experts] or null
  int64_t tokens, experts, logit_stride;
  int top_k;
  Scoring scoring;
  bool renormalize;
  int num_groups;  // 0: plain top-k; otherwise experts % num_groups == 0, group size >= 2
  int topk_group;  // groups kept (1..num_groups); top_k <= topk_group * group size
  float scale;     // routed_scaling_factor
};

struct SortParams {
  const int32_t* ids;  // [n]
  int64_t n, experts;
  int64_t first_expert;   // expert parallelism: the global id of local expert 0 (0 without it)
  int64_t total_experts;  // the global expert count, >= first_expert + experts
  int64_t block_size;     // align outputs: > 0; 0 when they are not asked for
  int32_t* offs;          // [experts] or null
  int32_t* src_idx;       // [n] or null
  int32_t* sorted_ids;    // [n + experts * (block_size - 1)] or null
  int32_t* expert_ids;    // [ceil_div(n + experts * (block_size - 1), block_size)] or null
  int32_t* num_post_pad;  // [1] or null
  int64_t* errors;        // the device's error record (null on the host)
};

struct GatherParams {
  void* out;               // [n, hidden] row stride out_stride
  const void* hidden;      // [tokens, hidden] row stride in_stride
  const int32_t* src_idx;  // [n]
  int64_t n, tokens, top_k, hidden_size, in_stride, out_stride;
  int64_t* errors;
};

struct UnpermuteParams {
  void* out;               // [tokens, hidden] row stride out_stride
  const void* rows;        // [n, hidden] row stride rows_stride
  const float* weights;    // [tokens, top_k] row stride weight_stride
  const int32_t* src_idx;  // [n]
  int32_t* inv;            // [n] scratch
  int64_t n, tokens, top_k, hidden_size, rows_stride, out_stride, weight_stride;
  int64_t* errors;
};

// The activations of expert_act (values: kiln.moe's table maps FlashInfer's ActivationType onto
// them). Parameters p0, p1, p2 per expert (their defaults where none is given):
//   kSwiglu      gated  g = min(g, p2), u = clamp(u, -p2, p2); g sigmoid(p0 g) (u + p1)
//                       (alpha p0 = 1, beta p1 = 0, limit p2 = inf: silu(g) u; SwiGLU with bias)
//   kSwigluStep  gated  min(silu(g), p2) clamp(u, -p2, p2)                      (limit p2 = 7)
//   kGeglu       gated  gelu(g) u (exact, erf)
//   kGegluTanh   gated  gelu_tanh(g) u
//   kSitu        gated  g, u clamped by p2 as kSwiglu's; p0 tanh(g / p0) sigmoid(g) p1 tanh(u / p1)
//                       (beta p0 = 4, linear_beta p1 = 25)
//   kGelu, kRelu, kSilu, kRelu2 (relu(x)^2), kIdentity: plain
//   kClampedRelu2 plain (p2 tanh(relu(x) / p2))^2
enum class ExpertAct : int {
  kSwiglu = 0,
  kSwigluStep = 1,
  kGeglu = 2,
  kGegluTanh = 3,
  kSitu = 4,
  kGelu = 5,
  kRelu = 6,
  kSilu = 7,
  kRelu2 = 8,
  kIdentity = 9,
  kClampedRelu2 = 10,
};
inline constexpr int kNumExpertActs = 11;
inline constexpr int kExpertActParams = 3;

KILN_HOST_DEVICE constexpr bool is_gated(ExpertAct a) {
  return static_cast<int>(a) <= static_cast<int>(ExpertAct::kSitu);
}

// The small-batch up projection's generic epilogue (ExpertsParams::generic): expert_act's activation,
// per-expert parameters and fc1 bias applied to the kernel's float32 dot products, so the only
// rounding is the activation's (fc1's output is never rounded on its own), as the fused SwiGLU.
struct ExpertsEpilogue {
  ExpertAct act;
  // [experts, >= the weight rows read] (module dtype) row stride bias_stride, or null: the bias of
  // weight row j is column j (output column c: gate_row0 + c, and up_row0 + c when gated).
  const void* bias;
  int64_t bias_stride;
  // p0..p2: float32, one per expert (stride 1) or one for all (stride 0); null: the default.
  const float* param[kExpertActParams];
  int64_t param_stride[kExpertActParams];
  float param_default[kExpertActParams];
};

struct ExpertsParams {
  void* out;            // [rows, cols] row stride out_stride
  const void* x;        // [rows, depth] row stride x_stride
  const void* w;        // [experts, *, depth]: output column c reads row gate_row0 + c (and up_row0 + c)
  const int32_t* offs;  // [experts] cumulative row ends (moe_permute's)
  int64_t rows, experts, cols, depth;
  int64_t x_stride, out_stride, w_expert_stride, w_row_stride;
  int64_t gate_row0, up_row0;  // gated: the first gate and up rows of an expert (0 and I, or I and 0)
  bool gated;
  activation::Act act;  // gated, not generic: the fused activation (kSilu or kGeluTanh)
  // generic: out[r, c] = apply_expert_act(epi.act, gate dot + bias, up dot + bias, expert's p0..p2),
  // gated == is_gated(epi.act); act is unused.
  bool generic;
  ExpertsEpilogue epi;
  // fp8 e4m3 weights (w_fp8) times float32 scales: per expert (scale_mode 1, w_scale [experts]) or
  // per 128 x 128 block of each expert's [rows, depth] (scale_mode 2, w_scale [experts,
  // scale_rows, scale_cols]); 16-bit weights of the module's dtype have none (scale_mode 0).
  bool w_fp8;
  int scale_mode;
  const float* w_scale;
  int64_t scale_rows, scale_cols;
  int64_t* errors;
};
inline constexpr int64_t kScaleBlock = 128;

// fp8 e4m3 weights times their float32 scales, into the module's dtype: the grouped path's
// fallback for fp8 weights (no fp8 grouped GEMM yet). Both tensors contiguous [experts, rows, cols].
struct DequantParams {
  void* out;
  const void* w;
  const float* scale;  // [experts] (scale_mode 1) or [experts, scale_rows, scale_cols] (2)
  int64_t experts, rows, cols;
  int scale_mode;
  int64_t scale_rows, scale_cols;
};

// expert_act's launch: the activation of a rounded fc1 output (the grouped path's generic form).
struct ExpertActParams {
  void* out;            // [rows, cols] row stride out_stride (disjoint from in)
  const void* in;       // [rows, >= gate_col0 + cols (and up_col0 + cols)] row stride in_stride
  const int32_t* offs;  // [experts] cumulative row ends
  const void* bias;     // [experts, bias_cols] (module dtype) row stride bias_stride, or null
  // p0..p2: float32, one per expert (stride 1) or one for all (stride 0); null: the default.
  const float* param[kExpertActParams];
  int64_t param_stride[kExpertActParams];
  float param_default[kExpertActParams];
  int64_t rows, experts, cols, in_stride, out_stride, bias_stride, gate_col0, up_col0;
  ExpertAct act;
};

// Rows of one expert that one pass of the CUDA-core small-batch kernel (float32, or operands the
// tensor-core kernel cannot take) keeps in registers; more rows take more passes over the same
// weights.
inline constexpr int kExpertRowsPerPass = 8;

// Selection order of the routing: a candidate beats the best so far when its key is larger, or
// equal with a lower id; NaN keys lose to every number and win only over "no candidate yet"
// (best_id < 0), so a row of NaN logits still yields valid, distinct ids.
KILN_HOST_DEVICE bool beats(float key, int64_t id, float best_key, int64_t best_id) {
  if (best_id < 0) return true;
  const bool nan = key != key, best_nan = best_key != best_key;
  if (nan != best_nan) return best_nan;
  if (nan) return id < best_id;
  return key > best_key || (key == best_key && id < best_id);
}

KILN_HOST_DEVICE float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

KILN_HOST_DEVICE float silu(float x) {
  return x / (1.0f + expf(-x));
}

KILN_HOST_DEVICE float clamp_abs(float x, float limit) {
  return fminf(fmaxf(x, -limit), limit);
}

// One definition of every expert_act activation for both backends (g: the gate or the plain
// input, u: the up projection; p0..p2 as the table above).
KILN_HOST_DEVICE float apply_expert_act(ExpertAct a, float g, float u, float p0, float p1, float p2) {
  switch (a) {
    case ExpertAct::kSwiglu:
      g = fminf(g, p2);
      return g * sigmoid(p0 * g) * (clamp_abs(u, p2) + p1);
    case ExpertAct::kSwigluStep:
      return fminf(silu(g), p2) * clamp_abs(u, p2);
    case ExpertAct::kGeglu:
      return activation::apply<activation::Act::kGelu>(g) * u;
    case ExpertAct::kGegluTanh:
      return activation::apply<activation::Act::kGeluTanh>(g) * u;
    case ExpertAct::kSitu:
      g = fminf(g, p2);
      return p0 * tanhf(g / p0) * sigmoid(g) * (p1 * tanhf(clamp_abs(u, p2) / p1));
    case ExpertAct::kGelu:
      return activation::apply<activation::Act::kGelu>(g);
    case ExpertAct::kRelu:
      return fmaxf(g, 0.0f);
    case ExpertAct::kSilu:
      return silu(g);
    case ExpertAct::kRelu2: {
      const float r = fmaxf(g, 0.0f);
      return r * r;
    }
    case ExpertAct::kClampedRelu2: {
      const float r = p2 * tanhf(fmaxf(g, 0.0f) / p2);
      return r * r;
    }
    default:  // kIdentity (the binding admits no other value)
      return g;
  }
}

// Expert e's activation parameters p0..p2 (ExpertActParams or ExpertsEpilogue): its own where
// given, else the defaults.
// (Written out: no loop for the device compiler to leave rolled, which would put q in local memory.)
template <typename P>
KILN_HOST_DEVICE void act_params_of(const P& p, int64_t e, float (&q)[kExpertActParams]) {
  static_assert(kExpertActParams == 3, "act_params_of reads p0..p2");
  q[0] = p.param[0] != nullptr ? p.param[0][e * p.param_stride[0]] : p.param_default[0];
  q[1] = p.param[1] != nullptr ? p.param[1][e * p.param_stride[1]] : p.param_default[1];
  q[2] = p.param[2] != nullptr ? p.param[2][e * p.param_stride[2]] : p.param_default[2];
}

// The expert of row r: the first e with offs[e] > r, or `experts` when r lies past every expert's
// rows (a binary search: offs is non-decreasing; any other offs still yields a value in [0, E]).
KILN_HOST_DEVICE int64_t expert_of_row(const int32_t* offs, int64_t experts, int64_t r) {
  int64_t lo = 0, hi = experts;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (offs[mid] > r) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Implemented once per backend (topk and gather/unpermute for the module's dtype).
Status topk(const TopkParams& p, LaunchContext ctx);
Status sort(const SortParams& p, LaunchContext ctx);
Status gather(const GatherParams& p, LaunchContext ctx);
Status unpermute(const UnpermuteParams& p, LaunchContext ctx);
Status experts(const ExpertsParams& p, LaunchContext ctx);
Status dequant(const DequantParams& p, LaunchContext ctx);
Status expert_act(const ExpertActParams& p, LaunchContext ctx);

}  // namespace kiln::moe
