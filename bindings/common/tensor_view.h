// Typed tensor views for launchers, built from DLPack: any object with __dlpack__, or a
// DLPack capsule, can be passed to a kiln binding. A view borrows the producer's memory for the
// duration of the call; the capsule is not consumed, so its owner keeps (and frees) the tensor.
//
// The check_* helpers raise Python TypeError/ValueError that name the argument, the expectation
// and what was found, before anything is launched.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "bindings/common/dlpack.h"
#include "ops/common/dtypes.h"

namespace kiln::bindings {

namespace py = pybind11;

constexpr int kMaxDims = 8;

template <typename T>
constexpr dl::DataType dl_dtype();
template <>
constexpr dl::DataType dl_dtype<float>() {
  return {dl::kFloat, 32, 1};
}
template <>
constexpr dl::DataType dl_dtype<f16_t>() {
  return {dl::kFloat, 16, 1};
}
template <>
constexpr dl::DataType dl_dtype<bf16_t>() {
  return {dl::kBfloat, 16, 1};
}
template <>
constexpr dl::DataType dl_dtype<e4m3_t>() {
  return {dl::kFloat8E4M3FN, 8, 1};
}
template <>
constexpr dl::DataType dl_dtype<e5m2_t>() {
  return {dl::kFloat8E5M2, 8, 1};
}
template <>
constexpr dl::DataType dl_dtype<int32_t>() {
  return {dl::kInt, 32, 1};
}
template <>
constexpr dl::DataType dl_dtype<int64_t>() {
  return {dl::kInt, 64, 1};
}
template <>
constexpr dl::DataType dl_dtype<uint8_t>() {
  return {dl::kUInt, 8, 1};
}

// "bfloat16", "float32", ...: the names torch and numpy users read.
inline std::string dtype_str(dl::DataType t) {
  std::string base;
  switch (t.code) {
    case dl::kFloat:
      base = "float";
      break;
    case dl::kBfloat:
      base = "bfloat";
      break;
    case dl::kInt:
      base = "int";
      break;
    case dl::kUInt:
      base = "uint";
      break;
    case dl::kBool:
      return "bool";
    case dl::kFloat8E4M3FN:
      return "float8_e4m3fn";
    case dl::kFloat8E5M2:
      return "float8_e5m2";
    default:
      base = "dtype(code=" + std::to_string(t.code) + ")";
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

struct TensorView {
  std::string name;
  void* data = nullptr;
  dl::DataType dtype{};
  dl::Device device{};
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  py::object keep_alive;  // the capsule made by __dlpack__, when we made one

  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  std::string shape_str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
  std::string device_str() const {
    switch (device.device_type) {
      case dl::kCPU:
        return "cpu";
      case dl::kCUDA:
        return "cuda:" + std::to_string(device.device_id);
      case dl::kCUDAHost:
        return "cuda_host";
      case dl::kCUDAManaged:
        return "cuda_managed:" + std::to_string(device.device_id);
      default:
        return "device_type " + std::to_string(device.device_type);
    }
  }
};

[[noreturn]] inline void type_error(const std::string& msg) {
  throw py::type_error(msg);
}
[[noreturn]] inline void value_error(const std::string& msg) {
  throw py::value_error(msg);
}

inline TensorView view_of(py::handle obj, const char* name) {
  TensorView v;
  v.name = name;
  py::handle capsule = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!py::hasattr(obj, "__dlpack__")) {
      type_error(std::string(name) + " must be a tensor (an object with __dlpack__ or a DLPack capsule), got " +
                 std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    v.keep_alive = obj.attr("__dlpack__")();
    capsule = v.keep_alive;
  }
  const char* cname = PyCapsule_GetName(capsule.ptr());
  const dl::Tensor* t = nullptr;
  if (cname && std::string(cname) == "dltensor") {
    t = &static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), cname))->dl_tensor;
  } else if (cname && std::string(cname) == "dltensor_versioned") {
    auto* m = static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), cname));
    if (m->version.major != 1) {
      type_error(std::string(name) + ": DLPack version " + std::to_string(m->version.major) + " is not supported");
    }
    t = &m->dl_tensor;
  } else {
    type_error(std::string(name) + ": the DLPack capsule was already consumed or is not a tensor (name '" +
               (cname ? cname : "") + "')");
  }
  if (t->ndim < 0 || t->ndim > kMaxDims) {
    value_error(std::string(name) + " has " + std::to_string(t->ndim) + " dimensions; at most " +
                std::to_string(kMaxDims) + " are supported");
  }
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  v.dtype = t->dtype;
  v.device = t->device;
  v.ndim = t->ndim;
  int64_t compact = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    v.shape[i] = t->shape[i];
    v.strides[i] = t->strides ? t->strides[i] : compact;
    compact *= t->shape[i];
  }
  return v;
}

inline void check_dtype(const TensorView& t, dl::DataType expected, const std::string& why) {
  if (t.dtype != expected) {
    type_error(t.name + ".dtype must be " + dtype_str(expected) + " (" + why + "), got " + dtype_str(t.dtype));
  }
}

inline void check_ndim(const TensorView& t, int lo, int hi) {
  if (t.ndim < lo || t.ndim > hi) {
    const std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " or " + std::to_string(hi);
    value_error(t.name + " must have " + want + " dimensions, got shape " + t.shape_str());
  }
}

inline void check_same_shape(const TensorView& t, const TensorView& ref) {
  bool same = t.ndim == ref.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == ref.shape[i];
  if (!same)
    value_error(t.name + ".shape must equal " + ref.name + ".shape " + ref.shape_str() + ", got " + t.shape_str());
}

inline void check_dim(const TensorView& t, int dim, int64_t expected, const std::string& what) {
  if (t.size(dim) != expected) {
    value_error(t.name + ".shape[" + std::to_string(dim) + "] must equal " + what + " (" + std::to_string(expected) +
                "), got " + std::to_string(t.size(dim)) + " (shape " + t.shape_str() + ")");
  }
}

// The last dimension must be contiguous (stride 1), unless it has a single element.
inline void check_last_contiguous(const TensorView& t) {
  if (t.ndim > 0 && t.size(-1) > 1 && t.stride(-1) != 1) {
    value_error(t.name + " must be contiguous in its last dimension (stride 1), got strides " + [&] {
      std::string s = "[";
      for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
      return s + "]";
    }() + "; call .contiguous() first");
  }
}

inline void check_same_device(const TensorView& t, const TensorView& ref) {
  if (t.device.device_type != ref.device.device_type || t.device.device_id != ref.device.device_id) {
    value_error(t.name + " is on " + t.device_str() + " but " + ref.name + " is on " + ref.device_str() +
                "; all tensors of a call must be on one device");
  }
}

// The device this module's backend runs on: CUDA modules take CUDA tensors, host modules CPU ones.
inline void check_backend_device(const TensorView& t) {
#if defined(KILN_WITH_CUDA)
  const bool ok = t.device.device_type == dl::kCUDA || t.device.device_type == dl::kCUDAManaged;
  const char* want = "a CUDA device (this is a CUDA module)";
#else
  const bool ok = t.device.device_type == dl::kCPU || t.device.device_type == dl::kCUDAHost;
  const char* want = "the CPU (this is a host-backend module)";
#endif
  if (!ok) value_error(t.name + " is on " + t.device_str() + "; expected " + want);
}

// No two index tuples of `t` address the same element: an output written through it must not
// write one element twice (a stride-0, expanded view, or strides that make rows overlap).
inline void check_no_internal_overlap(const TensorView& t) {
  int order[kMaxDims];
  int n = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return;  // no element at all
    if (t.shape[i] > 1) order[n++] = i;
  }
  for (int a = 1; a < n; ++a) {  // dimensions by increasing stride
    for (int b = a; b > 0 && t.strides[order[b]] < t.strides[order[b - 1]]; --b) std::swap(order[b], order[b - 1]);
  }
  int64_t extent = 1;  // elements spanned by the faster dimensions
  for (int k = 0; k < n; ++k) {
    const int d = order[k];
    if (t.strides[d] < extent) {
      value_error(t.name + " has overlapping elements (shape " + t.shape_str() + ", stride " +
                  std::to_string(t.strides[d]) + " in dimension " + std::to_string(d) +
                  "): an output must not be an expanded or self-overlapping view; pass a tensor of its own");
    }
    extent = t.strides[d] * (t.shape[d] - 1) + extent;
  }
}

// The byte range [first, last] a view spans (an empty view spans nothing: first > last).
inline void byte_span(const TensorView& t, uintptr_t* first, uintptr_t* last) {
  const int64_t elem = (t.dtype.bits * t.dtype.lanes + 7) / 8;
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) {
      *first = 1, *last = 0;
      return;
    }
    const int64_t reach = t.strides[i] * (t.shape[i] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  *first = reinterpret_cast<uintptr_t>(t.data) + lo * elem;
  *last = reinterpret_cast<uintptr_t>(t.data) + hi * elem + elem - 1;
}

namespace detail {
inline int64_t floor_div(int64_t x, int64_t y) {
  return x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
}

// Is there c with |c[k]| <= shape[k] - 1 and sum c[k] * stride[k] == d over dims[k..], which are
// sorted by decreasing stride, each larger than the extent of the ones after it? That extent is
// below one stride, so at most two digits of each dimension can work: the search is 2^ndim at most.
inline bool offset_reachable(const TensorView& t, const int* dims, int n, int k, int64_t d) {
  if (k == n) return d == 0;
  const int64_t s = t.strides[dims[k]], m = t.shape[dims[k]] - 1;
  int64_t below = 0;
  for (int j = k + 1; j < n; ++j) below += t.strides[dims[j]] * (t.shape[dims[j]] - 1);
  const int64_t lo = std::max(-m, -floor_div(below - d, s)), hi = std::min(m, floor_div(d + below, s));
  for (int64_t c = lo; c <= hi; ++c) {
    if (offset_reachable(t, dims, n, k + 1, d - c * s)) return true;
  }
  return false;
}
}  // namespace detail

// Do `a` and `b` share a byte? Exact for two views of one layout (the same shape and strides, as
// the K and V halves of one [pages, 2, ...] cache are, interleaved but apart); otherwise any
// intersection of the byte ranges they span counts.
inline bool views_overlap(const TensorView& a, const TensorView& b) {
  uintptr_t a0, a1, b0, b1;
  byte_span(a, &a0, &a1);
  byte_span(b, &b0, &b1);
  if (a0 > a1 || b0 > b1 || a1 < b0 || b1 < a0) return false;
  bool same_layout = a.ndim == b.ndim && a.dtype == b.dtype;
  for (int i = 0; same_layout && i < a.ndim; ++i)
    same_layout = a.shape[i] == b.shape[i] && a.strides[i] == b.strides[i];
  const int64_t elem = (a.dtype.bits * a.dtype.lanes + 7) / 8;
  const int64_t diff = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data) - reinterpret_cast<uintptr_t>(a.data));
  if (!same_layout || diff % elem != 0) return true;
  int dims[kMaxDims], n = 0;
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] > 1) dims[n++] = i;
  }
  for (int x = 1; x < n; ++x) {  // by decreasing stride
    for (int y = x; y > 0 && a.strides[dims[y]] > a.strides[dims[y - 1]]; --y) std::swap(dims[y], dims[y - 1]);
  }
  int64_t extent = 0;  // nested strides, or no exact answer: count it as an overlap
  for (int k = n - 1; k >= 0; --k) {
    if (a.strides[dims[k]] <= extent) return true;
    extent += a.strides[dims[k]] * (a.shape[dims[k]] - 1);
  }
  return detail::offset_reachable(a, dims, n, 0, diff / elem);
}

// `a` and `b` share no byte (one is written while the other is read or written).
inline void check_disjoint(const TensorView& a, const TensorView& b) {
  if (views_overlap(a, b)) value_error(a.name + " and " + b.name + " overlap in memory; they must be separate tensors");
}

inline void check_element_aligned(const TensorView& t, int64_t elem_bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(elem_bytes) != 0) {
    value_error(t.name + ".data_ptr is not aligned to its element size (" + std::to_string(elem_bytes) + " bytes)");
  }
}

}  // namespace kiln::bindings
