// What the //ops/gemm launchers (mm.cc, fp8.cc, grouped.cc, fp8_grouped.cc) share: matrix views of
// 2-D and 3-D tensors in either layout, fp8 scales and uint8 operands standing for fp8, grouped
// index arrays, the output checks, the tactic choice (gemm.h: choose_tactic, with the blocklist
// as a bit mask over tactic indices) and its per-tactic launch counts, and the exports every gemm
// module carries (tactic names, error texts, the timestamp launcher).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/gemm/gemm.h"
#include "spec_config.h"

namespace kiln::bindings::gemm {

namespace py = pybind11;
namespace kg = kiln::gemm;
using Elem = kiln::spec::dtype;
constexpr auto kDType = dl_dtype<Elem>();
constexpr dl::DataType kFloat32 = dl_dtype<float>();
constexpr dl::DataType kBFloat16 = dl_dtype<bf16_t>();
constexpr dl::DataType kFloat16 = dl_dtype<f16_t>();
constexpr dl::DataType kE4M3 = dl_dtype<e4m3_t>();
constexpr dl::DataType kE5M2 = dl_dtype<e5m2_t>();
constexpr dl::DataType kInt32{dl::kInt, 32, 1};
constexpr dl::DataType kInt64{dl::kInt, 64, 1};

inline std::string module_what() {
  return std::string("this module is ") + kiln::spec::kUri;
}

// The gemm.h DType of a tensor's dtype; a TypeError naming the tensor when it has none.
inline kg::DType gemm_dtype(const TensorView& t) {
  if (t.dtype == kBFloat16) return kg::DType::kBF16;
  if (t.dtype == kFloat16) return kg::DType::kF16;
  if (t.dtype == kFloat32) return kg::DType::kF32;
  if (t.dtype == kE4M3) return kg::DType::kE4M3;
  if (t.dtype == kE5M2) return kg::DType::kE5M2;
  type_error(t.name + ".dtype " + dtype_str(t.dtype) +
             " is not a GEMM dtype (bfloat16, float16, float32, float8_e4m3fn, float8_e5m2)");
}

inline std::string strides_str(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
  return s + "]";
}

// The float32 scales of an fp8 GEMM (fp8.cc, fp8_grouped.cc): any shape and strides, on ref's device.
inline TensorView scale_view(py::handle obj, const char* name, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  check_same_device(t, ref);
  check_dtype(t, kFloat32, "scales are float32");
  check_element_aligned(t, 4);
  return t;
}

// `as` ("e4m3", "e5m2", or "" for none): a uint8 view of an fp8 operand stands for that type (a
// torch whose DLPack export has no fp8 codes; kiln/gemm.py passes it only then).
inline void reinterpret(TensorView& t, const std::string& as) {
  if (as.empty()) return;
  if (as != "e4m3" && as != "e5m2") value_error(t.name + "_as must be '', 'e4m3' or 'e5m2', got '" + as + "'");
  if (t.dtype != dl::DataType{dl::kUInt, 8, 1}) {
    type_error(t.name + " must be a uint8 view when " + t.name + "_as is given, got " + dtype_str(t.dtype));
  }
  t.dtype = as == "e4m3" ? kE4M3 : kE5M2;
}

// A grouped GEMM's index array (bounds, weight indices): 1-D int32 or int64, contiguous, on ref's
// device; `type` receives which.
inline TensorView index_view(py::handle obj, const char* name, const TensorView& ref, kg::IndexType* type) {
  TensorView t = view_of(obj, name);
  check_same_device(t, ref);
  if (t.dtype != kInt32 && t.dtype != kInt64) {
    type_error(std::string(name) + ".dtype must be int32 or int64, got " + dtype_str(t.dtype));
  }
  check_ndim(t, 1, 1);
  check_last_contiguous(t);
  check_element_aligned(t, t.dtype.bits / 8);
  *type = t.dtype == kInt32 ? kg::IndexType::kInt32 : kg::IndexType::kInt64;
  return t;
}

// The last two dimensions of a 2-D or 3-D view as the kernels address them: element (r, c) of
// batch z at z * batch_stride + (row_major ? r * ld + c : c * ld + r).
struct Matrix {
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool row_major = true;
};

// `t` as a Matrix: row-major (stride 1 along the columns, rows at least `cols` apart) or, where
// `col_major_ok`, column-major (the transpose view of a row-major matrix). A dimension of size 1
// has no stride to speak of; where both layouts fit, `prefer_col_major` picks.
inline Matrix matrix_of(const TensorView& t, bool col_major_ok, bool prefer_col_major, const std::string& how) {
  Matrix m;
  m.rows = t.size(-2), m.cols = t.size(-1);
  if (t.ndim == 3) m.batch = t.size(0), m.batch_stride = t.stride(0);
  const int64_t sr = t.stride(-2), sc = t.stride(-1);
  const bool row = (m.cols <= 1 || sc == 1) && (m.rows <= 1 || sr >= m.cols);
  const bool col = col_major_ok && (m.rows <= 1 || sr == 1) && (m.cols <= 1 || sc >= m.rows);
  if (col && (prefer_col_major || !row)) {
    m.row_major = false;
    m.ld = m.cols <= 1 ? std::max<int64_t>(m.rows, 1) : sc;
  } else if (row) {
    m.ld = m.rows <= 1 ? std::max<int64_t>(m.cols, 1) : sr;
  } else {
    value_error(t.name + " must be " + how + "; got shape " + t.shape_str() + ", strides " + strides_str(t) +
                "; call .contiguous() on it");
  }
  if (m.batch > 1 && m.batch_stride < 0) value_error(t.name + " has a negative batch stride");
  return m;
}

// An input of a GEMM: on the module's device kind and `ref`'s device, 2-D or 3-D, element-aligned.
inline TensorView input_view(py::handle obj, const char* name, const TensorView* ref, int ndim_lo, int ndim_hi) {
  TensorView t = view_of(obj, name);
  if (ref) check_same_device(t, *ref);
  check_backend_device(t);
  check_ndim(t, ndim_lo, ndim_hi);
  check_element_aligned(t, (t.dtype.bits + 7) / 8);
  return t;
}

// The output: `ref`'s device and rank, row-major, element-aligned, written by no two index
// tuples, apart from every tensor the launch reads.
inline TensorView out_view(py::handle obj, const TensorView& ref, std::initializer_list<const TensorView*> inputs) {
  TensorView out = view_of(obj, "out");
  check_same_device(out, ref);
  check_ndim(out, ref.ndim, ref.ndim);
  check_element_aligned(out, (out.dtype.bits + 7) / 8);
  check_no_internal_overlap(out);
  for (const TensorView* t : inputs) check_disjoint(out, *t);
  return out;
}

// ---- tactics ---------------------------------------------------------------------------------

// Launches per tactic index since the module was loaded (or reset_launch_counts()): what a test
// reads to see that a blocklisted tactic never ran.
inline std::array<std::atomic<int64_t>, kg::kMaxTactics>& launch_counter() {
  static std::array<std::atomic<int64_t>, kg::kMaxTactics> counts{};
  return counts;
}

inline int device_of(const TensorView& t) {
  return t.device.device_type == dl::kCPU || t.device.device_type == dl::kCUDAHost ? -1 : t.device.device_id;
}

// The tactic index a launch of `p` runs (choose_tactic); an error names why there is none.
template <class P>
int pick_tactic(const P& p, int requested, uint64_t blocked, bool strict, const TensorView& ref) {
  std::string why;
  const int i = kg::choose_tactic(p, requested, blocked, strict, kg::device_arch(device_of(ref)), &why);
  if (i < 0) value_error(std::string(kiln::spec::kUri) + ": " + why);
  return i;
}

// (the default tactic's index, the indices of every tactic that can run p), ignoring the
// blocklist: what the autotuner times (minus what is blocked) and compares with.
template <class P>
std::pair<int, std::vector<int>> tactic_candidates(const P& p, const TensorView& ref) {
  const int arch = kg::device_arch(device_of(ref));
  std::string why;
  const int d = kg::choose_tactic(p, -1, 0, false, arch, &why);
  if (d < 0) value_error(std::string(kiln::spec::kUri) + ": " + why);
  std::vector<int> all;
  const auto& list = kg::all_tactics();
  for (size_t i = 0; i < list.size(); ++i) {
    if (kg::unsupported(p, list[i], arch).empty()) all.push_back(int(i));
  }
  return {d, all};
}

inline void count_launch(int index) {
  launch_counter()[size_t(index)].fetch_add(1, std::memory_order_relaxed);
}

inline py::dict launch_counts() {
  py::dict d;
  const auto& list = kg::all_tactics();
  for (size_t i = 0; i < list.size(); ++i) {
    const int64_t n = launch_counter()[i].load(std::memory_order_relaxed);
    if (n) d[py::str(kg::tactic_name(list[i]))] = n;
  }
  return d;
}

inline void reset_launch_counts() {
  for (auto& c : launch_counter()) c.store(0, std::memory_order_relaxed);
}

// timestamp(*, out, index, stream): out[index] = gemm.h's timestamp (ns), in stream order.
inline void timestamp(py::handle out_obj, int64_t index, uintptr_t stream) {
  const TensorView out = view_of(out_obj, "out");
  check_backend_device(out);
  check_dtype(out, kInt64, "timestamps are int64 nanoseconds");
  check_ndim(out, 1, 1);
  if (index < 0 || index >= out.size(0)) {
    value_error("index " + std::to_string(index) + " is outside out's " + std::to_string(out.size(0)) + " entries");
  }
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kg::timestamp(static_cast<int64_t*>(out.data) + index * out.stride(0), launch_context(out, stream, 0));
  }
  raise_if_failed(st, kiln::spec::kUri);
}

// Everything every gemm module exports besides its launchers.
inline void export_common(py::module_& m) {
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  py::list names;
  for (const kg::Tactic& t : kg::all_tactics()) names.append(kg::tactic_name(t));
  m.attr("tactic_names") = names;
  m.attr("max_tactics") = kg::kMaxTactics;
  m.attr("scale_block") = kg::kScaleBlock;
  export_error_texts(m);
  m.def("launch_counts", &launch_counts, "launches per tactic name since load or the last reset");
  m.def("reset_launch_counts", &reset_launch_counts);
  m.def("timestamp", &timestamp, py::kw_only(), py::arg("out"), py::arg("index"), py::arg("stream") = 0,
        "out[index] = the GPU's %globaltimer (ns; the steady clock on the host), in stream order");
}

}  // namespace kiln::bindings::gemm
