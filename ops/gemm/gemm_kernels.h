// The CUDA kernels of //ops/gemm as partitions, and the one table that maps a launch to them.
//
// A partition is one kernel family for one input type (run_sm90_kmajor<T>: every sm90 tile and
// cluster shape for a K-major B and the outputs T and float). Each is a template defined beside
// its kernels (gemm_sm90.cuh, gemm_sm80.cuh, gemm_fallback.cuh) and instantiated for the module's
// dtype (spec_config.h) in a compile unit of its own (mm_sm90_kmajor.cu, ...), so the units of a
// module compile in parallel: a module's cold build takes its slowest unit, not their sum. The
// entry units (gemm_cuda.cu, grouped_cuda.cu) include only this header and call dense_table<T> /
// grouped_table<T>; a partition the table calls but no unit instantiates is an undefined symbol,
// which fails the module's import (tests/ops/gemm/test_gemm_build.py imports every CUDA module).
//
// Which partitions each target holds (BUILD.py lists the units):
//   :mm       16-bit T:  run_sm90_kmajor, run_sm90_nmajor, run_sm80, run_small_m, run_fallback<T, T>
//   :fp8      fp8 A:     run_sm90_fp8_tensor, run_sm90_fp8_group, run_fallback<A, e4m3 | e5m2>
//   :grouped  16-bit T:  run_grouped_sm90, run_grouped_fallback
//   :fp8_grouped e4m3:   run_grouped_sm90_fp8, run_grouped_fallback
#pragma once

#include <string>
#include <type_traits>

#include "ops/common/dtypes.h"
#include "ops/common/status.h"
#include "ops/gemm/gemm.h"

namespace kiln::gemm {

template <typename T>
Status run_sm90_kmajor(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename T>
Status run_sm90_nmajor(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename T>
Status run_sm80(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename T>
Status run_small_m(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename TA>
Status run_sm90_fp8_tensor(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename TA>
Status run_sm90_fp8_group(const GemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename TA, typename TB>
Status run_fallback(const GemmParams& p, LaunchContext ctx);
template <typename T>
Status run_grouped_sm90(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx);
template <typename T>
Status run_grouped_fallback(const GroupedGemmParams& p, LaunchContext ctx);
template <typename TA>
Status run_grouped_sm90_fp8(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx);

template <typename T>
constexpr bool kFp8Type = std::is_same_v<T, e4m3_t> || std::is_same_v<T, e5m2_t>;

// The DType of an element type (the reverse of gemm_common.cuh's dispatch_dtype table).
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bf16_t>) return DType::kBF16;
  if constexpr (std::is_same_v<T, f16_t>) return DType::kF16;
  if constexpr (std::is_same_v<T, e4m3_t>) return DType::kE4M3;
  if constexpr (std::is_same_v<T, e5m2_t>) return DType::kE5M2;
  return DType::kF32;
}

inline Status no_kernel(const std::string& what) {
  return Status::Error(1, "gemm: " + what);
}

// The dense table (mm, bmm, fp8 per-tensor and groupwise) of a module whose input dtype is T, for
// a tactic unsupported() accepted: kernel kind -> partition. k == 0 runs the fallback (zeros).
template <typename T>
Status dense_table(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  if (p.a_dtype != dtype_of<T>()) {
    return no_kernel(std::string("this module holds kernels for ") + dtype_name(dtype_of<T>()) + " inputs, not " +
                     dtype_name(p.a_dtype));
  }
  if constexpr (kFp8Type<T>) {
    if (p.k == 0 || t.kernel == Kernel::kFallback) {
      return p.b_dtype == DType::kE5M2 ? run_fallback<T, e5m2_t>(p, ctx) : run_fallback<T, e4m3_t>(p, ctx);
    }
    if (t.kernel == Kernel::kSm90) {
      return p.scale_mode == ScaleMode::kGroupwise ? run_sm90_fp8_group<T>(p, t, ctx)
                                                   : run_sm90_fp8_tensor<T>(p, t, ctx);
    }
  } else {
    if (p.k == 0 || t.kernel == Kernel::kFallback) return run_fallback<T, T>(p, ctx);
    switch (t.kernel) {
      case Kernel::kSm90:
        return p.b_layout == BLayout::kKMajor ? run_sm90_kmajor<T>(p, t, ctx) : run_sm90_nmajor<T>(p, t, ctx);
      case Kernel::kSm80:
        return run_sm80<T>(p, t, ctx);
      case Kernel::kSmallM:
        return run_small_m<T>(p, t, ctx);
      default:
        break;
    }
  }
  return no_kernel("this module has no kernel for tactic " + tactic_name(t));
}

// The grouped table of a module whose input dtype is T.
template <typename T>
Status grouped_table(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  if (p.a_dtype != dtype_of<T>()) {
    return no_kernel(std::string("this module holds kernels for ") + dtype_name(dtype_of<T>()) + " inputs, not " +
                     dtype_name(p.a_dtype));
  }
  if (p.k == 0 || t.kernel == Kernel::kFallback) return run_grouped_fallback<T>(p, ctx);
  if (t.kernel == Kernel::kSm90) {
    if constexpr (kFp8Type<T>) {
      return run_grouped_sm90_fp8<T>(p, t, ctx);
    } else {
      return run_grouped_sm90<T>(p, t, ctx);
    }
  }
  return no_kernel("this module has no grouped kernel for tactic " + tactic_name(t));
}

}  // namespace kiln::gemm
