// //ops:activation launcher: validates the tensors, prepares ActParams and calls the backend's entry
// point (ops/activation/activation.h) on the caller's stream. Compiled by the host compiler for both
// toolchains; only this layer knows Python. Arguments by position or keyword, in the order below:
// the Python launcher passes them by position (pybind11 matches each keyword by name, about 0.1 us
// an argument on every call).
//
//   act_and_mul(out, input, act, pdl=False, stream=0)   act: the values of the exported `acts` dict
//
// pdl: launch with programmatic dependent launch (the caller resolved it: sm90+ CUDA only).
//
// input [..., 2d] and out [..., d] of the module's dtype, on one device, each contiguous in its last
// dimension; the leading dimensions of each must fold into one row stride (any row stride).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/activation/activation.h"
#include "ops/common/dtypes.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
using kiln::bindings::TensorView;
using kiln::bindings::value_error;
using kiln::bindings::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kiln::bindings::dl_dtype<Elem>();

// The stride between consecutive rows once the leading dimensions are folded into one; an error
// when they do not fold (a row stride that changes from one leading index to the next).
int64_t row_stride(const TensorView& t) {
  int64_t stride = 0, span = -1;  // span: elements one step of the folded index covers so far
  for (int i = t.ndim - 2; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (span < 0) {
      stride = t.strides[i];
      span = t.strides[i] * t.shape[i];
    } else if (t.strides[i] != span) {
      value_error(t.name + "'s leading dimensions must fold into one row stride (shape " + t.shape_str() + ", stride " +
                  std::to_string(t.strides[i]) + " in dimension " + std::to_string(i) + ", expected " +
                  std::to_string(span) + "); call .contiguous() first");
    } else {
      span *= t.shape[i];
    }
  }
  return stride;
}

void act_and_mul(py::handle out_obj, py::handle input_obj, int act, bool pdl, uintptr_t stream) {
  TensorView input = view_of(input_obj, "input");
  kiln::bindings::check_backend_device(input);
  kiln::bindings::check_dtype(input, kDType, std::string("this module is ") + kiln::spec::kUri);
  if (input.ndim < 1) value_error("input must have at least 1 dimension, got a scalar");
  if (input.size(-1) % 2 != 0) {
    value_error("input.shape[-1] must be even (2 * d), got " + std::to_string(input.size(-1)) + " (shape " +
                input.shape_str() + ")");
  }
  kiln::bindings::check_last_contiguous(input);
  kiln::bindings::check_element_aligned(input, sizeof(Elem));
  TensorView out = view_of(out_obj, "out");
  kiln::bindings::check_same_device(out, input);
  kiln::bindings::check_dtype(out, kDType, "the dtype of input");
  bool shape_ok = out.ndim == input.ndim && out.size(-1) * 2 == input.size(-1);
  for (int i = 0; shape_ok && i + 1 < input.ndim; ++i) shape_ok = out.shape[i] == input.shape[i];
  if (!shape_ok) {
    std::string want = "[";
    for (int i = 0; i + 1 < input.ndim; ++i) want += std::to_string(input.shape[i]) + ", ";
    want += std::to_string(input.size(-1) / 2) + "]";
    value_error("out.shape must be " + want + " (input.shape[:-1] + [input.shape[-1] / 2]), got " + out.shape_str());
  }
  kiln::bindings::check_last_contiguous(out);
  kiln::bindings::check_element_aligned(out, sizeof(Elem));
  kiln::bindings::check_no_internal_overlap(out);
  kiln::bindings::check_disjoint(out, input);
  if (act < 0 || act >= kiln::activation::kNumActs) {
    value_error("act must be in [0, " + std::to_string(kiln::activation::kNumActs) + "), got " + std::to_string(act));
  }
  kiln::activation::ActParams p{};
  p.out = out.data;
  p.input = input.data;
  p.d = out.size(-1);
  p.rows = p.d > 0 ? out.numel() / p.d : 0;
  p.in_stride = row_stride(input);
  p.out_stride = row_stride(out);
  p.act = static_cast<kiln::activation::Act>(act);
  const kiln::LaunchContext ctx = kiln::bindings::launch_context(input, stream, 0, pdl);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::activation::act_and_mul(p, ctx);
  }
  kiln::bindings::raise_if_failed(s, kiln::spec::kUri);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:activation launcher for one dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  py::dict acts;
  acts["silu"] = static_cast<int>(kiln::activation::Act::kSilu);
  acts["gelu"] = static_cast<int>(kiln::activation::Act::kGelu);
  acts["gelu_tanh"] = static_cast<int>(kiln::activation::Act::kGeluTanh);
  m.attr("acts") = acts;
  m.def("act_and_mul", &act_and_mul, py::arg("out"), py::arg("input"), py::arg("act"), py::arg("pdl") = false,
        py::arg("stream") = 0, "out = act(input[..., :d]) * input[..., d:]");
}
