// //ops:sampling launcher: validates the tensors, prepares the parameters and calls the backend's
// entry points (ops/sampling/sampling.h) on the caller's stream. Compiled by the host compiler for
// both toolchains; only this layer knows Python. Arguments are keyword-only, but softmax_rows'
// (by position or keyword: its Python launcher passes them by position, as pybind11 matches each
// keyword by name on every call).
//
//   sample_rows(*, input, output, order, logits, indices=None, temperature=None, temperature_val=1,
//               top_k=None, top_k_val=0, top_p=None, top_p_val=1, min_p=None, min_p_val=0,
//               seed=0, offset=0, seeds=None, offsets=None, samples=None, out=None, errors=0, stream=0)
//   softmax_rows(logits, out, temperature=None, temperature_val=1, errors=0, stream=0)
//   chain_speculative(*, draft_probs, draft_token_ids, target_probs, out_ids, accepted, emitted,
//                     seed=0, offset=0, seeds=None, offsets=None, errors=0, stream=0)
//
// seeds / offsets: optional int64 [1] or [rows] tensors on the input's device, read by the kernel
// in place of seed / offset.
//
// input [rows_in, vocab]: float32 probabilities (output sample or probs) or logits of the module's
// dtype, contiguous in its last dimension, any row stride. indices [rows] int32/int64 (one input
// row per output row); the per-row parameters [rows] (temperature, top_p, min_p float32; top_k
// int32/int64), contiguous. samples [rows] int32/int64; out [rows, vocab] float32 (probs, softmax)
// or the input's dtype (masked logits), contiguous in its last dimension, disjoint from the input.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/sampling/sampling.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
namespace ks = kiln::sampling;
using kb::TensorView;
using kb::value_error;
using kb::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kb::dl_dtype<Elem>();
constexpr kiln::dl::DataType kInt32{kiln::dl::kInt, 32, 1};
constexpr kiln::dl::DataType kInt64{kiln::dl::kInt, 64, 1};

// An int32 or int64 tensor; true when it is int64.
bool int_dtype(const TensorView& t) {
  if (t.dtype != kInt32 && t.dtype != kInt64) {
    kb::type_error(t.name + ".dtype must be int32 or int64, got " + kb::dtype_str(t.dtype));
  }
  return t.dtype == kInt64;
}

// A 1-D contiguous tensor of `n` elements on ref's device.
TensorView vector_of(py::handle obj, const char* name, int64_t n, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, ref);
  if (t.ndim != 1 || t.size(0) != n) {
    value_error(std::string(name) + " must have shape [" + std::to_string(n) + "] (one value per row), got " +
                t.shape_str());
  }
  if (n > 1 && t.stride(0) != 1) value_error(std::string(name) + " must be contiguous; call .contiguous() first");
  return t;
}

// The random stream: the scalars, or int64 tensors of one value or one per row.
ks::Stream stream_of(uint64_t seed, uint64_t offset, py::handle seeds_obj, py::handle offsets_obj, int64_t rows,
                     const TensorView& ref) {
  ks::Stream s;
  s.seed = seed;
  s.offset = offset;
  auto array = [&](py::handle obj, const char* name, const int64_t** data, int64_t* len) {
    if (obj.is_none()) return;
    TensorView t = view_of(obj, name);
    kb::check_same_device(t, ref);
    kb::check_dtype(t, kInt64, "seeds and offsets are int64");
    if (t.ndim != 1 || (t.size(0) != 1 && t.size(0) != rows)) {
      value_error(std::string(name) + " must have shape [1] or [" + std::to_string(rows) + "], got " + t.shape_str());
    }
    if (t.size(0) > 1 && t.stride(0) != 1) value_error(std::string(name) + " must be contiguous");
    *data = static_cast<const int64_t*>(t.data);
    *len = t.size(0);
  };
  array(seeds_obj, "seed", &s.seeds, &s.seeds_len);
  array(offsets_obj, "offset", &s.offsets, &s.offsets_len);
  return s;
}

const float* float_vector(py::handle obj, const char* name, int64_t n, const TensorView& ref) {
  if (obj.is_none()) return nullptr;
  TensorView t = vector_of(obj, name, n, ref);
  kb::check_dtype(t, kb::dl_dtype<float>(), "one float32 value per row");
  return static_cast<const float*>(t.data);
}

// The input rows of a sample_rows / softmax_rows call, checked, as the parameters' first fields.
ks::RowParams input_rows(py::handle input_obj, bool logits, TensorView& input) {
  input = view_of(input_obj, logits ? "logits" : "probs");
  kb::check_backend_device(input);
  kb::check_dtype(input, kDType, std::string("this module is ") + kiln::spec::kUri);
  if (!logits && input.dtype != kb::dl_dtype<float>()) {
    kb::type_error("probs must be float32, got " + kb::dtype_str(input.dtype));
  }
  kb::check_ndim(input, 2, 2);
  kb::check_last_contiguous(input);
  kb::check_element_aligned(input, sizeof(Elem));
  ks::RowParams p{};
  p.input = input.data;
  p.rows_in = input.size(0);
  p.vocab = input.size(1);
  p.in_stride = input.stride(0);
  if (p.vocab < 1 || p.vocab > ks::kMaxVocab) {
    value_error(input.name + ".shape[1] (the vocabulary) must be in [1, " + std::to_string(ks::kMaxVocab) + "], got " +
                std::to_string(p.vocab));
  }
  p.rows = p.rows_in;
  p.logits = logits;
  return p;
}

// The [rows, vocab] output of the probs, masked-logits and softmax outputs, checked, into p.
void output_rows(ks::RowParams& p, py::handle out_obj, const TensorView& input) {
  TensorView out = view_of(out_obj, "out");
  kb::check_same_device(out, input);
  if (p.output == ks::Output::kMaskedLogits) {
    kb::check_dtype(out, kDType, "masked logits have the logits' dtype");
  } else {
    kb::check_dtype(out, kb::dl_dtype<float>(), "probabilities are float32");
  }
  kb::check_ndim(out, 2, 2);
  kb::check_dim(out, 0, p.rows, "the rows");
  kb::check_dim(out, 1, p.vocab, "the vocabulary");
  kb::check_last_contiguous(out);
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, input);
  p.out = out.data;
  p.out_stride = out.stride(0);
}

void launch(const ks::RowParams& p, const TensorView& input, uintptr_t stream, uintptr_t errors) {
  const kiln::LaunchContext ctx = kb::launch_context(input, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = ks::sample_rows(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

void sample_rows(py::handle input_obj, int output, int order, bool logits, py::handle indices_obj,
                 py::handle temperature_obj, double temperature_val, py::handle top_k_obj, int64_t top_k_val,
                 py::handle top_p_obj, double top_p_val, py::handle min_p_obj, double min_p_val, uint64_t seed,
                 uint64_t offset, py::handle seeds_obj, py::handle offsets_obj, py::handle samples_obj,
                 py::handle out_obj, uintptr_t errors, uintptr_t stream) {
  if (output < 0 || output > int(ks::Output::kSoftmax)) {
    value_error("output must be one of the exported `outputs`, got " + std::to_string(output));
  }
  if (order < 0 || order > int(ks::Order::kJoint)) {
    value_error("order must be one of the exported `orders`, got " + std::to_string(order));
  }
  const ks::Output out_kind = static_cast<ks::Output>(output);
  TensorView input;
  ks::RowParams p = input_rows(input_obj, logits, input);
  if (logits != (out_kind == ks::Output::kMaskedLogits || out_kind == ks::Output::kSoftmax) &&
      out_kind != ks::Output::kSample) {
    value_error("output " + std::to_string(output) + " does not take " + (logits ? "logits" : "probabilities"));
  }
  if (!indices_obj.is_none()) {
    TensorView idx = view_of(indices_obj, "indices");
    kb::check_same_device(idx, input);
    p.indices64 = int_dtype(idx);
    kb::check_ndim(idx, 1, 1);
    if (idx.size(0) > 1 && idx.stride(0) != 1) value_error("indices must be contiguous; call .contiguous() first");
    p.indices = idx.data;
    p.rows = idx.size(0);
  }
  p.output = out_kind;
  p.order = static_cast<ks::Order>(order);
  p.temperature = float_vector(temperature_obj, "temperature", p.rows, input);
  p.temperature_val = float(temperature_val);
  if (!top_k_obj.is_none()) {
    TensorView t = vector_of(top_k_obj, "top_k", p.rows, input);
    p.top_k64 = int_dtype(t);
    p.top_k = t.data;
  }
  p.top_k_val = top_k_val;
  p.top_p = float_vector(top_p_obj, "top_p", p.rows, input);
  p.top_p_val = float(top_p_val);
  p.min_p = float_vector(min_p_obj, "min_p", p.rows, input);
  p.min_p_val = float(min_p_val);
  p.rng = stream_of(seed, offset, seeds_obj, offsets_obj, p.rows, input);
  if (out_kind == ks::Output::kSample) {
    TensorView s = vector_of(samples_obj, "samples", p.rows, input);
    p.samples64 = int_dtype(s);
    kb::check_disjoint(s, input);
    p.samples = s.data;
  } else {
    output_rows(p, out_obj, input);
  }
  launch(p, input, stream, errors);
}

// softmax_rows: sample_rows(output=softmax) with only the arguments a softmax has. Its own entry
// because pybind11's keyword matching grows with the declared arguments (21 cost ~4 us a call, 6
// under 1 us), and softmax is called once per decode step.
void softmax_rows(py::handle logits_obj, py::handle out_obj, py::handle temperature_obj, double temperature_val,
                  uintptr_t errors, uintptr_t stream) {
  TensorView input;
  ks::RowParams p = input_rows(logits_obj, true, input);
  p.output = ks::Output::kSoftmax;
  p.temperature = float_vector(temperature_obj, "temperature", p.rows, input);
  p.temperature_val = float(temperature_val);
  p.top_p_val = 1.0f;  // sample_rows' defaults for the filters a softmax does not apply
  output_rows(p, out_obj, input);
  launch(p, input, stream, errors);
}

void chain_speculative(py::handle draft_obj, py::handle ids_obj, py::handle target_obj, py::handle out_obj,
                       py::handle accepted_obj, py::handle emitted_obj, uint64_t seed, uint64_t offset,
                       py::handle seeds_obj, py::handle offsets_obj, uintptr_t errors, uintptr_t stream) {
  if (kDType != kb::dl_dtype<float>()) value_error("chain_speculative runs in the float32 module");
  TensorView draft = view_of(draft_obj, "draft_probs");
  kb::check_backend_device(draft);
  kb::check_dtype(draft, kb::dl_dtype<float>(), "probabilities are float32");
  kb::check_ndim(draft, 3, 3);
  kb::check_last_contiguous(draft);
  TensorView target = view_of(target_obj, "target_probs");
  kb::check_same_device(target, draft);
  kb::check_dtype(target, kb::dl_dtype<float>(), "probabilities are float32");
  kb::check_ndim(target, 3, 3);
  kb::check_last_contiguous(target);
  const int64_t batch = draft.size(0), n = draft.size(1), vocab = draft.size(2);
  kb::check_dim(target, 0, batch, "draft_probs.shape[0]");
  kb::check_dim(target, 1, n + 1, "draft_probs.shape[1] + 1");
  kb::check_dim(target, 2, vocab, "draft_probs.shape[2]");
  if (vocab < 1 || vocab > ks::kMaxVocab) {
    value_error("the vocabulary (draft_probs.shape[2]) must be in [1, " + std::to_string(ks::kMaxVocab) + "], got " +
                std::to_string(vocab));
  }
  TensorView ids = view_of(ids_obj, "draft_token_ids");
  kb::check_same_device(ids, draft);
  const bool ids64 = int_dtype(ids);
  kb::check_ndim(ids, 2, 2);
  kb::check_dim(ids, 0, batch, "draft_probs.shape[0]");
  kb::check_dim(ids, 1, n, "draft_probs.shape[1]");
  kb::check_last_contiguous(ids);
  TensorView out = view_of(out_obj, "output_token_ids");
  kb::check_same_device(out, draft);
  kb::check_dtype(out, kInt32, "token ids are int32");
  kb::check_ndim(out, 2, 2);
  kb::check_dim(out, 0, batch, "the batch");
  kb::check_dim(out, 1, n + 1, "num_speculate_tokens + 1");
  if (batch > 0 && (out.stride(1) != 1 || (batch > 1 && out.stride(0) != n + 1))) {
    value_error("output_token_ids must be contiguous");
  }
  TensorView acc = vector_of(accepted_obj, "output_accepted_token_num", batch, draft);
  kb::check_dtype(acc, kInt32, "counts are int32");
  TensorView emi = vector_of(emitted_obj, "output_emitted_draft_token_num", batch, draft);
  kb::check_dtype(emi, kInt32, "counts are int32");
  kb::check_disjoint(acc, emi);
  kb::check_disjoint(out, acc);
  kb::check_disjoint(out, emi);
  ks::SpecParams p{};
  p.draft_probs = static_cast<const float*>(draft.data);
  p.draft_ids = ids.data;
  p.draft_ids64 = ids64;
  p.target_probs = static_cast<const float*>(target.data);
  p.batch = batch;
  p.n = n;
  p.vocab = vocab;
  p.draft_stride_b = draft.stride(0);
  p.draft_stride_n = draft.stride(1);
  p.target_stride_b = target.stride(0);
  p.target_stride_n = target.stride(1);
  p.ids_stride_b = ids.stride(0);
  p.rng = stream_of(seed, offset, seeds_obj, offsets_obj, batch, draft);
  p.out_ids = static_cast<int32_t*>(out.data);
  p.accepted = static_cast<int32_t*>(acc.data);
  p.emitted = static_cast<int32_t*>(emi.data);
  const kiln::LaunchContext ctx = kb::launch_context(draft, stream, errors);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = ks::chain_speculative(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:sampling launcher for one input dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  py::dict outputs, orders;
  outputs["sample"] = int(ks::Output::kSample);
  outputs["probs"] = int(ks::Output::kProbs);
  outputs["masked_logits"] = int(ks::Output::kMaskedLogits);
  outputs["softmax"] = int(ks::Output::kSoftmax);
  orders["top_k_first"] = int(ks::Order::kTopKFirst);
  orders["joint"] = int(ks::Order::kJoint);
  m.attr("outputs") = outputs;
  m.attr("orders") = orders;
  m.attr("max_vocab") = ks::kMaxVocab;
  m.attr("threads") = ks::kThreads;
  kb::export_error_texts(m);
  m.def("sample_rows", &sample_rows, py::kw_only(), py::arg("input"), py::arg("output"), py::arg("order"),
        py::arg("logits"), py::arg("indices") = py::none(), py::arg("temperature") = py::none(),
        py::arg("temperature_val") = 1.0, py::arg("top_k") = py::none(), py::arg("top_k_val") = 0,
        py::arg("top_p") = py::none(), py::arg("top_p_val") = 1.0, py::arg("min_p") = py::none(),
        py::arg("min_p_val") = 0.0, py::arg("seed") = 0, py::arg("offset") = 0, py::arg("seeds") = py::none(),
        py::arg("offsets") = py::none(), py::arg("samples") = py::none(), py::arg("out") = py::none(),
        py::arg("errors") = 0, py::arg("stream") = 0,
        "filters (top-k, top-p, min-p) and then a draw, the renormalised probabilities, the masked logits or the "
        "softmax of each row");
  m.def("softmax_rows", &softmax_rows, py::arg("logits"), py::arg("out"), py::arg("temperature") = py::none(),
        py::arg("temperature_val") = 1.0, py::arg("errors") = 0, py::arg("stream") = 0,
        "softmax(logits / temperature) of each row in float32 (sample_rows' softmax output, fewer arguments)");
  m.def("chain_speculative", &chain_speculative, py::kw_only(), py::arg("draft_probs"), py::arg("draft_token_ids"),
        py::arg("target_probs"), py::arg("out_ids"), py::arg("accepted"), py::arg("emitted"), py::arg("seed") = 0,
        py::arg("offset") = 0, py::arg("seeds") = py::none(), py::arg("offsets") = py::none(), py::arg("errors") = 0,
        py::arg("stream") = 0,
        "chain speculative sampling: accept each draft token with probability min(1, q / p), resample the first "
        "rejected from max(q - p, 0), or draw the bonus token from q");
}
