// The plain GEMM every problem can fall back to (kFallback): any m, n, k, any strides and
// alignments, both B layouts, every dtype pair (16-bit and fp8, with per-tensor or groupwise
// scales), batched and grouped. Float32 FMA on 64 x 64 tiles through shared memory; element loads
// are scalar and bounds-checked. It exists for correctness where the fast kernels' TMA or 16-byte
// vector rules do not hold (odd k such as 7 or 4097, misaligned pointers), not for speed.
//
// Groupwise scales are applied to the operands as they are loaded (a(i, k) * a_scale(i, k / 128),
// b(k, j) * b_scale(j / 128, k / 128)): the same sum as scaling each 128-wide block's partial.
// Grouped fp8: the same, with weight e's block scales at b_scale + e * b_scale_stride_w.
// Grouped: CTA tiles run over the rows of x; each CTA visits every segment overlapping its 64
// rows (a linear scan of the bounds, check_segment: CTA (0, 0) records a bad segment in the
// device's error record) and computes those rows with that segment's weight.
// With ctx.pdl it waits for the kernel before it (pdl_wait) before reading anything.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/math.h"
#include "ops/common/pdl.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_common.cuh"
#include "ops/gemm/gemm_kernels.h"
#include "ops/gemm/gemm_sm80.cuh"  // store_out

namespace kiln::gemm {

struct FallbackArgs {
  GemmParams p;  // dense: the problem; grouped: m = total rows, batch = 1, b = the weights
  bool grouped;
  GroupedGemmParams g;
  int64_t* errors;  // the device's index-error record (grouped), or null
};

namespace fallback_detail {
constexpr int BM = 64, BN = 64, BK = 16, kThreads = 256;
}

template <typename TA, typename TB>
__global__ void __launch_bounds__(256) gemm_fallback_kernel(const FallbackArgs f) {
  using namespace fallback_detail;
  __shared__ float as[BK][BM + 1];
  __shared__ float bs[BK][BN + 1];
  const GemmParams& p = f.p;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = int64_t(blockIdx.x) * BM, n0 = int64_t(blockIdx.y) * BN;
  const bool groupwise = p.scale_mode == ScaleMode::kGroupwise;
  pdl_wait();  // every operand may belong to the kernel before this one on the stream (ctx.pdl)
  const float alpha = p.scale_mode == ScaleMode::kPerTensor ? p.a_scale[0] * p.b_scale[0] : 1.0f;

  // One pass over k for rows [row_lo, row_hi) of this CTA's tile with operands a, b.
  auto run = [&](const TA* a, const TB* b, const float* b_scale, void* out, int64_t row_lo, int64_t row_hi) {
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.k; k0 += BK) {
      for (int idx = threadIdx.x; idx < BM * BK; idx += kThreads) {
        const int r = idx / BK, kk = idx % BK;
        const int64_t i = m0 + r, k = k0 + kk;
        float v = 0.0f;
        if (i >= row_lo && i < row_hi && k < p.k) {
          v = to_f32(a[i * p.lda + k]);
          if (groupwise) v *= p.a_scale[i * p.a_scale_stride_m + (k / kScaleBlock) * p.a_scale_stride_k];
        }
        as[kk][r] = v;
      }
      for (int idx = threadIdx.x; idx < BN * BK; idx += kThreads) {
        int c, kk;
        if (p.b_layout == BLayout::kKMajor) {
          c = idx / BK, kk = idx % BK;  // consecutive threads walk k: coalesced
        } else {
          kk = idx / BN, c = idx % BN;  // consecutive threads walk n
        }
        const int64_t j = n0 + c, k = k0 + kk;
        float v = 0.0f;
        if (j < p.n && k < p.k) {
          v = to_f32(p.b_layout == BLayout::kKMajor ? b[j * p.ldb + k] : b[k * p.ldb + j]);
          if (groupwise) {
            v *= b_scale[(j / kScaleBlock) * p.b_scale_stride_n + (k / kScaleBlock) * p.b_scale_stride_k];
          }
        }
        bs[kk][c] = v;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = m0 + ty + 16 * i;
      if (row < row_lo || row >= row_hi) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + tx + 16 * j;
        if (col < p.n) store_out(out, p.out_dtype, row * p.ldo + col, acc[i][j] * alpha);
      }
    }
  };

  if (!f.grouped) {
    const int64_t z = blockIdx.z;
    run(static_cast<const TA*>(p.a) + z * p.a_batch_stride, static_cast<const TB*>(p.b) + z * p.b_batch_stride,
        p.b_scale, static_cast<uint8_t*>(p.out) + z * p.out_batch_stride * dtype_bytes(p.out_dtype), 0, p.m);
    return;
  }
  const bool report = threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0;
  for (int64_t s = 0; s < f.g.num_groups; ++s) {
    const Segment seg = check_segment(f.g, s, report ? f.errors : nullptr);
    if (!seg.ok || seg.hi <= m0 || seg.lo >= m0 + BM) continue;
    const float* b_scale = groupwise ? p.b_scale + seg.weight * f.g.b_scale_stride_w : nullptr;
    run(static_cast<const TA*>(p.a), static_cast<const TB*>(p.b) + seg.weight * f.g.b_weight_stride, b_scale, p.out,
        seg.lo, seg.hi);
  }
}

template <typename TA, typename TB>
Status launch_gemm_fallback(const FallbackArgs& f, LaunchContext ctx) {
  using namespace fallback_detail;
  const GemmParams& p = f.p;
  const int64_t gx = ceil_div<int64_t>(p.m, BM), gy = ceil_div<int64_t>(p.n, BN);
  if (gx > 0x7fffffff || gy > 65535 || p.batch > 65535) {
    return Status::Error(1, "gemm (fallback): grid too large (m " + std::to_string(p.m) + ", n " + std::to_string(p.n) +
                                ", batch " + std::to_string(p.batch) + ")");
  }
  const dim3 grid(unsigned(gx), unsigned(gy), unsigned(f.grouped ? 1 : p.batch));
  // With ctx.pdl the dependents launch when this grid exits (the kernel never signals earlier).
  return cuda_status(kiln::launch(gemm_fallback_kernel<TA, TB>, grid, dim3(kThreads), 0, ctx, f),
                     "gemm (fallback) kernel launch");
}

// The fallback partitions (gemm_kernels.h): a dense problem, and a grouped one as rows of x.
template <typename TA, typename TB>
Status run_fallback(const GemmParams& p, LaunchContext ctx) {
  return launch_gemm_fallback<TA, TB>(FallbackArgs{p, false, {}, nullptr}, ctx);
}

template <typename T>
Status run_grouped_fallback(const GroupedGemmParams& g, LaunchContext ctx) {
  FallbackArgs f{};
  f.grouped = true;
  f.g = g;
  f.errors = ctx.errors;
  f.p.m = g.total_rows, f.p.n = g.n, f.p.k = g.k, f.p.batch = 1;
  f.p.a = g.a, f.p.a_dtype = f.p.b_dtype = g.a_dtype, f.p.lda = g.lda;
  f.p.b = g.b, f.p.b_layout = g.b_layout, f.p.ldb = g.ldb;
  f.p.out = g.out, f.p.out_dtype = g.out_dtype, f.p.ldo = g.ldo;
  f.p.scale_mode = g.scale_mode, f.p.a_scale = g.a_scale, f.p.b_scale = g.b_scale;
  f.p.a_scale_stride_m = g.a_scale_stride_m, f.p.a_scale_stride_k = g.a_scale_stride_k;
  f.p.b_scale_stride_n = g.b_scale_stride_n, f.p.b_scale_stride_k = g.b_scale_stride_k;
  return launch_gemm_fallback<T, T>(f, ctx);
}

}  // namespace kiln::gemm
