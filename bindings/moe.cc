// //ops:moe launcher: validates the tensors, prepares the parameter structs of ops/moe/moe.h and
// calls the backend's entry points on the caller's stream. Compiled by the host compiler for both
// toolchains; only this layer knows Python. Arguments are keyword-only.
//
//   topk(*, weights, ids, logits, top_k, scoring, renormalize, num_groups, topk_group, bias=None,
//        scale=1.0, errors=0, stream=0)
//   sort(*, ids, num_experts, offs=None, src_idx=None, sorted_ids=None, expert_ids=None,
//        num_post_pad=None, block_size=0, first_expert=0, total_experts=0, errors=0, stream=0)
//   gather(*, out, hidden, src_idx, top_k, errors=0, stream=0)
//   unpermute(*, out, rows, weights, src_idx, inv, errors=0, stream=0)
//   experts(*, out, x, w, offs, gated, act, gate_row0=0, up_row0=0, w_scale=None, expert_act=-1,
//           p0=None, p1=None, p2=None, defaults=(0, 0, 0), bias=None, errors=0, stream=0)
//           (expert_act >= 0: the generic epilogue, expert_act's activation of the dot products
//           with p0..p2 and bias as expert_act's; gated must be is_gated(expert_act), act unused)
//   dequant(*, out, w, w_scale, stream=0)
//   expert_act(*, out, input, offs, act, gate_col0=0, up_col0=0, p0=None, p1=None, p2=None,
//              defaults=(0, 0, 0), bias=None, stream=0)
//
// logits [T, E] (module dtype, contiguous rows); weights float32 and ids int32 [T, k] contiguous;
// bias float32 [E]; sort's ids int32, any shape, contiguous (flattened to n); hidden/out/rows of
// the module's dtype, 2-D, contiguous in the last dimension with any row stride.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/moe/moe.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
namespace km = kiln::moe;
using kb::TensorView;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kb::dl_dtype<Elem>();
constexpr auto kFloat = kb::dl_dtype<float>();
constexpr kiln::dl::DataType kInt32{kiln::dl::kInt, 32, 1};
constexpr auto kFp8 = kb::dl_dtype<kiln::e4m3_t>();

std::string str(int64_t v) {
  return std::to_string(v);
}

bool contiguous(const TensorView& t) {
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

TensorView tensor(py::handle obj, const char* name, const TensorView* ref, kiln::dl::DataType dtype,
                  const std::string& why, bool need_contiguous) {
  TensorView t = kb::view_of(obj, name);
  if (ref != nullptr) {
    kb::check_same_device(t, *ref);
  } else {
    kb::check_backend_device(t);
  }
  kb::check_dtype(t, dtype, why);
  if (need_contiguous && !contiguous(t)) kb::value_error(t.name + " must be contiguous, got shape " + t.shape_str());
  return t;
}

void check_shape2(const TensorView& t, int64_t rows, int64_t cols, const std::string& what) {
  if (t.ndim != 2 || t.shape[0] != rows || t.shape[1] != cols) {
    kb::value_error(t.name + ".shape must be [" + str(rows) + ", " + str(cols) + "] (" + what + "), got " +
                    t.shape_str());
  }
}

void topk(py::handle weights_obj, py::handle ids_obj, py::handle logits_obj, int64_t top_k, int scoring,
          bool renormalize, int64_t num_groups, int64_t topk_group, py::object bias_obj, double scale, uintptr_t errors,
          uintptr_t stream) {
  TensorView logits =
      tensor(logits_obj, "router_logits", nullptr, kDType, std::string("this module is ") + kiln::spec::kUri, false);
  if (logits.ndim != 2) kb::value_error("router_logits must be 2-D [tokens, experts], got shape " + logits.shape_str());
  kb::check_last_contiguous(logits);
  const int64_t T = logits.shape[0], E = logits.shape[1];
  if (E < 1 || E > km::kMaxExperts) {
    kb::value_error("router_logits.shape[1] (experts) must be in [1, " + str(km::kMaxExperts) + "], got " + str(E));
  }
  if (top_k < 1 || top_k > E) kb::value_error("top_k must be in [1, experts = " + str(E) + "], got " + str(top_k));
  if (scoring < 0 || scoring >= km::kNumScorings) kb::value_error("scoring must be 0 (softmax) or 1 (sigmoid)");
  if (num_groups != 0) {
    if (num_groups < 1 || E % num_groups != 0 || E / num_groups < 2) {
      kb::value_error("num_expert_group must divide the experts (" + str(E) +
                      ") into groups of at least 2 (the group score is the sum of its top 2), got " + str(num_groups));
    }
    if (topk_group < 1 || topk_group > num_groups) {
      kb::value_error("topk_group must be in [1, num_expert_group = " + str(num_groups) + "], got " + str(topk_group));
    }
    if (top_k > topk_group * (E / num_groups)) {
      kb::value_error("top_k (" + str(top_k) + ") must be at most the experts of the kept groups (topk_group * " +
                      "experts / num_expert_group = " + str(topk_group * (E / num_groups)) + ")");
    }
  }
  TensorView weights = tensor(weights_obj, "topk_weights", &logits, kFloat, "float32", true);
  check_shape2(weights, T, top_k, "[tokens, top_k]");
  TensorView ids = tensor(ids_obj, "topk_ids", &logits, kInt32, "int32", true);
  check_shape2(ids, T, top_k, "[tokens, top_k]");
  km::TopkParams p{};
  if (!bias_obj.is_none()) {
    TensorView bias = tensor(bias_obj, "correction_bias", &logits, kFloat, "float32", true);
    if (bias.ndim != 1 || bias.shape[0] != E) {
      kb::value_error("correction_bias.shape must be [" + str(E) + "] (one per expert), got " + bias.shape_str());
    }
    p.bias = static_cast<const float*>(bias.data);
  }
  p.weights = static_cast<float*>(weights.data);
  p.ids = static_cast<int32_t*>(ids.data);
  p.logits = logits.data;
  p.tokens = T, p.experts = E, p.logit_stride = logits.strides[0];
  p.top_k = static_cast<int>(top_k);
  p.scoring = static_cast<km::Scoring>(scoring);
  p.renormalize = renormalize;
  p.num_groups = static_cast<int>(num_groups);
  p.topk_group = static_cast<int>(topk_group);
  p.scale = static_cast<float>(scale);
  const kiln::LaunchContext ctx = kb::launch_context(logits, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::topk(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

int32_t* optional_out(py::object obj, const char* name, const TensorView& ref, int64_t len, const std::string& what) {
  if (obj.is_none()) return nullptr;
  TensorView t = tensor(obj, name, &ref, kInt32, "int32", true);
  if (t.numel() != len)
    kb::value_error(std::string(name) + " must hold " + str(len) + " elements (" + what + "), got " + t.shape_str());
  return static_cast<int32_t*>(t.data);
}

void sort(py::handle ids_obj, int64_t num_experts, py::object offs, py::object src_idx, py::object sorted_ids,
          py::object expert_ids, py::object num_post_pad, int64_t block_size, int64_t first_expert,
          int64_t total_experts, uintptr_t errors, uintptr_t stream) {
  TensorView ids = tensor(ids_obj, "topk_ids", nullptr, kInt32, "int32", true);
  if (num_experts < 1 || num_experts > km::kMaxExperts) {
    kb::value_error("num_experts must be in [1, " + str(km::kMaxExperts) + "], got " + str(num_experts));
  }
  const int64_t n = ids.numel();
  if (n >= (int64_t(1) << 30)) kb::value_error("topk_ids holds " + str(n) + " ids, more than int32 rows allow");
  if (block_size < 0) kb::value_error("block_size must be positive, got " + str(block_size));
  if (total_experts == 0) total_experts = num_experts;
  if (first_expert < 0 || first_expert + num_experts > total_experts || total_experts >= (int64_t(1) << 31)) {
    kb::value_error("the local experts [first_expert, first_expert + num_experts) = [" + str(first_expert) + ", " +
                    str(first_expert + num_experts) + ") must lie in [0, total_experts = " + str(total_experts) +
                    ") (expert parallelism), and total_experts below 2^31");
  }
  km::SortParams p{};
  p.ids = static_cast<const int32_t*>(ids.data);
  p.n = n, p.experts = num_experts, p.block_size = block_size;
  p.first_expert = first_expert, p.total_experts = total_experts;
  p.offs = optional_out(offs, "offs", ids, num_experts, "one per expert");
  p.src_idx = optional_out(src_idx, "src_idx", ids, n, "one per routed slot");
  if (p.src_idx != nullptr && p.offs == nullptr) kb::value_error("src_idx needs offs");
  if (block_size > 0) {
    if (block_size >= (int64_t(1) << 30)) kb::value_error("block_size must be below 2^30, got " + str(block_size));
    const int64_t len = n + num_experts * (block_size - 1);
    if (len >= (int64_t(1) << 31)) {
      kb::value_error("T*k + E*(block_size-1) = " + str(len) + " does not fit the int32 sorted_token_ids");
    }
    p.sorted_ids = optional_out(sorted_ids, "sorted_token_ids", ids, len, "T*k + E*(block_size-1)");
    p.expert_ids = optional_out(expert_ids, "expert_ids", ids, (len + block_size - 1) / block_size,
                                "one per block of sorted_token_ids");
    p.num_post_pad = optional_out(num_post_pad, "num_tokens_post_padded", ids, 1, "one");
  }
  const kiln::LaunchContext ctx = kb::launch_context(ids, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::sort(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

TensorView rows_view(py::handle obj, const char* name, const TensorView* ref) {
  TensorView t = tensor(obj, name, ref, kDType,
                        ref ? "the dtype of hidden_states" : std::string("this module is ") + kiln::spec::kUri, false);
  if (t.ndim != 2) kb::value_error(t.name + " must be 2-D, got shape " + t.shape_str());
  kb::check_last_contiguous(t);
  kb::check_element_aligned(t, sizeof(Elem));
  return t;
}

void gather(py::handle out_obj, py::handle hidden_obj, py::handle src_obj, int64_t top_k, uintptr_t errors,
            uintptr_t stream) {
  TensorView hidden = rows_view(hidden_obj, "hidden_states", nullptr);
  TensorView src = tensor(src_obj, "src_idx", &hidden, kInt32, "int32", true);
  if (top_k < 1) kb::value_error("top_k must be positive, got " + str(top_k));
  const int64_t n = src.numel();
  if (n != hidden.shape[0] * top_k) {
    kb::value_error("src_idx must hold tokens * top_k = " + str(hidden.shape[0] * top_k) + " entries, got " + str(n));
  }
  TensorView out = rows_view(out_obj, "permuted", &hidden);
  check_shape2(out, n, hidden.shape[1], "[tokens * top_k, hidden]");
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, hidden);
  km::GatherParams p{};
  p.out = out.data, p.hidden = hidden.data, p.src_idx = static_cast<const int32_t*>(src.data);
  p.n = n, p.tokens = hidden.shape[0], p.top_k = top_k, p.hidden_size = hidden.shape[1];
  p.in_stride = hidden.strides[0], p.out_stride = out.strides[0];
  const kiln::LaunchContext ctx = kb::launch_context(hidden, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::gather(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

void unpermute(py::handle out_obj, py::handle rows_obj, py::handle weights_obj, py::handle src_obj, py::handle inv_obj,
               uintptr_t errors, uintptr_t stream) {
  TensorView rows = rows_view(rows_obj, "permuted_rows", nullptr);
  TensorView weights = tensor(weights_obj, "topk_weights", &rows, kFloat, "float32", false);
  if (weights.ndim != 2 || weights.strides[1] != 1) {
    kb::value_error("topk_weights must be 2-D [tokens, top_k] with unit column stride, got shape " +
                    weights.shape_str());
  }
  const int64_t T = weights.shape[0], k = weights.shape[1], n = T * k;
  TensorView src = tensor(src_obj, "src_idx", &rows, kInt32, "int32", true);
  if (src.numel() != n)
    kb::value_error("src_idx must hold tokens * top_k = " + str(n) + " entries, got " + src.shape_str());
  if (rows.shape[0] != n) {
    kb::value_error("permuted_rows.shape[0] must be tokens * top_k = " + str(n) + ", got " + str(rows.shape[0]));
  }
  TensorView inv = tensor(inv_obj, "inv", &rows, kInt32, "int32", true);
  if (inv.numel() != n) kb::value_error("inv must hold " + str(n) + " entries");
  TensorView out = rows_view(out_obj, "out", &rows);
  check_shape2(out, T, rows.shape[1], "[tokens, hidden]");
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, rows);
  km::UnpermuteParams p{};
  p.out = out.data, p.rows = rows.data, p.weights = static_cast<const float*>(weights.data);
  p.src_idx = static_cast<const int32_t*>(src.data), p.inv = static_cast<int32_t*>(inv.data);
  p.n = n, p.tokens = T, p.top_k = k, p.hidden_size = rows.shape[1];
  p.rows_stride = rows.strides[0], p.out_stride = out.strides[0], p.weight_stride = weights.strides[0];
  const kiln::LaunchContext ctx = kb::launch_context(rows, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::unpermute(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

// The scale mode of fp8 weights [E, rows, cols] from w_scale's shape: 1 per expert ([E]), 2 per
// 128 x 128 block ([E, srows, scols], srows and scols the rows and cols in blocks, rounded up).
int scale_mode_of(const TensorView& s, int64_t E, int64_t srows, int64_t scols) {
  if (s.ndim == 1 && s.shape[0] == E) return 1;
  if (s.ndim == 3 && s.shape[0] == E && s.shape[1] == srows && s.shape[2] == scols) return 2;
  kb::value_error("w_scale must be [" + str(E) + "] or [" + str(E) + ", " + str(srows) + ", " + str(scols) +
                  "] (128 x 128 blocks), got " + s.shape_str());
}

// One per-expert parameter of expert_act: float32 [E] (one per expert) or [1] (one for all).
const float* act_param(py::object obj, const char* name, const TensorView& ref, int64_t E, int64_t& stride) {
  stride = 0;
  if (obj.is_none()) return nullptr;
  TensorView t = tensor(obj, name, &ref, kFloat, "float32", true);
  if (t.numel() != E && t.numel() != 1) {
    kb::value_error(std::string(name) + " must hold one value per expert (" + str(E) + ") or one, got shape " +
                    t.shape_str());
  }
  stride = t.numel() == 1 ? 0 : 1;
  return static_cast<const float*>(t.data);
}

// expert_act's activation value (the module's expert_acts), checked.
km::ExpertAct expert_act_of(int act) {
  if (act < 0 || act >= km::kNumExpertActs) {
    kb::value_error("act must be in [0, " + str(km::kNumExpertActs) + ") (the module's expert_acts), got " + str(act));
  }
  return static_cast<km::ExpertAct>(act);
}

// p0..p2 and defaults of expert_act or experts' generic epilogue, against E experts.
template <typename P>
void set_act_params(P& p, py::object p0, py::object p1, py::object p2, py::tuple defaults, const TensorView& ref,
                    int64_t E) {
  if (defaults.size() != km::kExpertActParams) kb::value_error("defaults must hold 3 floats");
  py::object params[km::kExpertActParams] = {p0, p1, p2};
  const char* names[km::kExpertActParams] = {"p0", "p1", "p2"};
  for (int i = 0; i < km::kExpertActParams; ++i) {
    p.param[i] = act_param(params[i], names[i], ref, E, p.param_stride[i]);
    p.param_default[i] = defaults[i].cast<float>();
  }
}

// The bias of expert_act or the generic epilogue: [E, >= cols_needed] of the module's dtype, unit
// column stride; (data, row stride).
std::pair<const void*, int64_t> act_bias(py::object obj, const TensorView& ref, int64_t E, int64_t cols_needed,
                                         const char* what) {
  if (obj.is_none()) return {nullptr, 0};
  TensorView bias = tensor(obj, "bias", &ref, kDType, "the module's dtype", false);
  if (bias.ndim != 2 || bias.shape[0] != E || bias.strides[1] != 1 || bias.shape[1] < cols_needed) {
    kb::value_error("bias must be [experts = " + str(E) + ", >= " + str(cols_needed) + "] with unit column stride (" +
                    what + "), got " + bias.shape_str());
  }
  kb::check_element_aligned(bias, sizeof(Elem));
  return {bias.data, bias.strides[0]};
}

void experts(py::handle out_obj, py::handle x_obj, py::handle w_obj, py::handle offs_obj, bool gated, int act,
             int64_t gate_row0, int64_t up_row0, py::object scale_obj, int expert_act, py::object p0, py::object p1,
             py::object p2, py::tuple defaults, py::object bias_obj, uintptr_t errors, uintptr_t stream) {
  TensorView x = rows_view(x_obj, "x", nullptr);
  TensorView w = kb::view_of(w_obj, "w");
  kb::check_same_device(w, x);
  const bool fp8 = w.dtype == kFp8;
  if (!fp8) kb::check_dtype(w, kDType, "the dtype of x, or float8_e4m3fn");
  if (w.ndim != 3 || w.strides[2] != 1) {
    kb::value_error("w must be 3-D [experts, rows, depth] with unit stride along depth, got shape " + w.shape_str());
  }
  kb::check_element_aligned(w, fp8 ? 1 : sizeof(Elem));
  const int64_t E = w.shape[0], depth = x.shape[1];
  int scale_mode = 0;
  const float* scale = nullptr;
  const int64_t srows = (w.shape[1] + km::kScaleBlock - 1) / km::kScaleBlock;
  const int64_t scols = (depth + km::kScaleBlock - 1) / km::kScaleBlock;
  if (fp8 != !scale_obj.is_none()) kb::value_error("w_scale goes with fp8 e4m3 weights, and only with them");
  if (fp8) {
    TensorView s = tensor(scale_obj, "w_scale", &x, kFloat, "float32", true);
    scale_mode = scale_mode_of(s, E, srows, scols);
    scale = static_cast<const float*>(s.data);
  }
  if (w.shape[2] != depth) kb::value_error("w.shape[2] must be x.shape[1] (" + str(depth) + "), got " + w.shape_str());
  TensorView offs = tensor(offs_obj, "offs", &x, kInt32, "int32", true);
  if (offs.numel() != E)
    kb::value_error("offs must hold one entry per expert (" + str(E) + "), got " + offs.shape_str());
  TensorView out = rows_view(out_obj, "out", &x);
  if (out.ndim != 2 || out.shape[0] != x.shape[0]) {
    kb::value_error("out must be [x.shape[0] = " + str(x.shape[0]) + ", cols], got " + out.shape_str());
  }
  const int64_t cols = out.shape[1];
  const int64_t up0 = gated ? up_row0 : 0;
  if (gate_row0 < 0 || up0 < 0 || gate_row0 + cols > w.shape[1] || up0 + cols > w.shape[1]) {
    kb::value_error("the weight rows [gate_row0, +cols) and [up_row0, +cols) must lie in w's " + str(w.shape[1]) +
                    " rows (cols " + str(cols) + ", gate_row0 " + str(gate_row0) + ", up_row0 " + str(up0) + ")");
  }
  const bool generic = expert_act != -1;
  const auto a = static_cast<kiln::activation::Act>(act);
  if (generic) {
    const km::ExpertAct ea = expert_act_of(expert_act);
    if (gated != km::is_gated(ea)) {
      kb::value_error(std::string("gated must be ") + (km::is_gated(ea) ? "true" : "false") + " for expert_act " +
                      str(expert_act));
    }
  } else if (gated && a != kiln::activation::Act::kSilu && a != kiln::activation::Act::kGeluTanh) {
    kb::value_error("act must be silu or gelu_tanh, got " + str(act));
  } else if (!p0.is_none() || !p1.is_none() || !p2.is_none() || !bias_obj.is_none()) {
    kb::value_error("p0..p2 and bias go with expert_act (the generic epilogue), and only with it");
  }
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, x);
  kb::check_disjoint(out, w);
  km::ExpertsParams p{};
  p.out = out.data, p.x = x.data, p.w = w.data, p.offs = static_cast<const int32_t*>(offs.data);
  p.rows = x.shape[0], p.experts = E, p.cols = cols, p.depth = depth;
  p.x_stride = x.strides[0], p.out_stride = out.strides[0];
  p.w_expert_stride = w.strides[0], p.w_row_stride = w.strides[1];
  p.gate_row0 = gate_row0, p.up_row0 = up0, p.gated = gated, p.act = a;
  p.generic = generic;
  if (generic) {
    p.epi.act = static_cast<km::ExpertAct>(expert_act);
    set_act_params(p.epi, p0, p1, p2, defaults, x, E);
    const auto [bias, bias_stride] =
        act_bias(bias_obj, x, E, std::max(gate_row0, up0) + cols, "one row per expert, a column per weight row");
    p.epi.bias = bias, p.epi.bias_stride = bias_stride;
  }
  p.w_fp8 = fp8, p.scale_mode = scale_mode, p.w_scale = scale, p.scale_rows = srows, p.scale_cols = scols;
  const kiln::LaunchContext ctx = kb::launch_context(x, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::experts(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

// The fp8 weights w [E, rows, cols] (contiguous e4m3) times w_scale, into out (contiguous, the
// module's dtype, w's shape).
void dequant(py::handle out_obj, py::handle w_obj, py::handle scale_obj, uintptr_t stream) {
  TensorView w = tensor(w_obj, "w", nullptr, kFp8, "float8_e4m3fn", true);
  if (w.ndim != 3) kb::value_error("w must be 3-D [experts, rows, cols], got shape " + w.shape_str());
  TensorView out = tensor(out_obj, "out", &w, kDType, "the module's dtype", true);
  kb::check_same_shape(out, w);
  const int64_t E = w.shape[0];
  const int64_t srows = (w.shape[1] + km::kScaleBlock - 1) / km::kScaleBlock;
  const int64_t scols = (w.shape[2] + km::kScaleBlock - 1) / km::kScaleBlock;
  TensorView s = tensor(scale_obj, "w_scale", &w, kFloat, "float32", true);
  const int scale_mode = scale_mode_of(s, E, srows, scols);
  kb::check_disjoint(out, w);
  km::DequantParams p{};
  p.out = out.data, p.w = w.data, p.scale = static_cast<const float*>(s.data);
  p.experts = E, p.rows = w.shape[1], p.cols = w.shape[2];
  p.scale_mode = scale_mode, p.scale_rows = srows, p.scale_cols = scols;
  const kiln::LaunchContext ctx = kb::launch_context(w, stream, 0);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = km::dequant(p, ctx);
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
}

void expert_act(py::handle out_obj, py::handle in_obj, py::handle offs_obj, int act, int64_t gate_col0, int64_t up_col0,
                py::object p0, py::object p1, py::object p2, py::tuple defaults, py::object bias_obj,
                uintptr_t stream) {
  TensorView in = rows_view(in_obj, "input", nullptr);
  TensorView offs = tensor(offs_obj, "offs", &in, kInt32, "int32", true);
  const int64_t E = offs.numel(), rows = in.shape[0];
  if (E < 1) kb::value_error("offs must hold one entry per expert, got " + offs.shape_str());
  const km::ExpertAct a = expert_act_of(act);
  const bool gated = km::is_gated(a);
  TensorView out = rows_view(out_obj, "out", &in);
  if (out.shape[0] != rows) kb::value_error("out must have input's " + str(rows) + " rows, got " + out.shape_str());
  const int64_t cols = out.shape[1];
  const int64_t up0 = gated ? up_col0 : gate_col0;
  if (gate_col0 < 0 || up0 < 0 || gate_col0 + cols > in.shape[1] || up0 + cols > in.shape[1]) {
    kb::value_error("the input columns [gate_col0, +cols) and [up_col0, +cols) must lie in input's " +
                    str(in.shape[1]) + " columns (cols " + str(cols) + ", gate_col0 " + str(gate_col0) + ", up_col0 " +
                    str(up0) + ")");
  }
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, in);
  km::ExpertActParams p{};
  set_act_params(p, p0, p1, p2, defaults, in, E);
  const auto [bias, bias_stride] =
      act_bias(bias_obj, in, E, std::max(gate_col0, up0) + cols, "one row per expert, the input's columns");
  p.bias = bias, p.bias_stride = bias_stride;
  p.out = out.data, p.in = in.data, p.offs = static_cast<const int32_t*>(offs.data);
  p.rows = rows, p.experts = E, p.cols = cols, p.in_stride = in.strides[0], p.out_stride = out.strides[0];
  p.gate_col0 = gate_col0, p.up_col0 = up0, p.act = a;
  const kiln::LaunchContext ctx = kb::launch_context(in, stream, 0);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = km::expert_act(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:moe launcher for one dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.attr("max_experts") = km::kMaxExperts;
  py::dict scorings;
  scorings["softmax"] = static_cast<int>(km::Scoring::kSoftmax);
  scorings["sigmoid"] = static_cast<int>(km::Scoring::kSigmoid);
  m.attr("scorings") = scorings;
  m.attr("expert_rows_per_pass") = km::kExpertRowsPerPass;
  py::dict acts;
  acts["silu"] = static_cast<int>(kiln::activation::Act::kSilu);
  acts["gelu"] = static_cast<int>(kiln::activation::Act::kGeluTanh);  // fused_moe's "gelu": tanh
  m.attr("acts") = acts;
  py::dict expert_acts;  // expert_act's activations (moe.h ExpertAct)
  const std::pair<const char*, km::ExpertAct> table[] = {
      {"swiglu", km::ExpertAct::kSwiglu},
      {"swiglu_step", km::ExpertAct::kSwigluStep},
      {"geglu", km::ExpertAct::kGeglu},
      {"geglu_tanh", km::ExpertAct::kGegluTanh},
      {"situ", km::ExpertAct::kSitu},
      {"gelu", km::ExpertAct::kGelu},
      {"relu", km::ExpertAct::kRelu},
      {"silu", km::ExpertAct::kSilu},
      {"relu2", km::ExpertAct::kRelu2},
      {"identity", km::ExpertAct::kIdentity},
      {"clamped_relu2", km::ExpertAct::kClampedRelu2},
  };
  for (const auto& [name, a] : table) expert_acts[name] = static_cast<int>(a);
  m.attr("expert_acts") = expert_acts;
  kb::export_error_texts(m);
  m.def("topk", &topk, py::kw_only(), py::arg("weights"), py::arg("ids"), py::arg("logits"), py::arg("top_k"),
        py::arg("scoring"), py::arg("renormalize"), py::arg("num_groups"), py::arg("topk_group"),
        py::arg("bias") = py::none(), py::arg("scale") = 1.0, py::arg("errors") = 0, py::arg("stream") = 0,
        "routing: top-k experts per token and their weights");
  m.def("sort", &sort, py::kw_only(), py::arg("ids"), py::arg("num_experts"), py::arg("offs") = py::none(),
        py::arg("src_idx") = py::none(), py::arg("sorted_ids") = py::none(), py::arg("expert_ids") = py::none(),
        py::arg("num_post_pad") = py::none(), py::arg("block_size") = 0, py::arg("first_expert") = 0,
        py::arg("total_experts") = 0, py::arg("errors") = 0, py::arg("stream") = 0,
        "group the routed slots by expert (permute's rows, align's blocks)");
  m.def("gather", &gather, py::kw_only(), py::arg("out"), py::arg("hidden"), py::arg("src_idx"), py::arg("top_k"),
        py::arg("errors") = 0, py::arg("stream") = 0, "permuted[r] = hidden[src_idx[r] / top_k]");
  m.def("unpermute", &unpermute, py::kw_only(), py::arg("out"), py::arg("rows"), py::arg("weights"), py::arg("src_idx"),
        py::arg("inv"), py::arg("errors") = 0, py::arg("stream") = 0,
        "out[t] = sum_j weights[t, j] * rows[row of t*k+j]");
  m.def("experts", &experts, py::kw_only(), py::arg("out"), py::arg("x"), py::arg("w"), py::arg("offs"),
        py::arg("gated"), py::arg("act"), py::arg("gate_row0") = 0, py::arg("up_row0") = 0,
        py::arg("w_scale") = py::none(), py::arg("expert_act") = -1, py::arg("p0") = py::none(),
        py::arg("p1") = py::none(), py::arg("p2") = py::none(), py::arg("defaults") = py::make_tuple(0.0, 0.0, 0.0),
        py::arg("bias") = py::none(), py::arg("errors") = 0, py::arg("stream") = 0,
        "small-batch expert GEMM (gated: the up projection with its activation; expert_act: the generic one)");
  m.def("dequant", &dequant, py::kw_only(), py::arg("out"), py::arg("w"), py::arg("w_scale"), py::arg("stream") = 0,
        "fp8 e4m3 weights times their per-expert or 128 x 128 block scales, into the module's dtype");
  m.def("expert_act", &expert_act, py::kw_only(), py::arg("out"), py::arg("input"), py::arg("offs"), py::arg("act"),
        py::arg("gate_col0") = 0, py::arg("up_col0") = 0, py::arg("p0") = py::none(), py::arg("p1") = py::none(),
        py::arg("p2") = py::none(), py::arg("defaults") = py::make_tuple(0.0, 0.0, 0.0), py::arg("bias") = py::none(),
        py::arg("stream") = 0, "the activation between the projections, per expert (rows grouped by offs)");
}
