// //ops/gemm, CUDA backend, shared by every target: device_arch() (what the tactic rules and the
// heuristic see) and timestamp() (%globaltimer, for the autotuner). Copied into each module's
// generated directory.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_utils.cuh"
#include "ops/gemm/gemm.h"

namespace kiln::gemm {

namespace {

// Compiled into every module like its GEMM kernels: its attributes say which code the module
// holds for the device (binary version 90 and no other PTX: the module was built as sm_90a, the
// only way 9.0 is built for a target that declares the sm90a family).
__global__ void arch_probe_kernel(int* out) {
  if (out != nullptr) *out = 0;
}

__global__ void timestamp_kernel(int64_t* out) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *out = static_cast<int64_t>(t);
}

}  // namespace

int device_arch(int device) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return 0;
  if (cached[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    int arch = major * 10 + minor;
    if (arch == 90) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, arch_probe_kernel) != cudaSuccess || attr.binaryVersion != 90 ||
          (attr.ptxVersion != 0 && attr.ptxVersion != 90)) {
        cudaGetLastError();
        arch = 89;  // no sm_90a code: the sm80+ kernels only
      }
    }
    cached[device] = arch > 0 ? arch : -1;
  }
  return cached[device];
}

Status timestamp(int64_t* out, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  timestamp_kernel<<<1, 1, 0, static_cast<cudaStream_t>(ctx.stream)>>>(out);
  return cuda_status(cudaGetLastError(), "gemm timestamp kernel launch");
}

}  // namespace kiln::gemm
