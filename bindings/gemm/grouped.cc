// //ops/gemm:grouped launcher: grouped (segment) GEMM, SegmentGEMMWrapper.run and grouped_mm
// (ops/gemm/gemm.h, GroupedGemmParams). Keyword-only arguments:
//
//   grouped(*, x, weights, out, bounds, bounds_are_ends, weight_indices=None, tactic=-1,
//           strict=False, blocked=0, errors=0, stream=0) -> int       the tactic index run
//   grouped_tactics(*, x, weights, out, bounds, bounds_are_ends, weight_indices=None)
//
// x [rows, k] row-major; weights [num_weights, k, n], each [k, n] row-major or column-major (the
// transpose view of [n, k]), weights apart by stride 0; out [rows, n] row-major, x's dtype or
// float32. bounds int32 or int64, 1-D: seg_indptr (num_groups + 1 entries, segment s is rows
// [bounds[s], bounds[s + 1])) or, bounds_are_ends, torch._grouped_mm's offs (num_groups cumulative
// row ends). weight_indices (int32 or int64, num_groups entries) picks each segment's weight;
// without it segment s uses weights[s]. The bounds and weight indices are checked where they are
// read: on the device into the error record at `errors` (kiln/errors.py), on the host as an
// IndexError before anything is written.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/gemm/common.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
namespace kg = kiln::gemm;
using namespace kiln::bindings::gemm;
using kb::TensorView;

struct Problem {
  kg::GroupedGemmParams p;
  TensorView x, w, out, bounds, indices;
};

Problem problem(py::handle x_obj, py::handle w_obj, py::handle out_obj, py::handle bounds_obj, bool ends,
                py::handle indices_obj) {
  Problem pr;
  kg::GroupedGemmParams& p = pr.p;
  pr.x = input_view(x_obj, "x", nullptr, 2, 2);
  kb::check_dtype(pr.x, kDType, module_what());
  pr.w = input_view(w_obj, "weights", &pr.x, 3, 3);
  kb::check_dtype(pr.w, kDType, "the dtype of x");
  pr.bounds = index_view(bounds_obj, ends ? "offs" : "seg_indptr", pr.x, &p.bounds_type);
  pr.out = out_view(out_obj, pr.x, {&pr.x, &pr.w, &pr.bounds});
  if (pr.out.dtype != kDType && pr.out.dtype != kFloat32) {
    kb::type_error("out.dtype must be " + kb::dtype_str(kDType) + " (x's dtype) or float32, got " +
                   kb::dtype_str(pr.out.dtype));
  }
  const Matrix X = matrix_of(pr.x, false, false, "row-major (stride 1 along k)");
  const Matrix W = matrix_of(pr.w, true, true, "[num_weights, k, n] with each [k, n] row-major or column-major");
  kb::check_dim(pr.w, 1, X.cols, "x.shape[1] (k)");
  kb::check_dim(pr.out, 0, X.rows, "x.shape[0] (the rows)");
  kb::check_dim(pr.out, 1, W.cols, "weights' n");
  const Matrix O = matrix_of(pr.out, false, false, "row-major (stride 1 along n)");
  if (W.batch < 1) kb::value_error("weights must hold at least one weight, got shape " + pr.w.shape_str());
  p.num_groups = ends ? pr.bounds.size(0) : pr.bounds.size(0) - 1;
  if (p.num_groups < 0) kb::value_error("seg_indptr must have num_groups + 1 >= 1 entries, got 0");
  p.bounds = pr.bounds.data;
  p.bounds_are_ends = ends;
  p.n = W.cols, p.k = X.cols, p.total_rows = X.rows;
  p.a = pr.x.data, p.a_dtype = gemm_dtype(pr.x), p.lda = X.ld;
  p.b = pr.w.data, p.ldb = W.ld, p.b_weight_stride = W.batch_stride, p.num_weights = W.batch;
  p.b_layout = W.row_major ? kg::BLayout::kNMajor : kg::BLayout::kKMajor;
  p.out = pr.out.data, p.out_dtype = gemm_dtype(pr.out), p.ldo = O.ld;
  if (!indices_obj.is_none()) {
    pr.indices = index_view(indices_obj, "weight_indices", pr.x, &p.weight_indices_type);
    kb::check_dim(pr.indices, 0, p.num_groups, "the number of segments");
    kb::check_disjoint(pr.out, pr.indices);
    p.weight_indices = pr.indices.data;
  } else if (p.num_groups > p.num_weights) {
    kb::value_error("without weight_indices segment s uses weights[s], but there are " + std::to_string(p.num_groups) +
                    " segments and " + std::to_string(p.num_weights) + " weights");
  }
  return pr;
}

int grouped(py::handle x, py::handle weights, py::handle out, py::handle bounds, bool bounds_are_ends,
            py::handle weight_indices, int tactic, bool strict, uint64_t blocked, uintptr_t errors, uintptr_t stream) {
  const Problem pr = problem(x, weights, out, bounds, bounds_are_ends, weight_indices);
  const int index = pick_tactic(pr.p, tactic, blocked, strict, pr.x);
  count_launch(index);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kg::grouped_gemm(pr.p, kg::all_tactics()[size_t(index)], kb::launch_context(pr.x, stream, errors));
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
  return index;
}

std::pair<int, std::vector<int>> grouped_tactics(py::handle x, py::handle weights, py::handle out, py::handle bounds,
                                                 bool bounds_are_ends, py::handle weight_indices) {
  const Problem pr = problem(x, weights, out, bounds, bounds_are_ends, weight_indices);
  return tactic_candidates(pr.p, pr.x);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/gemm:grouped launcher (SegmentGEMMWrapper, grouped_mm) for one dtype and backend";
  export_common(m);
  m.def("grouped", &grouped, py::kw_only(), py::arg("x"), py::arg("weights"), py::arg("out"), py::arg("bounds"),
        py::arg("bounds_are_ends"), py::arg("weight_indices") = py::none(), py::arg("tactic") = -1,
        py::arg("strict") = false, py::arg("blocked") = 0, py::arg("errors") = 0, py::arg("stream") = 0,
        "out[rows of segment s] = x[rows of s] @ weights[weight_indices[s]]; returns the tactic index run");
  m.def("grouped_tactics", &grouped_tactics, py::kw_only(), py::arg("x"), py::arg("weights"), py::arg("out"),
        py::arg("bounds"), py::arg("bounds_are_ends"), py::arg("weight_indices") = py::none(),
        "(default tactic index, indices of every tactic that can run this call)");
}
