// //ops/gemm:grouped and :fp8_grouped, CUDA backend: grouped_gemm() of gemm.h for this module's
// dtype (bf16 or f16 for :grouped, e4m3 for :fp8_grouped; spec_config.h), and the fallback
// kernel's grouped instantiation; the sm90 grouped kernels are in grouped_sm90.cu (16-bit) and
// fp8_grouped_sm90.cu (fp8). Copied into the generated directory.
#include <cuda_runtime.h>

#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_fallback.cuh"
#include "ops/gemm/gemm_kernels.h"
#include "spec_config.h"

namespace kiln::gemm {

template Status run_grouped_fallback<spec::dtype>(const GroupedGemmParams&, LaunchContext);

Status grouped_gemm(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return no_kernel("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.num_groups == 0 || p.n == 0 || p.total_rows == 0) return Status::Ok();
  return grouped_table<spec::dtype>(p, t, ctx);
}

}  // namespace kiln::gemm
