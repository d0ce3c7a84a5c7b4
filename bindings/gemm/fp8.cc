// //ops/gemm:fp8 launcher: fp8 GEMM with per-tensor scales (bmm_fp8) or groupwise 1 x 128 x 128
// scales (gemm_fp8_nt_groupwise), ops/gemm/gemm.h GemmParams. Keyword-only arguments:
//
//   gemm_fp8(*, a, b, out, a_scale, b_scale, scale_mode, a_as="", b_as="", tactic=-1, strict=False,
//            blocked=0, stream=0) -> int                         the tactic index run
//   gemm_fp8_tactics(*, a, b, out, a_scale, b_scale, scale_mode, a_as="", b_as="") -> (default, [candidates])
//
// a [.., m, k] of the module's fp8 dtype, row-major; b [.., k, n] e4m3 or e5m2, column-major (the
// transpose view of a contiguous [.., n, k]: K-major, what FlashInfer requires and what wgmma reads
// for 8-bit operands; FlashInfer 0.7 silently returns wrong results for a row-major B, kiln refuses
// it); out [.., m, n] bfloat16 or float16, row-major.
//   scale_mode "tensor": a_scale and b_scale float32 with one element each (out = a_scale *
//     b_scale * a @ b); 2-D or 3-D.
//   scale_mode "MN" / "K" (2-D, k a multiple of 128): groupwise, kb = k / 128, nb = ceil(n / 128):
//     "MN": a_scale [kb, m], b_scale [kb, nb];  "K": a_scale [m, kb], b_scale [nb, kb]; any strides.
// a_as / b_as ("e4m3", "e5m2", or "" for none): a uint8 view of the operand stands for that fp8
// type (for a torch whose DLPack export has no fp8 codes; kiln/gemm.py passes them only then).
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
  TensorView a, b, out, a_scale, b_scale;
};

// A groupwise scale tensor of shape [d0, d1]: its strides along (d0, d1).
void check_scale_shape(const TensorView& t, int64_t d0, int64_t d1, const std::string& shape, const std::string& mode) {
  if (t.ndim != 2 || t.size(0) != d0 || t.size(1) != d1) {
    kb::value_error(t.name + " must be " + shape + " = [" + std::to_string(d0) + ", " + std::to_string(d1) +
                    "] for scale_major_mode '" + mode + "', got shape " + t.shape_str());
  }
}

// A uint8 view standing for an fp8 operand: its dtype as the kernels read it.
Problem problem(py::handle a_obj, py::handle b_obj, py::handle out_obj, py::handle as_obj, py::handle bs_obj,
                const std::string& mode, const std::string& a_as, const std::string& b_as) {
  if (mode != "tensor" && mode != "MN" && mode != "K") {
    kb::value_error("scale_mode must be 'tensor', 'MN' or 'K', got '" + mode + "'");
  }
  const bool groupwise = mode != "tensor";
  Problem pr;
  pr.a = input_view(a_obj, "a", nullptr, 2, groupwise ? 2 : 3);
  reinterpret(pr.a, a_as);
  kb::check_dtype(pr.a, kDType, module_what());
  pr.b = input_view(b_obj, "b", &pr.a, pr.a.ndim, pr.a.ndim);
  reinterpret(pr.b, b_as);
  if (pr.b.dtype != kE4M3 && pr.b.dtype != kE5M2) {
    kb::type_error("b.dtype must be float8_e4m3fn or float8_e5m2, got " + kb::dtype_str(pr.b.dtype));
  }
  pr.a_scale = scale_view(as_obj, "a_scale", pr.a);
  pr.b_scale = scale_view(bs_obj, "b_scale", pr.a);
  pr.out = out_view(out_obj, pr.a, {&pr.a, &pr.b, &pr.a_scale, &pr.b_scale});
  if (pr.out.dtype != kBFloat16 && pr.out.dtype != kFloat16) {
    kb::type_error("out.dtype must be bfloat16 or float16 (fp8 GEMM outputs), got " + kb::dtype_str(pr.out.dtype));
  }
  const Matrix A = matrix_of(pr.a, false, false,
                             "row-major in its last two dimensions (stride 1 along k; a transposed view is not)");
  const Matrix B = matrix_of(pr.b, true, true, "a K-major matrix");
  if (B.row_major && B.rows > 1 && B.cols > 1) {
    kb::value_error(
        "b must be column-major [k, n] (the transpose view of a contiguous [n, k], stride 1 along k), got "
        "strides " +
        strides_str(pr.b) +
        ": kiln's fp8 kernels, like FlashInfer's, read B K-major (FlashInfer 0.7 silently returns wrong "
        "results for a row-major B); pass w.t() of a contiguous [n, k] w");
  }
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
  p.b_layout = B.row_major ? kg::BLayout::kNMajor : kg::BLayout::kKMajor;  // N-major only for n or k of 1
  p.out = pr.out.data, p.out_dtype = gemm_dtype(pr.out), p.ldo = O.ld, p.out_batch_stride = O.batch_stride;
  p.a_scale = static_cast<const float*>(pr.a_scale.data);
  p.b_scale = static_cast<const float*>(pr.b_scale.data);
  if (!groupwise) {
    p.scale_mode = kg::ScaleMode::kPerTensor;
    for (const TensorView* s : {&pr.a_scale, &pr.b_scale}) {
      if (s->numel() != 1) {
        kb::value_error(s->name + " must hold one float32 (a per-tensor scale), got shape " + s->shape_str());
      }
    }
    return pr;
  }
  p.scale_mode = kg::ScaleMode::kGroupwise;
  if (p.k % kg::kScaleBlock != 0) {
    kb::value_error("k (a.shape[-1] = " + std::to_string(p.k) + ") must be a multiple of " +
                    std::to_string(kg::kScaleBlock) + " for groupwise scaling");
  }
  const int64_t kb_ = p.k / kg::kScaleBlock, nb = (p.n + kg::kScaleBlock - 1) / kg::kScaleBlock;
  if (mode == "MN") {
    check_scale_shape(pr.a_scale, kb_, p.m, "[k / 128, m]", mode);
    check_scale_shape(pr.b_scale, kb_, nb, "[k / 128, ceil(n / 128)]", mode);
    p.a_scale_stride_m = pr.a_scale.stride(1), p.a_scale_stride_k = pr.a_scale.stride(0);
    p.b_scale_stride_n = pr.b_scale.stride(1), p.b_scale_stride_k = pr.b_scale.stride(0);
  } else {
    check_scale_shape(pr.a_scale, p.m, kb_, "[m, k / 128]", mode);
    check_scale_shape(pr.b_scale, nb, kb_, "[ceil(n / 128), k / 128]", mode);
    p.a_scale_stride_m = pr.a_scale.stride(0), p.a_scale_stride_k = pr.a_scale.stride(1);
    p.b_scale_stride_n = pr.b_scale.stride(0), p.b_scale_stride_k = pr.b_scale.stride(1);
  }
  return pr;
}

int gemm_fp8(py::handle a, py::handle b, py::handle out, py::handle a_scale, py::handle b_scale,
             const std::string& scale_mode, const std::string& a_as, const std::string& b_as, int tactic, bool strict,
             uint64_t blocked, uintptr_t stream) {
  const Problem pr = problem(a, b, out, a_scale, b_scale, scale_mode, a_as, b_as);
  const int index = pick_tactic(pr.p, tactic, blocked, strict, pr.a);
  count_launch(index);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kg::gemm(pr.p, kg::all_tactics()[size_t(index)], kb::launch_context(pr.a, stream, 0));
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
  return index;
}

std::pair<int, std::vector<int>> gemm_fp8_tactics(py::handle a, py::handle b, py::handle out, py::handle a_scale,
                                                  py::handle b_scale, const std::string& scale_mode,
                                                  const std::string& a_as, const std::string& b_as) {
  const Problem pr = problem(a, b, out, a_scale, b_scale, scale_mode, a_as, b_as);
  return tactic_candidates(pr.p, pr.a);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/gemm:fp8 launcher (bmm_fp8, gemm_fp8_nt_groupwise) for one A dtype and backend";
  export_common(m);
  m.def("gemm_fp8", &gemm_fp8, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("a_scale"),
        py::arg("b_scale"), py::arg("scale_mode"), py::arg("a_as") = "", py::arg("b_as") = "", py::arg("tactic") = -1,
        py::arg("strict") = false, py::arg("blocked") = 0, py::arg("stream") = 0,
        "out = scaled a @ b (per-tensor or groupwise scales, float32 accumulation); returns the tactic index run");
  m.def("gemm_fp8_tactics", &gemm_fp8_tactics, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("a_scale"), py::arg("b_scale"), py::arg("scale_mode"), py::arg("a_as") = "", py::arg("b_as") = "",
        "(default tactic index, indices of every tactic that can run this call)");
}
