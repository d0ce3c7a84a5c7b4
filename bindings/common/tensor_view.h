// Typed tensor views for launchers, built from DLPack: any object with __dlpack__, or a
// DLPack capsule, can be passed to a kiln binding. A view borrows the producer's memory for the
// duration of the call; the capsule is not consumed, so its owner keeps (and frees) the tensor.
//
// The check_* helpers raise Python TypeError/ValueError that name the argument, the expectation
// and what was found, before anything is launched.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

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

inline void check_element_aligned(const TensorView& t, int64_t elem_bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(elem_bytes) != 0) {
    value_error(t.name + ".data_ptr is not aligned to its element size (" + std::to_string(elem_bytes) + " bytes)");
  }
}

}  // namespace kiln::bindings
