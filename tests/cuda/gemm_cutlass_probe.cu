// One CUTLASS 3.x sm90 GEMM instantiation (TMA, warp-specialised cooperative, 128x256x64 tile,
// 2x1x1 cluster, bf16 in/out, f32 accumulation, A row-major, B column-major = the [n, k] weight),
// for docs/perf/gemm.md's "CUTLASS or kiln's own sm90 primitives" decision: its cold compile time
// (nvcc, one arch) and its speed on the H200 next to kiln's kernel and cuBLAS. Not part of kiln.
//
//   CUTLASS=$(python -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source
//   time nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I$CUTLASS/include -I$CUTLASS/tools/util/include tests/cuda/gemm_cutlass_probe.cu -o gemm_cutlass_probe
//   ./gemm_cutlass_probe 8192 8192 8192 4096 4096 4096 ...   (m n k triples)
//
// Prints the median of 20 runs (CUDA events, after warm-up) and a sampled check of 256 outputs
// against a double-precision dot product on the host. With -DCUTLASS_PROBE_LIB -c it is a library
// (cutlass_probe_gemm) that gemm_selftest links and times next to kiln and cuBLAS in one harness.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
constexpr int kAlign = 8;
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, LayoutC, kAlign, Element, LayoutC, kAlign,
    cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, float,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

// out[m, n] = a[m, k] * b[n, k]^T (bf16, row-major a and out, b the [n, k] weight), on `stream`.
// Initialises the CUTLASS kernel when the problem changes and only runs it otherwise. Returns 0 on
// success. gemm_selftest calls it as a peer when linked with this file (-DCUTLASS_PROBE_LIB).
extern "C" int cutlass_probe_gemm(int m, int n, int k, const void* a, const void* b, void* d, cudaStream_t stream) {
  static Gemm gemm;
  static void* ws = nullptr;
  static size_t ws_bytes = 0;
  static int key[3] = {0, 0, 0};
  static const void* ptrs[3] = {nullptr, nullptr, nullptr};
  if (key[0] != m || key[1] != n || key[2] != k || ptrs[0] != a || ptrs[1] != b || ptrs[2] != d) {
    auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, k, 1});
    auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {n, k, 1});
    auto sc = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, n, 1});
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, n, 1});
    cutlass::KernelHardwareInfo hw = cutlass::KernelHardwareInfo::make_kernel_hardware_info<Kernel>(0);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {static_cast<const Element*>(a), sa, static_cast<const Element*>(b), sb},
                                  {{1.0f, 0.0f}, static_cast<Element*>(d), sc, static_cast<Element*>(d), sd},
                                  hw};
    const size_t need = std::max<size_t>(Gemm::get_workspace_size(args), 16);
    if (need > ws_bytes) {
      if (ws) cudaFree(ws);
      if (cudaMalloc(&ws, need) != cudaSuccess) return 1;
      ws_bytes = need;
    }
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 2;
    if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess) return 3;
    key[0] = m, key[1] = n, key[2] = k, ptrs[0] = a, ptrs[1] = b, ptrs[2] = d;
  }
  return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : 4;
}

#if !defined(CUTLASS_PROBE_LIB)
__global__ void fill(Element* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = Element(float(x >> 8) / 8388608.0f - 1.0f);
  }
}

int main(int argc, char** argv) {
  std::vector<int> dims;
  for (int i = 1; i < argc; ++i) dims.push_back(std::atoi(argv[i]));
  if (dims.empty()) dims = {8192, 8192, 8192};
  for (size_t s = 0; s + 2 < dims.size(); s += 3) {
    const int m = dims[s], n = dims[s + 1], k = dims[s + 2];
    Element *a, *b, *d;
    cudaMalloc(&a, size_t(m) * k * 2), cudaMalloc(&b, size_t(n) * k * 2), cudaMalloc(&d, size_t(m) * n * 2);
    fill<<<1024, 256>>>(a, size_t(m) * k, 1), fill<<<1024, 256>>>(b, size_t(n) * k, 2);
    auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, k, 1});
    auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {n, k, 1});
    auto sc = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, n, 1});
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, n, 1});
    cutlass::KernelHardwareInfo hw = cutlass::KernelHardwareInfo::make_kernel_hardware_info<Kernel>(0);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k, 1}, {a, sa, b, sb}, {{1.0f, 0.0f}, d, sc, d, sd}, hw};
    Gemm gemm;
    void* ws = nullptr;
    cudaMalloc(&ws, std::max<size_t>(Gemm::get_workspace_size(args), 16));
    if (gemm.can_implement(args) != cutlass::Status::kSuccess ||
        gemm.initialize(args, ws) != cutlass::Status::kSuccess) {
      std::printf("cutlass: cannot run m %d n %d k %d\n", m, n, k);
      continue;
    }
    for (int i = 0; i < 3; ++i) gemm.run();
    cudaEvent_t e[40];
    for (auto& x : e) cudaEventCreate(&x);
    for (int r = 0; r < 20; ++r) {
      cudaEventRecord(e[2 * r]);
      gemm.run();
      cudaEventRecord(e[2 * r + 1]);
    }
    cudaDeviceSynchronize();
    std::vector<float> ms(20);
    for (int r = 0; r < 20; ++r) cudaEventElapsedTime(&ms[r], e[2 * r], e[2 * r + 1]);
    std::sort(ms.begin(), ms.end());
    // sampled check
    std::vector<Element> ha(size_t(m) * k), hb(size_t(n) * k), hd(size_t(m) * n);
    cudaMemcpy(ha.data(), a, ha.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb.data(), b, hb.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd.data(), d, hd.size() * 2, cudaMemcpyDeviceToHost);
    std::mt19937 rng(3);
    double worst = 0;
    for (int t = 0; t < 256; ++t) {
      const int i = rng() % m, j = rng() % n;
      double ref = 0;
      for (int kk = 0; kk < k; ++kk) ref += double(float(ha[size_t(i) * k + kk])) * float(hb[size_t(j) * k + kk]);
      worst = std::max(worst, std::fabs(double(float(hd[size_t(i) * n + j])) - ref) / (std::fabs(ref) + 1.0));
    }
    const double us = ms[10] * 1e3;
    std::printf("cutlass 128x256x64 c2x1 cooperative: m %d n %d k %d  %.1f us  %.1f TFLOP/s  sampled rel err %.2e %s\n",
                m, n, k, us, 2.0 * m * n * double(k) / (us * 1e-6) / 1e12, worst, worst < 2e-2 ? "ok" : "FAIL");
    cudaFree(a), cudaFree(b), cudaFree(d), cudaFree(ws);
  }
  return 0;
}
#endif  // !CUTLASS_PROBE_LIB
