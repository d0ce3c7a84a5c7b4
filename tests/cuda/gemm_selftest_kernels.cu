// The self-test's stand-in for a kiln module: gemm() and grouped_gemm() of ops/gemm/gemm.h over
// every input dtype at once, through the same tables (gemm_kernels.h) and kernel partitions a
// module instantiates for its one dtype (ops/gemm/BUILD.py lists a module's units). Built with
// tests/cuda/gemm_selftest.cu (its header has the command line).
#include <cuda_runtime.h>

#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_fallback.cuh"
#include "ops/gemm/gemm_kernels.h"
#include "ops/gemm/gemm_sm80.cuh"
#include "ops/gemm/gemm_sm90.cuh"

namespace kiln::gemm {

Status gemm(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return no_kernel("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.m == 0 || p.n == 0 || p.batch == 0) return Status::Ok();
  switch (p.a_dtype) {
    case DType::kBF16:
      return dense_table<bf16_t>(p, t, ctx);
    case DType::kF16:
      return dense_table<f16_t>(p, t, ctx);
    case DType::kE4M3:
      return dense_table<e4m3_t>(p, t, ctx);
    case DType::kE5M2:
      return dense_table<e5m2_t>(p, t, ctx);
    default:
      return no_kernel(std::string("no kernels for ") + dtype_name(p.a_dtype) + " inputs");
  }
}

Status grouped_gemm(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return no_kernel("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.num_groups == 0 || p.n == 0 || p.total_rows == 0) return Status::Ok();
  return p.a_dtype == DType::kF16 ? grouped_table<f16_t>(p, t, ctx) : grouped_table<bf16_t>(p, t, ctx);
}

}  // namespace kiln::gemm
