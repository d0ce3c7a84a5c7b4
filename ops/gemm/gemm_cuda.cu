// //ops/gemm, CUDA backend: the entry points of gemm.h. Turns a run-time (dtypes, layout, scale
// mode, tactic) into one kernel instantiation; every instantiation this module holds is named in
// this file. A module may hold only some input dtypes (compile time): define any of
// KILN_GEMM_BF16, KILN_GEMM_F16, KILN_GEMM_FP8 (none defined: all three); a call for another is
// an error naming the dtype. The fallback kernel is always present.
#include <cuda_runtime.h>

#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_common.cuh"
#include "ops/gemm/gemm_fallback.cuh"
#include "ops/gemm/gemm_sm80.cuh"
#include "ops/gemm/gemm_sm90.cuh"

#if !defined(KILN_GEMM_BF16) && !defined(KILN_GEMM_F16) && !defined(KILN_GEMM_FP8)
#define KILN_GEMM_BF16 1
#define KILN_GEMM_F16 1
#define KILN_GEMM_FP8 1
#endif

namespace kiln::gemm {

namespace {

Status error(const std::string& what) {
  return Status::Error(1, "gemm: " + what);
}

template <typename T>
constexpr bool kBuilt = false;
#if defined(KILN_GEMM_BF16)
template <>
constexpr bool kBuilt<bf16_t> = true;
#endif
#if defined(KILN_GEMM_F16)
template <>
constexpr bool kBuilt<f16_t> = true;
#endif
#if defined(KILN_GEMM_FP8)
template <>
constexpr bool kBuilt<e4m3_t> = true;
template <>
constexpr bool kBuilt<e5m2_t> = true;
#endif

// ---- sm90: (tile_n, cluster) x (layout, scale) x (types) -------------------------------------

template <typename TA, typename TB, typename TO, bool GROUPED, ScaleMode SCALE, bool KMAJOR, class P>
Status sm90_shape(const P& p, const Tactic& t, LaunchContext ctx) {
  auto run = [&](auto tag) -> Status {
    using C = typename decltype(tag)::type;
    if constexpr (GROUPED) {
      return launch_grouped_sm90<C>(p, ctx);
    } else {
      return launch_gemm_sm90<C>(p, ctx);
    }
  };
  if (t.tile_n == 128 && t.cluster_m == 1)
    return run(TypeTag<Sm90Config<TA, TB, TO, 128, 6, 1, KMAJOR, SCALE, GROUPED>>{});
  if constexpr (!GROUPED) {
    if (t.tile_n == 128 && t.cluster_m == 2) {
      return run(TypeTag<Sm90Config<TA, TB, TO, 128, 6, 2, KMAJOR, SCALE, GROUPED>>{});
    }
  }
  if constexpr (SCALE != ScaleMode::kGroupwise) {
    if (t.tile_n == 256 && t.cluster_m == 1) {
      return run(TypeTag<Sm90Config<TA, TB, TO, 256, 4, 1, KMAJOR, SCALE, GROUPED>>{});
    }
    if constexpr (!GROUPED) {
      if (t.tile_n == 256 && t.cluster_m == 2) {
        return run(TypeTag<Sm90Config<TA, TB, TO, 256, 4, 2, KMAJOR, SCALE, GROUPED>>{});
      }
    }
  }
  return error("no sm90 kernel for tactic " + tactic_name(t));
}

template <bool GROUPED, class P>
Status sm90(const P& p, const Tactic& t, LaunchContext ctx) {
  const DType a = p.a_dtype, o = p.out_dtype;
  const bool kmajor = p.b_layout == BLayout::kKMajor;
  Status st = error(std::string("this module has no sm90 kernel for ") + dtype_name(a) + " -> " + dtype_name(o));
  auto with_out = [&](auto in, auto out) {
    using T = typename decltype(in)::type;
    using TO = typename decltype(out)::type;
    if constexpr (kBuilt<T>) {
      st = kmajor ? sm90_shape<T, T, TO, GROUPED, ScaleMode::kNone, true>(p, t, ctx)
                  : sm90_shape<T, T, TO, GROUPED, ScaleMode::kNone, false>(p, t, ctx);
    }
  };
  if (a == DType::kBF16 || a == DType::kF16) {
    dispatch_dtype<k16Bit>(a, [&](auto in) {
      if (o == DType::kF32) {
        with_out(in, TypeTag<float>{});
      } else {
        with_out(in, in);
      }
    });
    return st;
  }
  if constexpr (!GROUPED) {
    // fp8: (e4m3 | e5m2) x e4m3 -> bf16 | f16, per-tensor or groupwise.
    dispatch_dtype<kFp8Set>(a, [&](auto in) {
      dispatch_dtype<k16Bit>(o, [&](auto out) {
        using TA = typename decltype(in)::type;
        using TO = typename decltype(out)::type;
        if constexpr (kBuilt<TA>) {
          st = p.scale_mode == ScaleMode::kGroupwise
                   ? sm90_shape<TA, e4m3_t, TO, false, ScaleMode::kGroupwise, true>(p, t, ctx)
                   : sm90_shape<TA, e4m3_t, TO, false, ScaleMode::kPerTensor, true>(p, t, ctx);
        }
      });
    });
  }
  return st;
}

// ---- sm80 tiled and small-M ----------------------------------------------------------------

template <typename T>
Status sm80(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  const bool kmajor = p.b_layout == BLayout::kKMajor;
  if (t.stages == 3) return kmajor ? launch_gemm_sm80<T, true, 3>(p, ctx) : launch_gemm_sm80<T, false, 3>(p, ctx);
  return kmajor ? launch_gemm_sm80<T, true, 4>(p, ctx) : launch_gemm_sm80<T, false, 4>(p, ctx);
}

template <typename T>
Status small_m(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  // (tile_m, tile_n, split_k) -> <MT = tile_m / 8, R = tile_n / 16 (2 or 4), WK = split_k>
  auto by_split = [&](auto mt, auto r) -> Status {
    if (t.split_k == 4) return launch_gemm_small_m<T, mt(), r(), 4>(p, ctx);
    if constexpr (small_m::smem_bytes(mt(), r(), 8) <= 227 * 1024) {  // not listed otherwise
      return launch_gemm_small_m<T, mt(), r(), 8>(p, ctx);
    } else {
      return error("no small-m kernel for tactic " + tactic_name(t));
    }
  };
  auto by_rows = [&](auto mt) -> Status {
    if (t.tile_n == 32) return by_split(mt, std::integral_constant<int, 2>{});
    return by_split(mt, std::integral_constant<int, 4>{});
  };
  switch (t.tile_m) {
    case 8:
      return by_rows(std::integral_constant<int, 1>{});
    case 16:
      return by_rows(std::integral_constant<int, 2>{});
    case 32:
      return by_rows(std::integral_constant<int, 4>{});
    default:
      return by_rows(std::integral_constant<int, 8>{});
  }
}

template <template <typename> class F, typename... Args>
Status with_16bit(DType a, Args&&... args) {
  Status st = error(std::string("this module has no kernels for ") + dtype_name(a) + " inputs");
  dispatch_dtype<k16Bit>(a, [&](auto in) {
    using T = typename decltype(in)::type;
    if constexpr (kBuilt<T>) st = F<T>::run(args...);
  });
  return st;
}

template <typename T>
struct Sm80Op {
  static Status run(const GemmParams& p, const Tactic& t, LaunchContext ctx) { return sm80<T>(p, t, ctx); }
};
template <typename T>
struct SmallMOp {
  static Status run(const GemmParams& p, const Tactic& t, LaunchContext ctx) { return small_m<T>(p, t, ctx); }
};

// ---- fallback ------------------------------------------------------------------------------

Status fallback(const FallbackArgs& f, LaunchContext ctx) {
  const DType a = f.p.a_dtype, b = f.p.b_dtype;
  Status st = error(std::string("no fallback kernel for ") + dtype_name(a) + " x " + dtype_name(b));
  if (a == DType::kBF16 && b == a) return launch_gemm_fallback<bf16_t, bf16_t>(f, ctx);
  if (a == DType::kF16 && b == a) return launch_gemm_fallback<f16_t, f16_t>(f, ctx);
  dispatch_dtype<kFp8Set>(a, [&](auto ta) {
    dispatch_dtype<kFp8Set>(b, [&](auto tb) {
      st = launch_gemm_fallback<typename decltype(ta)::type, typename decltype(tb)::type>(f, ctx);
    });
  });
  return st;
}

// A probe instantiation: does this module hold sm_90a code for the sm90 kernels?
using ProbeConfig = Sm90Config<bf16_t, bf16_t, bf16_t, 128, 6, 1, true, ScaleMode::kNone, false>;

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
      if (cudaFuncGetAttributes(&attr, gemm_sm90_kernel<ProbeConfig>) != cudaSuccess || attr.binaryVersion != 90 ||
          (attr.ptxVersion != 0 && attr.ptxVersion != 90)) {
        cudaGetLastError();
        arch = 89;  // no sm_90a code: the sm80+ kernels only
      }
    }
    cached[device] = arch > 0 ? arch : -1;
  }
  return cached[device];
}

Status gemm(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return error("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.m == 0 || p.n == 0 || p.batch == 0) return Status::Ok();
  if (p.k == 0 || t.kernel == Kernel::kFallback) return fallback(FallbackArgs{p, false, {}}, ctx);  // k = 0: zeros
  switch (t.kernel) {
    case Kernel::kSm90:
      return sm90<false>(p, t, ctx);
    case Kernel::kSm80:
      return with_16bit<Sm80Op>(p.a_dtype, p, t, ctx);
    case Kernel::kSmallM:
      return with_16bit<SmallMOp>(p.a_dtype, p, t, ctx);
    default:
      return error("unknown kernel");
  }
}

Status grouped_gemm(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  if (std::string why = unsupported(p, t, device_arch(device)); !why.empty()) {
    return error("tactic " + tactic_name(t) + ": " + why);
  }
  if (p.num_groups == 0 || p.n == 0 || p.total_rows == 0) return Status::Ok();
  if (p.k == 0 || t.kernel == Kernel::kFallback) {
    FallbackArgs f{};
    f.grouped = true;
    f.g = p;
    f.p.m = p.total_rows, f.p.n = p.n, f.p.k = p.k, f.p.batch = 1;
    f.p.a = p.a, f.p.a_dtype = f.p.b_dtype = p.a_dtype, f.p.lda = p.lda;
    f.p.b = p.b, f.p.b_layout = p.b_layout, f.p.ldb = p.ldb;
    f.p.out = p.out, f.p.out_dtype = p.out_dtype, f.p.ldo = p.ldo;
    return fallback(f, ctx);
  }
  return sm90<true>(p, t, ctx);
}

}  // namespace kiln::gemm
