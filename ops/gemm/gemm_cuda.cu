// //ops/gemm:mm and :fp8, CUDA backend: gemm() of gemm.h for this module's input dtype
// (spec_config.h: bf16 or f16 for :mm, e4m3 or e5m2 for A for :fp8). The kernels themselves are
// instantiated in the target's other units (gemm_kernels.h says which); this unit checks the
// tactic and runs the one table, dense_table<T>. Copied into the generated directory.
#include <cuda_runtime.h>

#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_kernels.h"
#include "spec_config.h"

namespace kiln::gemm {

Status gemm(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return no_kernel("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.m == 0 || p.n == 0 || p.batch == 0) return Status::Ok();
  return dense_table<spec::dtype>(p, t, ctx);
}

}  // namespace kiln::gemm
