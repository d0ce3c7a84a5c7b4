// //ops/gemm:mm launcher: dense 16-bit GEMM, mm_bf16 and bmm_bf16 (ops/gemm/gemm.h, GemmParams).
// Keyword-only arguments; tensors 2-D (mm) or 3-D (bmm, the batch first):
//
//   mm(*, a, b, out, tactic=-1, strict=False, blocked=0, pdl=False, stream=0) -> int  the tactic run
//   mm_tactics(*, a, b, out) -> (default index, [indices of every tactic that can run it])
//
// a [.., m, k] row-major (any row and batch strides); b [.., k, n] row-major or column-major (the
// transpose view of an [n, k] weight); out [.., m, n] row-major, bfloat16, float16 or float32,
// apart from a and b. `tactic` asks for an index of tactic_names (-1: the default heuristic);
// `blocked` is a bit mask of indices never to run; `strict` makes a tactic that cannot serve the
// call an error instead of the default (the autotuner's timing runs); `pdl` launches with
// programmatic dependent launch (ignored for CPU tensors; the caller asks for it on sm90+ only).
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
  kg::GemmParams p;
  TensorView a, b, out;
};

Problem problem(py::handle a_obj, py::handle b_obj, py::handle out_obj) {
  Problem pr;
  pr.a = input_view(a_obj, "a", nullptr, 2, 3);
  kb::check_dtype(pr.a, kDType, module_what());
  pr.b = input_view(b_obj, "b", &pr.a, pr.a.ndim, pr.a.ndim);
  kb::check_dtype(pr.b, kDType, "the dtype of a");
  pr.out = out_view(out_obj, pr.a, {&pr.a, &pr.b});
  if (pr.out.dtype != kBFloat16 && pr.out.dtype != kFloat16 && pr.out.dtype != kFloat32) {
    kb::type_error("out.dtype must be bfloat16, float16 or float32, got " + kb::dtype_str(pr.out.dtype));
  }
  const Matrix A = matrix_of(pr.a, false, false,
                             "row-major in its last two dimensions (stride 1 along k; a transposed view is not)");
  const Matrix B =
      matrix_of(pr.b, true, true, "row-major [k, n] or column-major [k, n] (the transpose view of an [n, k] weight)");
  kb::check_dim(pr.b, -2, A.cols, "a.shape[-1] (k)");
  if (pr.a.ndim == 3) {
    kb::check_dim(pr.b, 0, A.batch, "a.shape[0] (the batch)");
    kb::check_dim(pr.out, 0, A.batch, "a.shape[0] (the batch)");
  }
  kb::check_dim(pr.out, -2, A.rows, "a.shape[-2] (m)");
  kb::check_dim(pr.out, -1, B.cols, "b.shape[-1] (n)");
  const Matrix O = matrix_of(pr.out, false, false, "row-major (stride 1 along n)");
  kg::GemmParams& p = pr.p;
  p.m = A.rows, p.n = B.cols, p.k = A.cols, p.batch = A.batch;
  p.a = pr.a.data, p.a_dtype = gemm_dtype(pr.a), p.lda = A.ld, p.a_batch_stride = A.batch_stride;
  p.b = pr.b.data, p.b_dtype = gemm_dtype(pr.b), p.ldb = B.ld, p.b_batch_stride = B.batch_stride;
  p.b_layout = B.row_major ? kg::BLayout::kNMajor : kg::BLayout::kKMajor;
  p.out = pr.out.data, p.out_dtype = gemm_dtype(pr.out), p.ldo = O.ld, p.out_batch_stride = O.batch_stride;
  return pr;
}

int mm(py::handle a, py::handle b, py::handle out, int tactic, bool strict, uint64_t blocked, bool pdl,
       uintptr_t stream) {
  const Problem pr = problem(a, b, out);
  const int index = pick_tactic(pr.p, tactic, blocked, strict, pr.a);
  count_launch(index);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kg::gemm(pr.p, kg::all_tactics()[size_t(index)], kb::launch_context(pr.a, stream, 0, pdl));
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
  return index;
}

std::pair<int, std::vector<int>> mm_tactics(py::handle a, py::handle b, py::handle out) {
  const Problem pr = problem(a, b, out);
  return tactic_candidates(pr.p, pr.a);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/gemm:mm launcher (mm_bf16, bmm_bf16) for one input dtype and backend";
  export_common(m);
  m.def("mm", &mm, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("tactic") = -1,
        py::arg("strict") = false, py::arg("blocked") = 0, py::arg("pdl") = false, py::arg("stream") = 0,
        "out[.., i, j] = sum_k a[.., i, k] * b[.., k, j] (float32 accumulation); returns the tactic index run");
  m.def("mm_tactics", &mm_tactics, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"),
        "(default tactic index, indices of every tactic that can run this call)");
}
