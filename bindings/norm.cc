// //ops:norm launcher: validates the tensors, prepares NormParams, and calls the backend's entry
// point (ops/norm/norm.h) on the caller's stream. Compiled by the host compiler for both
// toolchains; only this layer knows Python. Arguments by position or keyword, in the order below:
// the Python launcher passes them by position (pybind11 matches each keyword by name, about 0.1 us
// an argument on every call).
//
//   rmsnorm(out, input, weight, eps, weight_offset, pdl=False, stream=0)
//   fused_add_rmsnorm(input, residual, weight, eps, weight_offset, pdl=False, stream=0)
//   layernorm(out, input, gemma, beta, eps, stream=0)
//   rmsnorm_quant(out, input, weight, scale, scale_value, eps, pdl=False, stream=0)
//   fused_add_rmsnorm_quant(out, input, residual, weight, scale, scale_value, eps, pdl=False, stream=0)
//   layernorm_quant(out, input, gemma, beta, scale, scale_value, eps, stream=0)
//
// input/out/residual: [rows, hidden] or [batch, seq, hidden], last dimension contiguous, leading
// strides free; weight: [hidden], contiguous; all of the module's dtype and on one device.
// LayerNorm's gemma and beta: [hidden], contiguous, float32 whatever the module's dtype.
// The *_quant ops: out of input's shape, float8_e4m3fn or float8_e5m2; scale a one-element
// float32 tensor on input's device, or None (then scale_value, finite and nonzero, is the scale).
// pdl: launch with programmatic dependent launch (the caller resolved it: sm90+ CUDA only).
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/norm/norm.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
using kiln::bindings::TensorView;
using kiln::bindings::value_error;
using kiln::bindings::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kiln::bindings::dl_dtype<Elem>();

// The row view of a 2-D or 3-D tensor: [d0, d1, cols] with strides s0, s1 (elements).
struct Rows {
  int64_t d0, d1, cols, s0, s1;
};

Rows rows_of(const TensorView& t) {
  if (t.ndim == 2) return {1, t.size(0), t.size(1), 0, t.stride(0)};
  return {t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1)};
}

void check_rows(const TensorView& t, const TensorView& input) {
  if (&t != &input) {
    kiln::bindings::check_same_device(t, input);
    kiln::bindings::check_dtype(t, kDType, "the dtype of input");
    kiln::bindings::check_same_shape(t, input);
  }
  kiln::bindings::check_last_contiguous(t);
  kiln::bindings::check_element_aligned(t, sizeof(Elem));
}

TensorView checked_input(py::handle obj) {
  TensorView input = view_of(obj, "input");
  kiln::bindings::check_backend_device(input);
  kiln::bindings::check_dtype(input, kDType, std::string("this module is ") + kiln::spec::kUri);
  kiln::bindings::check_ndim(input, 2, 3);
  if (input.numel() > 0 && input.size(-1) < 1) value_error("input has hidden size 0");
  check_rows(input, input);
  return input;
}

TensorView checked_weight(py::handle obj, const TensorView& input) {
  TensorView weight = view_of(obj, "weight");
  kiln::bindings::check_same_device(weight, input);
  kiln::bindings::check_dtype(weight, kDType, "the dtype of input");
  kiln::bindings::check_ndim(weight, 1, 1);
  kiln::bindings::check_dim(weight, 0, input.size(-1), "input.shape[-1]");
  kiln::bindings::check_last_contiguous(weight);
  kiln::bindings::check_element_aligned(weight, sizeof(Elem));
  return weight;
}

void check_eps(double eps) {
  if (!std::isfinite(eps) || eps < 0) value_error("eps must be finite and >= 0, got " + std::to_string(eps));
}

// `out` is `input` itself (in place: same elements, same strides) or shares no byte with it.
bool same_view(const TensorView& a, const TensorView& b) {
  bool same = a.data == b.data && a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i] && a.strides[i] == b.strides[i];
  return same;
}

void raise_if_failed(const kiln::Status& s) {
  kiln::bindings::raise_if_failed(s, kiln::spec::kUri);
}

// The fp8 `out` of a *_quant op: input's shape, written (so no internal overlap, and no byte shared
// with the tensors read); its format from its dtype.
kiln::norm::Fp8Format checked_fp8_out(const TensorView& out, const TensorView& input) {
  kiln::bindings::check_same_device(out, input);
  kiln::norm::Fp8Format format;
  if (out.dtype == kiln::bindings::dl_dtype<kiln::e4m3_t>()) {
    format = kiln::norm::Fp8Format::kE4M3;
  } else if (out.dtype == kiln::bindings::dl_dtype<kiln::e5m2_t>()) {
    format = kiln::norm::Fp8Format::kE5M2;
  } else {
    kiln::bindings::type_error("out.dtype must be float8_e4m3fn or float8_e5m2 (the quantised output), got " +
                               kiln::bindings::dtype_str(out.dtype));
  }
  kiln::bindings::check_same_shape(out, input);
  kiln::bindings::check_last_contiguous(out);
  kiln::bindings::check_no_internal_overlap(out);
  kiln::bindings::check_disjoint(out, input);
  return format;
}

// The fp8 format and scale of a *_quant op: the scale a one-element float32 tensor on input's
// device (read by the kernel), or None and a finite, nonzero scale_value.
kiln::norm::QuantArgs checked_quant(const TensorView& out, py::handle scale_obj, double scale_value,
                                    const TensorView& input) {
  const kiln::norm::Fp8Format format = checked_fp8_out(out, input);
  if (scale_obj.is_none()) {
    if (!std::isfinite(scale_value) || scale_value == 0.0) {
      value_error("scale must be finite and nonzero, got " + std::to_string(scale_value));
    }
    return {format, nullptr, static_cast<float>(scale_value)};
  }
  const TensorView scale = view_of(scale_obj, "scale");
  kiln::bindings::check_same_device(scale, input);
  kiln::bindings::check_dtype(scale, kiln::bindings::dl_dtype<float>(), "the scale is float32");
  if (scale.numel() != 1) value_error("scale must hold one element, got shape " + scale.shape_str());
  kiln::bindings::check_element_aligned(scale, sizeof(float));
  kiln::bindings::check_disjoint(out, scale);  // every block reads it while others write out
  return {format, static_cast<const float*>(scale.data), 1.0f};
}

kiln::norm::NormParams params(const TensorView& out, const TensorView& input, const TensorView* residual,
                              const TensorView& weight, double eps, double weight_offset) {
  const Rows o = rows_of(out), i = rows_of(input);
  kiln::norm::NormParams p{};
  p.out = out.data;
  p.input = input.data;
  p.weight = weight.data;
  p.d0 = i.d0;
  p.d1 = i.d1;
  p.cols = i.cols;
  p.out_stride0 = o.s0;
  p.out_stride1 = o.s1;
  p.in_stride0 = i.s0;
  p.in_stride1 = i.s1;
  if (residual) {
    const Rows r = rows_of(*residual);
    p.residual = residual->data;
    p.res_stride0 = r.s0;
    p.res_stride1 = r.s1;
  }
  p.eps = static_cast<float>(eps);
  p.weight_offset = static_cast<float>(weight_offset);
  return p;
}

kiln::LaunchContext context(const TensorView& input, uintptr_t stream, bool pdl = false) {
  return kiln::bindings::launch_context(input, stream, 0, pdl);
}

void rmsnorm(py::handle out_obj, py::handle input_obj, py::handle weight_obj, double eps, double weight_offset,
             bool pdl, uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  TensorView out = view_of(out_obj, "out");
  check_rows(out, input);
  kiln::bindings::check_no_internal_overlap(out);
  if (!same_view(out, input)) kiln::bindings::check_disjoint(out, input);
  const TensorView weight = checked_weight(weight_obj, input);
  check_eps(eps);
  const auto p = params(out, input, nullptr, weight, eps, weight_offset);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::rmsnorm(p, context(input, stream, pdl));
  }
  raise_if_failed(s);
}

void fused_add_rmsnorm(py::handle input_obj, py::handle residual_obj, py::handle weight_obj, double eps,
                       double weight_offset, bool pdl, uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  TensorView residual = view_of(residual_obj, "residual");
  check_rows(residual, input);
  // Both are written: neither may write one element twice (a stride-0, expanded residual), and
  // they must not overlap each other.
  kiln::bindings::check_no_internal_overlap(input);
  kiln::bindings::check_no_internal_overlap(residual);
  kiln::bindings::check_disjoint(input, residual);
  const TensorView weight = checked_weight(weight_obj, input);
  check_eps(eps);
  const auto p = params(input, input, &residual, weight, eps, weight_offset);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::fused_add_rmsnorm(p, context(input, stream, pdl));
  }
  raise_if_failed(s);
}

void rmsnorm_quant(py::handle out_obj, py::handle input_obj, py::handle weight_obj, py::handle scale_obj,
                   double scale_value, double eps, bool pdl, uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  const TensorView out = view_of(out_obj, "out");
  const TensorView weight = checked_weight(weight_obj, input);
  const kiln::norm::QuantArgs quant = checked_quant(out, scale_obj, scale_value, input);
  check_eps(eps);
  const kiln::norm::QuantNormParams p{params(out, input, nullptr, weight, eps, 0.0), quant};
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::rmsnorm_quant(p, context(input, stream, pdl));
  }
  raise_if_failed(s);
}

void fused_add_rmsnorm_quant(py::handle out_obj, py::handle input_obj, py::handle residual_obj, py::handle weight_obj,
                             py::handle scale_obj, double scale_value, double eps, bool pdl, uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  TensorView residual = view_of(residual_obj, "residual");
  check_rows(residual, input);
  kiln::bindings::check_no_internal_overlap(residual);
  kiln::bindings::check_disjoint(input, residual);
  const TensorView out = view_of(out_obj, "out");
  const kiln::norm::QuantArgs quant = checked_quant(out, scale_obj, scale_value, input);
  kiln::bindings::check_disjoint(out, residual);
  const TensorView weight = checked_weight(weight_obj, input);
  check_eps(eps);
  const kiln::norm::QuantNormParams p{params(out, input, &residual, weight, eps, 0.0), quant};
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::fused_add_rmsnorm_quant(p, context(input, stream, pdl));
  }
  raise_if_failed(s);
}

TensorView checked_f32_param(py::handle obj, const char* name, const TensorView& input) {
  TensorView t = view_of(obj, name);
  kiln::bindings::check_same_device(t, input);
  kiln::bindings::check_dtype(t, kiln::bindings::dl_dtype<float>(), "LayerNorm's parameters are float32");
  kiln::bindings::check_ndim(t, 1, 1);
  kiln::bindings::check_dim(t, 0, input.size(-1), "input.shape[-1]");
  kiln::bindings::check_last_contiguous(t);
  kiln::bindings::check_element_aligned(t, sizeof(float));
  return t;
}

kiln::norm::LayerNormParams layernorm_params(const TensorView& out, const TensorView& input, const TensorView& gemma,
                                             const TensorView& beta, double eps) {
  const Rows o = rows_of(out), i = rows_of(input);
  kiln::norm::LayerNormParams p{};
  p.out = out.data;
  p.input = input.data;
  p.gamma = static_cast<const float*>(gemma.data);
  p.beta = static_cast<const float*>(beta.data);
  p.d0 = i.d0;
  p.d1 = i.d1;
  p.cols = i.cols;
  p.out_stride0 = o.s0;
  p.out_stride1 = o.s1;
  p.in_stride0 = i.s0;
  p.in_stride1 = i.s1;
  p.eps = static_cast<float>(eps);
  return p;
}

void layernorm(py::handle out_obj, py::handle input_obj, py::handle gemma_obj, py::handle beta_obj, double eps,
               uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  TensorView out = view_of(out_obj, "out");
  check_rows(out, input);
  kiln::bindings::check_no_internal_overlap(out);
  if (!same_view(out, input)) kiln::bindings::check_disjoint(out, input);
  const TensorView gemma = checked_f32_param(gemma_obj, "gemma", input);
  const TensorView beta = checked_f32_param(beta_obj, "beta", input);
  check_eps(eps);
  const auto p = layernorm_params(out, input, gemma, beta, eps);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::layernorm(p, context(input, stream));
  }
  raise_if_failed(s);
}

void layernorm_quant(py::handle out_obj, py::handle input_obj, py::handle gemma_obj, py::handle beta_obj,
                     py::handle scale_obj, double scale_value, double eps, uintptr_t stream) {
  const TensorView input = checked_input(input_obj);
  const TensorView out = view_of(out_obj, "out");
  const TensorView gemma = checked_f32_param(gemma_obj, "gemma", input);
  const TensorView beta = checked_f32_param(beta_obj, "beta", input);
  const kiln::norm::QuantArgs quant = checked_quant(out, scale_obj, scale_value, input);
  check_eps(eps);
  const kiln::norm::QuantLayerNormParams p{layernorm_params(out, input, gemma, beta, eps), quant};
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::norm::layernorm_quant(p, context(input, stream));
  }
  raise_if_failed(s);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:norm launcher for one dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.def("rmsnorm", &rmsnorm, py::arg("out"), py::arg("input"), py::arg("weight"), py::arg("eps"),
        py::arg("weight_offset"), py::arg("pdl") = false, py::arg("stream") = 0,
        "out = input * rsqrt(mean(input^2, -1) + eps) * (weight + weight_offset)");
  m.def("fused_add_rmsnorm", &fused_add_rmsnorm, py::arg("input"), py::arg("residual"), py::arg("weight"),
        py::arg("eps"), py::arg("weight_offset"), py::arg("pdl") = false, py::arg("stream") = 0,
        "residual += input; input = rmsnorm(residual) (in place)");
  m.def("layernorm", &layernorm, py::arg("out"), py::arg("input"), py::arg("gemma"), py::arg("beta"), py::arg("eps"),
        py::arg("stream") = 0, "out = (input - mean) * rsqrt(var + eps) * gemma + beta");
  m.def("rmsnorm_quant", &rmsnorm_quant, py::arg("out"), py::arg("input"), py::arg("weight"), py::arg("scale"),
        py::arg("scale_value"), py::arg("eps"), py::arg("pdl") = false, py::arg("stream") = 0,
        "out = fp8(rmsnorm(input) / scale)");
  m.def("fused_add_rmsnorm_quant", &fused_add_rmsnorm_quant, py::arg("out"), py::arg("input"), py::arg("residual"),
        py::arg("weight"), py::arg("scale"), py::arg("scale_value"), py::arg("eps"), py::arg("pdl") = false,
        py::arg("stream") = 0, "residual += input; out = fp8(rmsnorm(residual) / scale)");
  m.def("layernorm_quant", &layernorm_quant, py::arg("out"), py::arg("input"), py::arg("gemma"), py::arg("beta"),
        py::arg("scale"), py::arg("scale_value"), py::arg("eps"), py::arg("stream") = 0,
        "out = fp8(layernorm(input) / scale)");
}
