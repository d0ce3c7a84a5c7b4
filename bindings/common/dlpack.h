// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), declared for kiln's bindings:
// the legacy DLManagedTensor ("dltensor" capsules) and the versioned one of DLPack 1.x
// ("dltensor_versioned"). Only the fields kiln reads; the layout is the standard's.
#pragma once

#include <cstdint>

namespace kiln::dl {

enum DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kCUDAManaged = 13,
};

enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kBool = 6,
  kFloat8E4M3FN = 10,  // DLPack 1.1 kDLFloat8_e4m3fn (torch.float8_e4m3fn)
  kFloat8E5M2 = 12,    // DLPack 1.1 kDLFloat8_e5m2 (torch.float8_e5m2)
};

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

inline bool operator==(DataType a, DataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool operator!=(DataType a, DataType b) {
  return !(a == b);
}

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};

struct PackVersion {
  uint32_t major;
  uint32_t minor;
};

struct ManagedTensorVersioned {
  PackVersion version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned*);
  uint64_t flags;
  Tensor dl_tensor;
};

}  // namespace kiln::dl
