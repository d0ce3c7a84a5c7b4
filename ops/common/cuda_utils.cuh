// CUDA helpers shared by every launcher: status from a cudaError_t, a device guard, the SM count.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ops/common/status.h"

namespace kiln {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(static_cast<int>(err),
                       std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Makes `device` current for the scope (the stream passed in belongs to it), restoring the
// caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (device >= 0 && device != previous_) {
      set_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (set_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool set_ = false;
};

// Multiprocessor count of the current device, queried once per device.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= kMaxDevices) return 1;
  if (cached[device] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    cached[device] = n > 0 ? n : 1;
  }
  return cached[device];
}

// Raise a kernel's dynamic shared-memory limit once per device when it needs more than 48 KB.
// Keyed by the kernel itself (a template argument), so every kernel keeps its own flags.
template <auto Kernel>
cudaError_t allow_smem(size_t bytes, int device) {
  constexpr int kMaxDevices = 64;
  static bool done[kMaxDevices] = {};
  if (bytes <= 48 * 1024 || device < 0 || device >= kMaxDevices || done[device]) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  done[device] = err == cudaSuccess;
  return err;
}

}  // namespace kiln
