// GEMM with mma.sync for sm80+ (no wgmma): a tiled kernel (cp.async multi-stage, ldmatrix,
// m16n8k16, float32 accumulation) and the small-M decode kernel. 16-bit inputs (bf16, f16).
//
// Tiled (kSm80): CTA 128 x 128 x 64, 4 warps of 64 x 64, STAGES cp.async stages of
//   A [128 rows][64 k] and B [128 n][64 k] (K-major) or B [64 k][128 n] (N-major), 16-byte chunks
//   XOR-swizzled by row (chunk ^ (row % 8)) so cp.async stores and ldmatrix reads are free of bank
//   conflicts; B N-major is read with ldmatrix.trans. Out-of-range rows/chunks are zero-filled
//   (cp.async src-size 0) and stores are predicated: any M, N; K % 8 == 0 and 16-byte aligned
//   rows (16-byte chunks), N % 8 == 0 as well for an N-major B.
//
// Small M (kSmallM), decode: out^T = W x^T with W the [n, k] weight (K-major B) as the mma A
//   operand (16 weight rows per m16 tile) and x's m <= 64 rows as the n8 tiles. No ldmatrix and no
//   shared tiles: thread (g, t) of a warp copies W[row g (+8)][k0 + 8t .. 8t + 7] and
//   x[row g][k0 + 8t .. 8t + 7] (16 bytes each) and feeds its own chunks to the two mma k16 steps
//   of that 32-wide k slice, elements {0..3} then {4..7} -- a permutation of k that A and B share,
//   so the dot products are unchanged. The chunks travel through a per-thread cp.async ring
//   (several slices in flight per thread, L2 only); warps of a CTA take interleaved slices
//   (split-K) and add their partials in shared memory at the end. Requires K % 8 == 0 and
//   16-byte aligned x and W rows.
// Both write any output dtype (bf16, f16, f32: store_out, a run-time choice) and wait for the kernel
// before them (pdl_wait, ops/common/pdl.cuh) before their first load when launched with ctx.pdl.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"
#include "ops/common/pdl.cuh"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_common.cuh"
#include "ops/gemm/gemm_kernels.h"

namespace kiln::gemm {

// Epilogue helper shared by both kernels: one element of out, in the run-time output dtype.
__device__ __forceinline__ void store_out(void* out, DType t, int64_t at, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(out)[at] = v;
      break;
    case DType::kF16:
      static_cast<f16_t*>(out)[at] = __float2half_rn(v);
      break;
    default:
      static_cast<bf16_t*>(out)[at] = __float2bfloat16_rn(v);
      break;
  }
}

// Two consecutive elements (at, at + 1); `pair` when that is one aligned 4/8-byte store.
__device__ __forceinline__ void store_out2(void* out, DType t, int64_t at, float v0, float v1, bool pair) {
  if (pair) {
    switch (t) {
      case DType::kF32:
        store_pair(static_cast<float*>(out) + at, v0, v1);
        return;
      case DType::kF16:
        store_pair(static_cast<f16_t*>(out) + at, v0, v1);
        return;
      default:
        store_pair(static_cast<bf16_t*>(out) + at, v0, v1);
        return;
    }
  }
  store_out(out, t, at, v0);
  store_out(out, t, at + 1, v1);
}

struct Sm80Args {
  int64_t m, n, k;
  const void* a;
  int64_t lda, a_bs;
  const void* b;
  int64_t ldb, b_bs;
  void* out;
  int64_t ldo, o_bs;
  DType out_dtype;
  bool pair_store;  // out + even offsets is aligned for a two-element store
};

namespace sm80_detail {

constexpr int BM = 128, BN = 128, BK = 64, kThreads = 128;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;

// Byte offset of 16-byte chunk `c` of row `r` in a tile of `row_bytes`-long rows.
__device__ __forceinline__ uint32_t swz(int r, int c, int row_bytes) {
  return uint32_t(r * row_bytes + ((c ^ (r & 7)) << 4));
}

}  // namespace sm80_detail

template <typename T, bool B_KMAJOR, int STAGES>
__global__ void __launch_bounds__(128) gemm_sm80_kernel(const Sm80Args p) {
  using namespace sm80_detail;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 2, wn = warp % 2;  // warp tile 64 x 64
  const int g = lane / 4, t4 = lane % 4;
  const int64_t m0 = int64_t(blockIdx.x) * BM, n0 = int64_t(blockIdx.y) * BN;
  const T* A = static_cast<const T*>(p.a) + blockIdx.z * p.a_bs;
  const T* B = static_cast<const T*>(p.b) + blockIdx.z * p.b_bs;
  const int kt_count = int(ceil_div<int64_t>(p.k, BK));

  auto load_stage = [&](int st, int kt) {
    uint8_t* sa = smem + st * (A_BYTES + B_BYTES);
    uint8_t* sb = sa + A_BYTES;
    const int64_t k0 = int64_t(kt) * BK;
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // A: 128 rows x 8 chunks
      const int q = tid + kThreads * i, r = q / 8, c = q % 8;
      const bool ok = m0 + r < p.m && k0 + c * 8 < p.k;
      const T* src = ok ? A + (m0 + r) * p.lda + k0 + c * 8 : A;
      cp_async_16(sa + swz(r, c, 128), src, ok);
    }
    if constexpr (B_KMAJOR) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // B: 128 n rows x 8 chunks of k
        const int q = tid + kThreads * i, r = q / 8, c = q % 8;
        const bool ok = n0 + r < p.n && k0 + c * 8 < p.k;
        const T* src = ok ? B + (n0 + r) * p.ldb + k0 + c * 8 : B;
        cp_async_16(sb + swz(r, c, 128), src, ok);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // B: 64 k rows x 16 chunks of n
        const int q = tid + kThreads * i, r = q / 16, c = q % 16;
        const bool ok = k0 + r < p.k && n0 + c * 8 < p.n;
        const T* src = ok ? B + (k0 + r) * p.ldb + n0 + c * 8 : B;
        cp_async_16(sb + swz(r, c, 256), src, ok);
      }
    }
  };

  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  pdl_wait();  // A, B and out may belong to the kernel before this one on the stream (ctx.pdl)
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < kt_count) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt - 1 is no longer read
    if (kt + STAGES - 1 < kt_count) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const uint8_t* sa = smem + (kt % STAGES) * (A_BYTES + B_BYTES);
    const uint8_t* sb = sa + A_BYTES;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      uint32_t af[4][4], bfr[8][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int r = wm * 64 + mi * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
        ldmatrix_x4(af[mi], sa + swz(r, ks * 2 + lane / 16, 128));
      }
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {  // n8 tiles 2 nj, 2 nj + 1
        uint32_t r4[4];
        if constexpr (B_KMAJOR) {
          const int r = wn * 64 + nj * 16 + (lane % 8) + (lane / 16) * 8;
          ldmatrix_x4(r4, sb + swz(r, ks * 2 + (lane / 8) % 2, 128));
        } else {
          const int kr = ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
          ldmatrix_x4_trans(r4, sb + swz(kr, (wn * 64 + nj * 16) / 8 + lane / 16, 256));
        }
        bfr[2 * nj][0] = r4[0], bfr[2 * nj][1] = r4[1];
        bfr[2 * nj + 1][0] = r4[2], bfr[2 * nj + 1][1] = r4[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) mma_16x8x16<T>(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  cp_async_wait<0>();
  pdl_launch_dependents();  // every load of this CTA has landed

  void* out = static_cast<uint8_t*>(p.out) + blockIdx.z * p.o_bs * dtype_bytes(p.out_dtype);
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + wm * 64 + mi * 16 + g + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int64_t col = n0 + wn * 64 + ni * 8 + 2 * t4;
        const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (col + 1 < p.n) {
          store_out2(out, p.out_dtype, row * p.ldo + col, v0, v1, p.pair_store);
        } else if (col < p.n) {
          store_out(out, p.out_dtype, row * p.ldo + col, v0);
        }
      }
    }
}

template <typename T, bool B_KMAJOR, int STAGES>
Status launch_gemm_sm80(const GemmParams& p, LaunchContext ctx) {
  using namespace sm80_detail;
  constexpr size_t smem = size_t(STAGES) * (A_BYTES + B_BYTES);
  constexpr auto kernel = gemm_sm80_kernel<T, B_KMAJOR, STAGES>;
  int device = 0;
  cudaGetDevice(&device);
  Status st = cuda_status(allow_smem<kernel>(smem, device), "gemm (sm80): raising the shared-memory limit");
  if (!st.ok()) {
    cudaGetLastError();  // the failed attribute call must not be reported by the next launch
    return st;
  }
  Sm80Args a{p.m,         p.n,   p.k,
             p.a,         p.lda, p.a_batch_stride,
             p.b,         p.ldb, p.b_batch_stride,
             p.out,       p.ldo, p.out_batch_stride,
             p.out_dtype, false};
  const int64_t eo = dtype_bytes(p.out_dtype);
  a.pair_store = reinterpret_cast<uintptr_t>(p.out) % (2 * eo) == 0 && p.ldo % 2 == 0 &&
                 (p.batch == 1 || p.out_batch_stride % 2 == 0);
  const dim3 grid(unsigned(ceil_div<int64_t>(p.m, BM)), unsigned(ceil_div<int64_t>(p.n, BN)), unsigned(p.batch));
  return cuda_status(kiln::launch(kernel, grid, dim3(kThreads), smem, ctx, a), "gemm (sm80) kernel launch");
}

// ---- small M -----------------------------------------------------------------------------------

struct SmallMArgs {
  int64_t m, n, k;
  const void* x;  // A [m, k]
  int64_t ldx, x_bs;
  const void* w;  // B K-major: W [n, k]
  int64_t ldw, w_bs;
  void* out;
  int64_t ldo, o_bs;
  DType out_dtype;
  int64_t batch;
};

// Shape of the small-M kernel <MT, R, WK>: 16-byte chunks each thread copies per k slice and
// row (CPT = 1: the four lanes of a row read 64 contiguous bytes per copy instruction; v2's two
// chunks a lane, 32 bytes apart, left half of every sector to a second request and ran 2-3x
// slower), the slice's k extent, and the ring depth: as many slices as fit in 96 KB (two CTAs
// per SM), 2..8.
template <int MT, int R, int WK>
struct SmallMShape {
  static constexpr int NT = WK * 32;
  static constexpr int CPT = 1;
  static constexpr int SLICE_K = 32 * CPT;  // k of one warp slice
  static constexpr int CH = CPT * (2 * R + MT);
  static constexpr int S = small_m::stages(MT, R, WK);
  static constexpr int VALS = R * MT * 4;  // accumulators a thread
  static constexpr size_t RING_BYTES = size_t(small_m::ring_bytes(MT, R, WK));
  static constexpr size_t kSmemBytes = size_t(small_m::smem_bytes(MT, R, WK));
  static_assert(CH * 16 * NT == small_m::slice_bytes(MT, R, WK), "one formula for the ring");
};

// MT: n8 tiles of x rows (m <= 8 MT); R: m16 tiles of weight rows per block; WK: warps (split-K).
// Persistent: CTA b takes row blocks b, b + gridDim.x, ... (batch folded in), and each thread's
// cp.async ring runs across block boundaries, so the next block's first slices are in flight
// while the current block's partials are reduced. Each thread streams its own chunks ([stage]
// [chunk][thread] in shared memory, conflict-free) and reads them back itself: no barrier except
// the per-block reduction. (Register loads straight into the mma operands were scheduled by
// ptxas one slice at a time, one slice in flight per thread; one block per CTA left the last
// wave of CTAs part-empty; docs/perf/gemm.md has the figures.)
template <typename T, int MT, int R, int WK>
__global__ void __launch_bounds__(WK * 32) gemm_small_m_kernel(const SmallMArgs p) {
  using Sh = SmallMShape<MT, R, WK>;
  constexpr int NT = Sh::NT, CPT = Sh::CPT, CH = Sh::CH, S = Sh::S, VALS = Sh::VALS, SK = Sh::SLICE_K;
  extern __shared__ uint4 ring[];  // [S][CH][NT], then float red[WK][VALS][32]
  float* red = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(ring) + Sh::RING_BYTES);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int64_t row_blocks = ceil_div<int64_t>(p.n, 16 * R);
  const int64_t total_blocks = row_blocks * p.batch;
  const int my_blocks = blockIdx.x < total_blocks ? int((total_blocks - 1 - blockIdx.x) / gridDim.x + 1) : 0;
  // Slice q of this warp in a block covers k [warp * SK + q * WK * SK, + SK); thread chunk c of a
  // row at + 8 (CPT t4 + c). Rows past n (weight) or m (x) read row 0: their products land only in
  // outputs never stored. Chunks past k are zero-filled (cp.async src-size 0).
  const int64_t first = int64_t(warp) * SK;
  const int spb = p.k > first ? int((p.k - first + int64_t(WK) * SK - 1) / (int64_t(WK) * SK)) : 0;
  const int total = my_blocks * spb;
  auto block_of = [&](int i) { return int64_t(blockIdx.x) + int64_t(i) * gridDim.x; };
  // The issue cursor runs S - 1 slices ahead of the consumer, across block boundaries; its row
  // pointers change once per block (no division per slice: the index math would cost more
  // issue slots than the copies).
  const T* src[R * 2 + MT];
  int isl = 0, ibi = 0, islot = 0;
  auto point = [&](int bi) {
    const int64_t blk = block_of(bi);
    const int64_t bz = blk / row_blocks, n0 = (blk % row_blocks) * 16 * R;
    const T* X = static_cast<const T*>(p.x) + bz * p.x_bs;
    const T* W = static_cast<const T*>(p.w) + bz * p.w_bs;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = n0 + 16 * i + g + 8 * h;
        src[2 * i + h] = W + (r < p.n ? r : 0) * p.ldw + first + 8 * CPT * t4;
      }
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int64_t r = 8 * j + g;
      src[2 * R + j] = X + (r < p.m ? r : 0) * p.ldx + first + 8 * CPT * t4;
    }
  };
  pdl_wait();  // x, W and out may belong to the kernel before this one on the stream (ctx.pdl)
  // The next kernel may launch now: it waits for this grid to complete before reading anything,
  // and every CTA of this persistent grid is already resident.
  pdl_launch_dependents();
  if (total > 0) point(0);
  auto issue = [&] {
    const int64_t off = int64_t(isl) * WK * SK;  // from the thread's first chunk
    const int64_t kk = first + off + 8 * CPT * t4;
    uint4* dst = ring + islot * CH * NT + tid;
#pragma unroll
    for (int r = 0; r < 2 * R + MT; ++r)
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const bool ok = kk + 8 * c < p.k;
        cp_async_16(dst + (r * CPT + c) * NT, ok ? src[r] + off + 8 * c : src[r], ok);
      }
    if (++islot == S) islot = 0;
    if (++isl == spb) {
      isl = 0;
      if (++ibi < my_blocks) point(ibi);
    }
  };

#pragma unroll
  for (int q = 0; q < S - 1; ++q) {
    if (q < total) issue();
    cp_async_commit();
  }
  int slot = 0;
  for (int bi = 0; bi < my_blocks; ++bi) {
    float acc[R][MT][4];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int sl = 0; sl < spb; ++sl) {
      const int q = bi * spb + sl;
      cp_async_wait<S - 2>();          // slice q landed (this thread's own chunks)
      if (q + S - 1 < total) issue();  // slice q + S - 1, into the slot slice q - 1 used
      cp_async_commit();
      const uint4* cur = ring + slot * CH * NT + tid;
      if (++slot == S) slot = 0;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        uint4 wv[R][2], xv[MT];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) wv[i][h] = cur[((2 * i + h) * CPT + c) * NT];
#pragma unroll
        for (int j = 0; j < MT; ++j) xv[j] = cur[((2 * R + j) * CPT + c) * NT];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            const uint32_t a0[4] = {wv[i][0].x, wv[i][1].x, wv[i][0].y, wv[i][1].y};
            mma_16x8x16<T>(acc[i][j], a0, xv[j].x, xv[j].y);
            const uint32_t a1[4] = {wv[i][0].z, wv[i][1].z, wv[i][0].w, wv[i][1].w};
            mma_16x8x16<T>(acc[i][j], a1, xv[j].z, xv[j].w);
          }
      }
    }
    // ---- the block's split-K partials, added over the warps ----
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(warp * VALS + (i * MT + j) * 4 + e) * 32 + lane] = acc[i][j][e];
    __syncthreads();
    const int64_t blk = block_of(bi);
    const int64_t bz = blk / row_blocks, n0 = (blk % row_blocks) * 16 * R;
    void* out = static_cast<uint8_t*>(p.out) + bz * p.o_bs * dtype_bytes(p.out_dtype);
    for (int idx = tid; idx < VALS * 32; idx += NT) {
      const int v = idx / 32, l = idx % 32;
      const int i = v / (MT * 4), j = (v / 4) % MT, e = v % 4;
      const int64_t n = n0 + 16 * i + l / 4 + 8 * (e >> 1);
      const int64_t m = 8 * j + 2 * (l % 4) + (e & 1);
      if (n >= p.n || m >= p.m) continue;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < WK; ++w) sum += red[(w * VALS + v) * 32 + l];
      store_out(out, p.out_dtype, m * p.ldo + n, sum);
    }
    __syncthreads();  // red is rewritten by the next block
  }
  cp_async_wait<0>();
}

// CTAs of the persistent small-M grid: what the occupancy calculator fits per SM, on every SM.
template <typename T, int MT, int R, int WK>
int small_m_resident(int device) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return sm_count();
  if (cached[device] == 0) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemm_small_m_kernel<T, MT, R, WK>, WK * 32,
                                                      SmallMShape<MT, R, WK>::kSmemBytes) != cudaSuccess ||
        per_sm < 1) {
      cudaGetLastError();
      per_sm = 1;
    }
    cached[device] = per_sm * sm_count();
  }
  return cached[device];
}

template <typename T, int MT, int R, int WK>
Status launch_gemm_small_m(const GemmParams& p, LaunchContext ctx) {
  using Sh = SmallMShape<MT, R, WK>;
  constexpr auto kernel = gemm_small_m_kernel<T, MT, R, WK>;
  int device = 0;
  cudaGetDevice(&device);
  Status st =
      cuda_status(allow_smem<kernel>(Sh::kSmemBytes, device), "gemm (small m): raising the shared-memory limit");
  if (!st.ok()) {
    cudaGetLastError();  // the failed attribute call must not be reported by the next launch
    return st;
  }
  SmallMArgs a{p.m,         p.n,    p.k,
               p.a,         p.lda,  p.a_batch_stride,
               p.b,         p.ldb,  p.b_batch_stride,
               p.out,       p.ldo,  p.out_batch_stride,
               p.out_dtype, p.batch};
  const int64_t blocks = ceil_div<int64_t>(p.n, 16 * R) * p.batch;
  const int64_t grid = std::min<int64_t>(blocks, small_m_resident<T, MT, R, WK>(device));
  return cuda_status(kiln::launch(kernel, dim3(unsigned(grid)), dim3(WK * 32), Sh::kSmemBytes, ctx, a),
                     "gemm (small m) kernel launch");
}

// ---- the partitions of gemm_kernels.h: a tactic's shape -> one instantiation -----------------

template <typename T>
Status run_sm80(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  const bool kmajor = p.b_layout == BLayout::kKMajor;
  if (t.stages == 3) return kmajor ? launch_gemm_sm80<T, true, 3>(p, ctx) : launch_gemm_sm80<T, false, 3>(p, ctx);
  return kmajor ? launch_gemm_sm80<T, true, 4>(p, ctx) : launch_gemm_sm80<T, false, 4>(p, ctx);
}

// (tile_m, tile_n, split_k) -> <MT = tile_m / 8, R = tile_n / 16 (2 or 4), WK = split_k>; the
// shapes whose shared memory fits no CTA are not listed (all_tactics) and not instantiated.
template <typename T>
Status run_small_m(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  auto by_split = [&](auto mt, auto r) -> Status {
    if (t.split_k == 4) return launch_gemm_small_m<T, mt(), r(), 4>(p, ctx);
    if constexpr (small_m::smem_bytes(mt(), r(), 8) <= 227 * 1024) {
      return launch_gemm_small_m<T, mt(), r(), 8>(p, ctx);
    } else {
      return Status::Error(1, "gemm: no small-m kernel for tactic " + tactic_name(t));
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

}  // namespace kiln::gemm
