// //ops:quantization launcher: validates the tensors, prepares the parameters and calls the
// backend's entry points (ops/quantization/quantization.h) on the caller's stream. Compiled by the
// host compiler for both toolchains; only this layer knows Python. Arguments are keyword-only.
//
//   per_token_group_quant(*, out, scales, input, group_size, stream=0)
//   scaled_fp8_quant(*, out, scale, input, dynamic, stream=0)
//
// input [..., cols] of the module's dtype, contiguous in its last dimension, its leading
// dimensions folding into one row stride; out: input's shape, float8_e4m3fn or a uint8 view of
// one (torch builds whose DLPack export has no fp8 codes), same rules. scales: [..., cols /
// group_size] float32 with any strides (row- or column-major); scale: [1] float32.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common/entry.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/quantization/quantization.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using kb::TensorView;
using kb::value_error;
using kb::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kb::dl_dtype<Elem>();
constexpr kiln::dl::DataType kUInt8{kiln::dl::kUInt, 8, 1};

struct Rows {
  TensorView input, out;
  int64_t rows, cols;
};

Rows checked_rows(py::handle input_obj, py::handle out_obj) {
  Rows r{view_of(input_obj, "input"), view_of(out_obj, "out"), 0, 0};
  const TensorView &input = r.input, &out = r.out;
  kb::check_backend_device(input);
  kb::check_dtype(input, kDType, std::string("this module is ") + kiln::spec::kUri);
  if (input.ndim < 1) value_error("input must have at least 1 dimension, got a scalar");
  kb::check_last_contiguous(input);
  kb::check_element_aligned(input, sizeof(Elem));
  kb::check_same_device(out, input);
  if (out.dtype != kb::dl_dtype<kiln::e4m3_t>() && out.dtype != kUInt8) {
    kb::type_error("out.dtype must be float8_e4m3fn (or a uint8 view of it), got " + kb::dtype_str(out.dtype));
  }
  kb::check_same_shape(out, input);
  kb::check_last_contiguous(out);
  kb::check_no_internal_overlap(out);
  kb::check_disjoint(out, input);
  r.cols = input.size(-1);
  r.rows = r.cols > 0 ? input.numel() / r.cols : 0;
  return r;
}

kiln::LaunchContext context(const TensorView& t, uintptr_t stream) {
  return {reinterpret_cast<void*>(stream), t.device.device_type == kiln::dl::kCPU ? -1 : t.device.device_id};
}

void raise_if_failed(const kiln::Status& s) {
  if (!s.ok()) throw std::runtime_error("kiln " + std::string(kiln::spec::kUri) + ": " + s.message);
}

void per_token_group_quant(py::handle out_obj, py::handle scales_obj, py::handle input_obj, int64_t group_size,
                           uintptr_t stream) {
  const Rows r = checked_rows(input_obj, out_obj);
  if (group_size <= 0 || r.cols % group_size != 0) {
    value_error("group_size must be > 0 and divide input.shape[-1] (" + std::to_string(r.cols) + "), got " +
                std::to_string(group_size));
  }
  TensorView scales = view_of(scales_obj, "scales");
  kb::check_same_device(scales, r.input);
  kb::check_dtype(scales, kb::dl_dtype<float>(), "scales are float32");
  bool shape_ok = scales.ndim == r.input.ndim && scales.size(-1) == r.cols / group_size;
  for (int i = 0; shape_ok && i + 1 < r.input.ndim; ++i) shape_ok = scales.shape[i] == r.input.shape[i];
  if (!shape_ok) {
    value_error("scales.shape must be input.shape[:-1] + [input.shape[-1] / group_size = " +
                std::to_string(r.cols / group_size) + "], got " + scales.shape_str());
  }
  kb::check_no_internal_overlap(scales);
  kb::check_element_aligned(scales, sizeof(float));
  // Scales of 2-D input are [rows, groups] with any two strides; more leading dimensions must fold.
  const int64_t srow = scales.ndim == 2 ? scales.stride(0) : kiln::bindings::folded_row_stride(scales);
  kb::check_disjoint(scales, r.out);
  kb::check_disjoint(scales, r.input);
  kiln::quantization::GroupQuantParams p{};
  p.out = r.out.data;
  p.scales = static_cast<float*>(scales.data);
  p.input = r.input.data;
  p.rows = r.rows;
  p.cols = r.cols;
  p.group_size = group_size;
  p.in_stride = kiln::bindings::folded_row_stride(r.input);
  p.out_stride = kiln::bindings::folded_row_stride(r.out);
  p.scale_stride_row = srow;
  p.scale_stride_group = scales.stride(-1);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::quantization::per_token_group_quant(p, context(r.input, stream));
  }
  raise_if_failed(s);
}

void scaled_fp8_quant(py::handle out_obj, py::handle scale_obj, py::handle input_obj, bool dynamic, uintptr_t stream) {
  const Rows r = checked_rows(input_obj, out_obj);
  TensorView scale = view_of(scale_obj, "scale");
  kb::check_same_device(scale, r.input);
  kb::check_dtype(scale, kb::dl_dtype<float>(), "the scale is float32");
  if (scale.numel() != 1) value_error("scale must hold one element, got shape " + scale.shape_str());
  kb::check_element_aligned(scale, sizeof(float));
  if (dynamic) {  // written
    kb::check_disjoint(scale, r.out);
    kb::check_disjoint(scale, r.input);
  }
  kiln::quantization::TensorQuantParams p{};
  p.out = r.out.data;
  p.scale = static_cast<float*>(scale.data);
  p.input = r.input.data;
  p.rows = r.rows;
  p.cols = r.cols;
  p.in_stride = kiln::bindings::folded_row_stride(r.input);
  p.out_stride = kiln::bindings::folded_row_stride(r.out);
  p.dynamic = dynamic;
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::quantization::scaled_fp8_quant(p, context(r.input, stream));
  }
  raise_if_failed(s);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:quantization launcher for one input dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.attr("fp8_max") = kiln::quantization::kE4M3Max;
  m.def("per_token_group_quant", &per_token_group_quant, py::kw_only(), py::arg("out"), py::arg("scales"),
        py::arg("input"), py::arg("group_size"), py::arg("stream") = 0,
        "out = e4m3(input / scale), scale = absmax(group) / 448 per group of group_size columns");
  m.def("scaled_fp8_quant", &scaled_fp8_quant, py::kw_only(), py::arg("out"), py::arg("scale"), py::arg("input"),
        py::arg("dynamic"), py::arg("stream") = 0,
        "out = e4m3(input / scale); dynamic: scale = absmax(input) / 448 written first");
}
