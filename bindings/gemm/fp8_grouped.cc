// //ops/gemm:fp8_grouped launcher: grouped fp8 GEMM with groupwise 1 x 128 x 128 scales per weight,
// group_gemm_fp8_nt_groupwise (ops/gemm/gemm.h, GroupedGemmParams with ScaleMode::kGroupwise).
// Keyword-only arguments:
//
//   group_gemm_fp8(*, a, b, out, bounds, bounds_are_ends, a_scale, b_scale, scale_mode, a_as="",
//                  b_as="", tactic=-1, strict=False, blocked=0, errors=0, stream=0) -> int
//   group_gemm_fp8_tactics(*, same without tactic, strict, blocked, errors, stream)
//
// a [rows, k] e4m3, row-major; b [E, n, k] e4m3 with k contiguous (each weight K-major: what
// wgmma reads for 8-bit operands); out [rows, n] bfloat16 or float16, row-major; k a multiple of
// 128. bounds int32 or int64, 1-D: m_indptr (E + 1 entries) or, bounds_are_ends, offs (E
// cumulative row ends, torch._grouped_mm's); segment s uses b[s]. kb = k / 128, nb = ceil(n / 128):
//   scale_mode "MN": a_scale [kb, rows], b_scale [E, kb, nb]   (FlashInfer's default)
//   scale_mode "K":  a_scale [rows, kb], b_scale [E, nb, kb]   (DeepSeek-V3's weight layout)
// float32, any strides (a stride-0 expand of a per-expert [E] scale is a per-weight scale).
// The bounds are checked where they are read (device: the error record at `errors`; host: an
// IndexError before anything is written). a_as / b_as: a uint8 view standing for e4m3 (a torch
// whose DLPack export has no fp8 codes).
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
  TensorView a, b, out, bounds, a_scale, b_scale;
};

void check_scale_shape(const TensorView& t, std::initializer_list<int64_t> dims, const std::string& shape,
                       const std::string& mode) {
  bool ok = t.ndim == int(dims.size());
  std::string want = "[";
  int i = 0;
  for (int64_t d : dims) {
    if (ok && t.size(i) != d) ok = false;
    want += (i ? ", " : "") + std::to_string(d);
    ++i;
  }
  want += "]";
  if (!ok) {
    kb::value_error(t.name + " must be " + shape + " = " + want + " for scale_major_mode '" + mode + "', got shape " +
                    t.shape_str());
  }
}

Problem problem(py::handle a_obj, py::handle b_obj, py::handle out_obj, py::handle bounds_obj, bool ends,
                py::handle as_obj, py::handle bs_obj, const std::string& mode, const std::string& a_as,
                const std::string& b_as) {
  if (mode != "MN" && mode != "K") kb::value_error("scale_major_mode must be 'MN' or 'K', got '" + mode + "'");
  Problem pr;
  kg::GroupedGemmParams& p = pr.p;
  pr.a = input_view(a_obj, "a", nullptr, 2, 2);
  reinterpret(pr.a, a_as);
  kb::check_dtype(pr.a, kDType, module_what());
  pr.b = input_view(b_obj, "b", &pr.a, 3, 3);
  reinterpret(pr.b, b_as);
  kb::check_dtype(pr.b, kE4M3, "the weights are e4m3 (float8_e4m3fn)");
  pr.bounds = index_view(bounds_obj, ends ? "offs" : "m_indptr", pr.a, &p.bounds_type);
  pr.a_scale = scale_view(as_obj, "a_scale", pr.a);
  pr.b_scale = scale_view(bs_obj, "b_scale", pr.a);
  pr.out = out_view(out_obj, pr.a, {&pr.a, &pr.b, &pr.bounds, &pr.a_scale, &pr.b_scale});
  if (pr.out.dtype != kBFloat16 && pr.out.dtype != kFloat16) {
    kb::type_error("out.dtype must be bfloat16 or float16 (fp8 GEMM outputs), got " + kb::dtype_str(pr.out.dtype));
  }
  const Matrix A = matrix_of(pr.a, false, false, "row-major (stride 1 along k)");
  const int64_t e = pr.b.size(0), n = pr.b.size(1), k = pr.b.size(2);
  if (e < 1) kb::value_error("b must hold at least one weight, got shape " + pr.b.shape_str());
  if ((k > 1 && pr.b.stride(2) != 1) || (n > 1 && pr.b.stride(1) < k) || (e > 1 && pr.b.stride(0) < 0)) {
    kb::value_error("b must be [E, n, k] with k contiguous (stride 1) and rows at least k apart, got strides " +
                    strides_str(pr.b) + "; call .contiguous() on it");
  }
  kb::check_dim(pr.b, 2, A.cols, "a.shape[1] (k)");
  kb::check_dim(pr.out, 0, A.rows, "a.shape[0] (the rows)");
  kb::check_dim(pr.out, 1, n, "b.shape[1] (n)");
  const Matrix O = matrix_of(pr.out, false, false, "row-major (stride 1 along n)");
  if (k % kg::kScaleBlock != 0) {
    kb::value_error("k (a.shape[1] = " + std::to_string(k) + ") must be a multiple of " +
                    std::to_string(kg::kScaleBlock) + " for groupwise scaling");
  }
  p.num_groups = ends ? pr.bounds.size(0) : pr.bounds.size(0) - 1;
  if (p.num_groups < 0) kb::value_error("m_indptr must have num_groups + 1 >= 1 entries, got 0");
  if (p.num_groups > e) {
    kb::value_error("segment s uses b[s], but there are " + std::to_string(p.num_groups) + " segments and " +
                    std::to_string(e) + " weights (b.shape[0])");
  }
  p.bounds = pr.bounds.data;
  p.bounds_are_ends = ends;
  p.n = n, p.k = k, p.total_rows = A.rows;
  p.a = pr.a.data, p.a_dtype = kg::DType::kE4M3, p.lda = A.ld;
  p.b = pr.b.data, p.b_layout = kg::BLayout::kKMajor, p.ldb = n > 1 ? pr.b.stride(1) : std::max<int64_t>(k, 1);
  p.b_weight_stride = e > 1 ? pr.b.stride(0) : n * p.ldb, p.num_weights = e;
  p.out = pr.out.data, p.out_dtype = gemm_dtype(pr.out), p.ldo = O.ld;
  p.scale_mode = kg::ScaleMode::kGroupwise;
  p.a_scale = static_cast<const float*>(pr.a_scale.data);
  p.b_scale = static_cast<const float*>(pr.b_scale.data);
  const int64_t kb_ = k / kg::kScaleBlock, nb = (n + kg::kScaleBlock - 1) / kg::kScaleBlock;
  if (mode == "MN") {
    check_scale_shape(pr.a_scale, {kb_, A.rows}, "[k / 128, rows]", mode);
    check_scale_shape(pr.b_scale, {e, kb_, nb}, "[E, k / 128, ceil(n / 128)]", mode);
    p.a_scale_stride_m = pr.a_scale.stride(1), p.a_scale_stride_k = pr.a_scale.stride(0);
    p.b_scale_stride_w = pr.b_scale.stride(0);
    p.b_scale_stride_n = pr.b_scale.stride(2), p.b_scale_stride_k = pr.b_scale.stride(1);
  } else {
    check_scale_shape(pr.a_scale, {A.rows, kb_}, "[rows, k / 128]", mode);
    check_scale_shape(pr.b_scale, {e, nb, kb_}, "[E, ceil(n / 128), k / 128]", mode);
    p.a_scale_stride_m = pr.a_scale.stride(0), p.a_scale_stride_k = pr.a_scale.stride(1);
    p.b_scale_stride_w = pr.b_scale.stride(0);
    p.b_scale_stride_n = pr.b_scale.stride(1), p.b_scale_stride_k = pr.b_scale.stride(2);
  }
  return pr;
}

int group_gemm_fp8(py::handle a, py::handle b, py::handle out, py::handle bounds, bool bounds_are_ends,
                   py::handle a_scale, py::handle b_scale, const std::string& scale_mode, const std::string& a_as,
                   const std::string& b_as, int tactic, bool strict, uint64_t blocked, uintptr_t errors,
                   uintptr_t stream) {
  const Problem pr = problem(a, b, out, bounds, bounds_are_ends, a_scale, b_scale, scale_mode, a_as, b_as);
  const int index = pick_tactic(pr.p, tactic, blocked, strict, pr.a);
  count_launch(index);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kg::grouped_gemm(pr.p, kg::all_tactics()[size_t(index)], kb::launch_context(pr.a, stream, errors));
  }
  kb::raise_if_failed(st, kiln::spec::kUri);
  return index;
}

std::pair<int, std::vector<int>> group_gemm_fp8_tactics(py::handle a, py::handle b, py::handle out, py::handle bounds,
                                                        bool bounds_are_ends, py::handle a_scale, py::handle b_scale,
                                                        const std::string& scale_mode, const std::string& a_as,
                                                        const std::string& b_as) {
  const Problem pr = problem(a, b, out, bounds, bounds_are_ends, a_scale, b_scale, scale_mode, a_as, b_as);
  return tactic_candidates(pr.p, pr.a);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/gemm:fp8_grouped launcher (group_gemm_fp8_nt_groupwise) for e4m3 and one backend";
  export_common(m);
  m.def("group_gemm_fp8", &group_gemm_fp8, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("bounds"),
        py::arg("bounds_are_ends"), py::arg("a_scale"), py::arg("b_scale"), py::arg("scale_mode"), py::arg("a_as") = "",
        py::arg("b_as") = "", py::arg("tactic") = -1, py::arg("strict") = false, py::arg("blocked") = 0,
        py::arg("errors") = 0, py::arg("stream") = 0,
        "out[rows of segment s] = groupwise-scaled a[rows of s] @ b[s]^T; returns the tactic index run");
  m.def("group_gemm_fp8_tactics", &group_gemm_fp8_tactics, py::kw_only(), py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("bounds"), py::arg("bounds_are_ends"), py::arg("a_scale"), py::arg("b_scale"), py::arg("scale_mode"),
        py::arg("a_as") = "", py::arg("b_as") = "",
        "(default tactic index, indices of every tactic that can run this call)");
}
