// The smallest GEMM specialisation a module can hold: one sm90 kernel (bf16 in and out, K-major
// B, 128 x 256 x 64, 4 stages, no cluster) and its launcher. docs/perf/gemm.md times its cold
// compile (one arch) against a CUTLASS instantiation of the same tile (gemm_cutlass_probe.cu):
//
//   time nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I. -c tests/cuda/gemm_compile_probe.cu -o /tmp/gemm_compile_probe.o
#include "ops/gemm/gemm_sm90.cuh"

namespace kiln::gemm {
using ProbeTile = Sm90Config<bf16_t, bf16_t, bf16_t, 256, 4, 1, true, ScaleMode::kNone, false>;
template Status launch_gemm_sm90<ProbeTile>(const GemmParams&, LaunchContext);
}  // namespace kiln::gemm
