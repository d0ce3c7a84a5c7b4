// //ops/quantization:packbits launcher: validates the tensors, prepares PackbitsParams and calls the
// backend's entry point (ops/quantization/packbits.h) on the caller's stream. Keyword-only.
//
//   packbits(*, y, x, little, stream=0)                                 y = packbits(x)
//   segment_packbits(*, y, x, indptr, out_indptr, little, stream=0)     per segment of indptr
//
// x [n] bool (any stride); y [bytes] uint8, contiguous, disjoint from x: packbits needs
// ceil(n / 8) bytes, segment_packbits out_indptr[-1] (the kernel writes every byte of y and reads x
// only inside each segment, clipped to [0, n), whatever the index values); indptr and out_indptr
// [segments + 1] int64.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/quantization/packbits.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using kb::TensorView;
using kb::view_of;
using kiln::quantization::PackbitsParams;
constexpr kiln::dl::DataType kBool{kiln::dl::kBool, 8, 1};
constexpr kiln::dl::DataType kUInt8{kiln::dl::kUInt, 8, 1};
constexpr kiln::dl::DataType kInt64{kiln::dl::kInt, 64, 1};

struct Inputs {
  TensorView x, y;
};

Inputs checked(py::handle y_obj, py::handle x_obj) {
  Inputs in{view_of(x_obj, "x"), view_of(y_obj, "y")};
  kb::check_backend_device(in.x);
  kb::check_dtype(in.x, kBool, "packbits packs booleans");
  kb::check_ndim(in.x, 1, 1);
  kb::check_same_device(in.y, in.x);
  kb::check_dtype(in.y, kUInt8, "the packed bytes");
  kb::check_ndim(in.y, 1, 1);
  kb::check_last_contiguous(in.y);
  kb::check_disjoint(in.y, in.x);
  return in;
}

PackbitsParams params(const Inputs& in, bool little) {
  PackbitsParams p{};
  p.x = static_cast<const uint8_t*>(in.x.data);
  p.n = in.x.size(0);
  p.x_stride = in.x.stride(0);
  p.y = static_cast<uint8_t*>(in.y.data);
  p.y_len = in.y.size(0);
  p.little = little;
  return p;
}

void run(const PackbitsParams& p, const TensorView& ref, uintptr_t stream) {
  const kiln::LaunchContext ctx = kb::launch_context(ref, stream, 0);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::quantization::packbits(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

void packbits(py::handle y_obj, py::handle x_obj, bool little, uintptr_t stream) {
  const Inputs in = checked(y_obj, x_obj);
  kb::check_dim(in.y, 0, (in.x.size(0) + 7) / 8, "ceil(x.shape[0] / 8)");
  run(params(in, little), in.x, stream);
}

TensorView checked_indptr(py::handle obj, const char* name, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, ref);
  kb::check_dtype(t, kInt64, "segment bounds");
  kb::check_ndim(t, 1, 1);
  kb::check_last_contiguous(t);
  if (t.size(0) < 1) kb::value_error(t.name + " must have segments + 1 >= 1 entries, got shape " + t.shape_str());
  return t;
}

void segment_packbits(py::handle y_obj, py::handle x_obj, py::handle indptr_obj, py::handle out_obj, bool little,
                      uintptr_t stream) {
  const Inputs in = checked(y_obj, x_obj);
  const TensorView indptr = checked_indptr(indptr_obj, "indptr", in.x);
  const TensorView out_indptr = checked_indptr(out_obj, "out_indptr", in.x);
  kb::check_same_shape(out_indptr, indptr);
  PackbitsParams p = params(in, little);
  p.indptr = static_cast<const int64_t*>(indptr.data);
  p.out_indptr = static_cast<const int64_t*>(out_indptr.data);
  p.segments = indptr.size(0) - 1;
  run(p, in.x, stream);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/quantization:packbits launcher for one backend";
  m.attr("uri") = kiln::spec::kUri;
  m.def("packbits", &packbits, py::kw_only(), py::arg("y"), py::arg("x"), py::arg("little"), py::arg("stream") = 0,
        "y = numpy.packbits(x, bitorder='little' if little else 'big')");
  m.def("segment_packbits", &segment_packbits, py::kw_only(), py::arg("y"), py::arg("x"), py::arg("indptr"),
        py::arg("out_indptr"), py::arg("little"), py::arg("stream") = 0,
        "each segment x[indptr[s]:indptr[s+1]] packed into y[out_indptr[s]:out_indptr[s+1]]");
}
