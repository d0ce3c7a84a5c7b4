// //ops/attention:positions launcher: get_batch_indices_positions (ops/attention/attention.h,
// PositionsParams). Keyword-only arguments.
//
//   batch_indices_positions(*, append_indptr, seq_lens, batch_indices, positions, errors=0, stream=0)
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/attention/attention.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using kb::TensorView;
constexpr kiln::dl::DataType kInt32{kiln::dl::kInt, 32, 1};

TensorView int32_vector(py::handle obj, const char* name, const TensorView* ref) {
  TensorView t = kb::view_of(obj, name);
  if (ref) kb::check_same_device(t, *ref);
  kb::check_backend_device(t);
  kb::check_dtype(t, kInt32, "get_batch_indices_positions takes and returns int32");
  kb::check_ndim(t, 1, 1);
  kb::check_last_contiguous(t);
  return t;
}

void batch_indices_positions(py::handle indptr_obj, py::handle seq_obj, py::handle batch_obj, py::handle pos_obj,
                             uintptr_t errors, uintptr_t stream) {
  const TensorView indptr = int32_vector(indptr_obj, "append_indptr", nullptr);
  const TensorView seq = int32_vector(seq_obj, "seq_lens", &indptr);
  const TensorView bi = int32_vector(batch_obj, "batch_indices", &indptr);
  const TensorView pos = int32_vector(pos_obj, "positions", &indptr);
  if (indptr.size(0) < 1) kb::value_error("append_indptr must have batch_size + 1 >= 1 entries, got 0");
  kb::check_dim(seq, 0, indptr.size(0) - 1, "append_indptr.shape[0] - 1 (the batch size)");
  kb::check_same_shape(pos, bi);
  kb::check_no_internal_overlap(bi);
  kb::check_no_internal_overlap(pos);
  kiln::attention::PositionsParams p{};
  p.append_indptr = static_cast<const int32_t*>(indptr.data);
  p.seq_lens = static_cast<const int32_t*>(seq.data);
  p.batch = seq.size(0);
  p.nnz = bi.size(0);
  p.batch_indices = static_cast<int32_t*>(bi.data);
  p.positions = static_cast<int32_t*>(pos.data);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::batch_indices_positions(p, kb::launch_context(indptr, stream, errors));
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/attention:positions launcher (get_batch_indices_positions) for one backend";
  m.attr("uri") = kiln::spec::kUri;
  kb::export_error_texts(m);
  m.def("batch_indices_positions", &batch_indices_positions, py::kw_only(), py::arg("append_indptr"),
        py::arg("seq_lens"), py::arg("batch_indices"), py::arg("positions"), py::arg("errors") = 0,
        py::arg("stream") = 0);
}
