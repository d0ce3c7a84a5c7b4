// GEMM for Hopper (sm_90a): persistent, warp-specialised TMA + wgmma, float32 accumulation.
// docs/perf/gemm.md has the design notes, floors and measurements; gemm.h the contract.
//
// One CTA = 384 threads, one 128 x BN output tile at a time, tiles taken in a fixed order
// (persistent grid of at most one CTA per SM, or one cluster per SM pair):
//   warpgroup 0, producer: one thread issues the TMA loads of A (128 rows x 128 bytes of K) and
//     B (BN rows x 128 bytes, or 128 bytes of N x BK rows for an N-major B) into a STAGES-deep
//     ring; "full" mbarriers count the bytes, "empty" mbarriers count one arrival per consumer
//     warp (of every CTA of the cluster, which all read what this CTA's multicast wrote).
//   warpgroups 1 and 2, consumers: rows 64 w .. 64 w + 63 of the tile each, BK / 16 (or / 32 for
//     fp8) wgmma m64nBNk16 (k32) per stage, A and B from shared memory; one wgmma group stays in
//     flight while the previous stage is released. Epilogue: alpha * acc converted to the output
//     type, written in 64-row x 128-byte chunks to a swizzled shared buffer (two per warpgroup,
//     alternating) and stored by TMA (dense) or by 16-byte stores clipped to the segment (grouped).
//   CLUSTER = 2: two CTAs on vertically adjacent tiles (same B tile) each load half of B and
//     multicast it to both; A is loaded per CTA.
//   Groupwise fp8 (DeepSeek-V3): BK = 128 = the scale block; each stage's wgmma go to one of two
//     partial accumulators (first k-step overwrites); while the next stage's wgmma run into the
//     other, the finished one is added to the tile's with a_scale(row, kb) * b_scale(n-block, kb).
//   A warpgroup whose 64 rows are all past the last row of its tile (M or segment tail) skips
//     its wgmma and its stores.
//   Grouped fp8 (MoE with e4m3 weights): the same groupwise loop, b_scale offset by the tile's
//     weight (b_scale(e, n-block, kb)).
//   Grouped: tiles of segment s are ceil(rows_s / 128) x n_tiles, segment after segment; each warp
//     that needs a tile's segment finds it with a warp scan over 32 segments at a time (the tile
//     index only grows, so the scan resumes where it stopped). A's rows past a segment's end
//     belong to the next segment or are TMA zero-fill: computed, never stored.
// M/N/K tails: TMA zero-fills out-of-bounds boxes (K sums over zeros); stores are clipped.
// Programmatic dependent launch (ctx.pdl, ops/common/pdl.cuh): every thread waits (pdl_wait) after
//   the barrier set-up, before the producer's first TMA load and the consumers' first scale or
//   segment read, and lets the next kernel be scheduled right away (the grid is resident whole).
// Requirements (gemm_tactics.cc, unsupported()): 16-byte aligned a, b, out; row and batch strides
// multiples of 16 bytes; fp8 needs a K-major B; groupwise needs BN = 128 and k % 128 == 0.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/math.h"
#include "ops/common/pdl.cuh"
#include "ops/common/sm90.cuh"
#include "ops/common/tma_host.h"
#include "ops/gemm/gemm.h"
#include "ops/gemm/gemm_common.cuh"
#include "ops/gemm/gemm_kernels.h"

namespace kiln::gemm {

template <typename TA, typename TB, typename TO, int BN_, int STAGES_, int CLUSTER_, bool B_KMAJOR_, ScaleMode SCALE_,
          bool GROUPED_>
struct Sm90Config {
  using A = TA;
  using B = TB;
  using Out = TO;
  static constexpr int BM = 128, BN = BN_, STAGES = STAGES_, CLUSTER = CLUSTER_;
  static constexpr bool B_KMAJOR = B_KMAJOR_, GROUPED = GROUPED_;
  static constexpr ScaleMode SCALE = SCALE_;
  static constexpr bool FP8 = kIsFp8<TA>;
  static constexpr int BK = 128 / int(sizeof(TA));  // one 128-byte swizzle row of K per stage
  static constexpr int K_STEPS = 4;                 // wgmma k16 (16-bit) or k32 (fp8): 32 bytes each
  static constexpr int A_BYTES = BM * 128;
  static constexpr int B_BYTES = BN * 128;
  static constexpr int EPI_CHUNK = 64 * 128;  // 64 rows x 128 bytes of output
  static constexpr int EPI_BYTES = 2 * 2 * EPI_CHUNK;
  static constexpr int B_OFFSET = STAGES * A_BYTES;
  static constexpr int EPI_OFFSET = B_OFFSET + STAGES * B_BYTES;
  static constexpr int BAR_OFFSET = EPI_OFFSET + EPI_BYTES;
  static constexpr size_t kSmemBytes = size_t(BAR_OFFSET) + 2 * STAGES * 8 + 1024;  // + alignment slack
  static constexpr int kThreads = 384;
  // Registers: 384 x 168 = 64512 at launch; the producer keeps 40 (56 with the segment scan).
  static constexpr int PRODUCER_REGS = GROUPED ? 56 : 40;
  static constexpr int CONSUMER_REGS = (3 * 168 - PRODUCER_REGS) / 2;
  static constexpr int EMPTY_ARRIVALS = 8 * CLUSTER;      // lane 0 of each consumer warp of each CTA
  static constexpr int STAGE_TX = A_BYTES + B_BYTES;      // bytes landing in one CTA per stage
  static constexpr int OUT_COLS = 128 / int(sizeof(TO));  // output columns per 128-byte chunk

  static_assert(sizeof(TA) == sizeof(TB), "A and B: both 16-bit or both fp8");
  static_assert(BN == 128 || BN == 256, "BN");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "CLUSTER");
  static_assert(!FP8 || B_KMAJOR, "wgmma takes 8-bit operands K-major only");
  static_assert(SCALE != ScaleMode::kGroupwise || (FP8 && BN == 128), "groupwise: fp8, BN = the scale block");
  static_assert(!GROUPED || CLUSTER == 1, "grouped: no clusters");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

// Everything a CTA needs besides the tensor maps (by value, __grid_constant__).
struct Sm90Args {
  int32_t m, n, k, batch;
  int32_t m_tiles, n_tiles, k_blocks;  // m_tiles rounded up to a multiple of CLUSTER
  int32_t raster;                      // cluster rows per raster band (L2 reuse)
  const float* a_scale;
  const float* b_scale;
  int64_t sa_m, sa_k, sb_n, sb_k;
  int64_t sb_w;         // grouped groupwise: b_scale's stride between weights (dense: 0)
  GroupedGemmParams g;  // grouped only
  int64_t* errors;      // grouped only: the device's index-error record (or null)
};

namespace sm90_detail {

// Named barriers: 1 + w orders consumer warpgroup w's epilogue buffer (id 0 is __syncthreads').
constexpr int kEpiBarrier = 1;

struct Tile {
  int m0, n0, batch;  // first row, first column, batch (grouped: weight index)
  int row_end;        // rows >= row_end are not stored (grouped: the segment's end)
  bool valid;
};

// Dense tile order: cluster-row bands of `raster` cluster rows, n inside a band, batch outermost.
template <int CLUSTER>
__device__ __forceinline__ Tile dense_tile(const Sm90Args& a, int t, int rank) {
  const int mc_tiles = a.m_tiles / CLUSTER;
  const int per_batch = mc_tiles * a.n_tiles;
  Tile r;
  r.batch = t / per_batch;
  const int idx = t - r.batch * per_batch;
  const int band = idx / (a.raster * a.n_tiles);
  const int rows = min(a.raster, mc_tiles - band * a.raster);
  const int in_band = idx - band * a.raster * a.n_tiles;
  const int mc = band * a.raster + in_band % rows;
  r.m0 = (mc * CLUSTER + rank) * 128;
  r.n0 = in_band / rows;  // n tile index, scaled by the caller
  r.row_end = a.m;
  r.valid = t < per_batch * a.batch;
  return r;
}

// Grouped tile order, found by a warp (all 32 lanes call it with the same t, t non-decreasing).
struct SegmentCursor {
  int64_t base = 0;          // first segment of the current 32-segment window
  int64_t tiles_before = 0;  // tiles of the segments before `base`

  __device__ __forceinline__ Tile find(const Sm90Args& a, int64_t t, bool report) {
    const GroupedGemmParams& g = a.g;
    const int lane = threadIdx.x % 32;
    while (base < g.num_groups) {
      const int64_t s = base + lane;
      Segment seg{0, 0, 0, true};
      if (s < g.num_groups) seg = check_segment(g, s, report ? a.errors : nullptr);
      const int64_t mts = (seg.hi - seg.lo + 127) / 128;
      const int64_t tiles = mts * a.n_tiles;
      int64_t cum = tiles;  // inclusive scan over the window
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, cum, o);
        if (lane >= o) cum += v;
      }
      const int64_t total = __shfl_sync(0xffffffffu, cum, 31);
      const int64_t local = t - tiles_before;
      if (local < total) {
        const unsigned hit = __ballot_sync(0xffffffffu, cum > local);
        const int src = __ffs(hit) - 1;
        const int64_t excl = __shfl_sync(0xffffffffu, cum - tiles, src);
        const int64_t lo = __shfl_sync(0xffffffffu, seg.lo, src);
        const int64_t hi = __shfl_sync(0xffffffffu, seg.hi, src);
        const int64_t w = __shfl_sync(0xffffffffu, seg.weight, src);
        const int64_t in_seg = local - excl;
        const int64_t seg_mts = (hi - lo + 127) / 128;
        Tile r;
        r.m0 = int(lo + (in_seg % seg_mts) * 128);
        r.n0 = int(in_seg / seg_mts);
        r.batch = int(w);
        r.row_end = int(hi);
        r.valid = true;
        return r;
      }
      tiles_before += total;
      base += 32;
    }
    Tile r{};
    r.valid = false;
    return r;
  }
};

}  // namespace sm90_detail

template <class C>
__global__ void __launch_bounds__(384, 1)
    gemm_sm90_kernel(const __grid_constant__ Sm90Args args, const __grid_constant__ CUtensorMap ta,
                     const __grid_constant__ CUtensorMap tb, const __grid_constant__ CUtensorMap tout) {
#if defined(KILN_SM90A)
  using namespace sm90_detail;
  using TO = typename C::Out;
  constexpr int BN = C::BN, BK = C::BK, STAGES = C::STAGES, CLUSTER = C::CLUSTER;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzle atoms are 1024 bytes: TMA boxes and wgmma descriptors (base offset 0)
  // assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sa = smem;
  uint8_t* sb = smem + C::B_OFFSET;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::BAR_OFFSET);
  uint64_t* empty = full + STAGES;

  const int rank = CLUSTER > 1 ? int(sm90::cluster_ctarank()) : 0;
  const int cluster = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
  const int64_t dense_tiles = int64_t(args.m_tiles / CLUSTER) * args.n_tiles * args.batch;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], C::EMPTY_ARRIVALS);
    }
    sm90::fence_barrier_init();
  }
  if constexpr (CLUSTER > 1) {
    sm90::cluster_sync();  // the peer's barriers exist before anyone arrives on them
  } else {
    __syncthreads();
  }
  // Programmatic dependent launch: the prologue above touched shared memory only; A, B, the
  // scales, the segment bounds and out may belong to the kernel before this one on the stream
  // (a no-op unless launched with the attribute: ctx.pdl). The persistent grid is resident whole,
  // so the next kernel may be scheduled at once: it starts on the SMs this grid's CTAs leave and
  // waits (its own pdl_wait) for this grid to complete.
  pdl_wait();
  pdl_launch_dependents();

  // The tile sequence of this CTA (the same for producer and consumers).
  SegmentCursor cursor;
  auto tile_at = [&](int64_t t, bool report) -> Tile {
    if constexpr (C::GROUPED) {
      Tile r = cursor.find(args, t, report);
      r.n0 *= BN;
      return r;
    } else {
      Tile r = dense_tile<CLUSTER>(args, int(t), rank);
      r.valid = t < dense_tiles;
      r.n0 *= BN;
      return r;
    }
  };

  if (threadIdx.x < 128) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<C::PRODUCER_REGS>();
    if (threadIdx.x < 32) {
      const bool leader = threadIdx.x == 0;
      if (leader) {
        sm90::prefetch_tensor_map(&ta);
        sm90::prefetch_tensor_map(&tb);
      }
      int s = 0;
      uint32_t phase = 0;
      for (int64_t t = cluster;; t += clusters) {
        const Tile tile = tile_at(t, false);
        if (!tile.valid) break;
        if (leader) {
          const int a_batch = C::GROUPED ? 0 : tile.batch;
          for (int kb = 0; kb < args.k_blocks; ++kb) {
            sm90::mbar_wait(&empty[s], phase ^ 1);
            sm90::mbar_arrive_expect_tx(&full[s], C::STAGE_TX);
            sm90::tma_load_3d(sa + s * C::A_BYTES, &ta, &full[s], kb * BK, tile.m0, a_batch);
            uint8_t* dst = sb + s * C::B_BYTES;
            if constexpr (C::B_KMAJOR) {
              // Box of BN / CLUSTER rows (n) x BK; rank r's half lands at rows r * BN / 2 everywhere.
              constexpr int ROWS = BN / CLUSTER;
              if constexpr (CLUSTER == 1) {
                sm90::tma_load_3d(dst, &tb, &full[s], kb * BK, tile.n0, tile.batch);
              } else {
                sm90::tma_load_3d_multicast(dst + rank * ROWS * 128, &tb, &full[s], uint16_t((1u << CLUSTER) - 1),
                                            kb * BK, tile.n0 + rank * ROWS, tile.batch);
              }
            } else {
              // Chunks of 64 columns (n) x BK rows (k), 8 KB each; rank r loads its share.
              constexpr int CHUNKS = BN / 64 / CLUSTER;
#pragma unroll
              for (int c = rank * CHUNKS; c < (rank + 1) * CHUNKS; ++c) {
                if constexpr (CLUSTER == 1) {
                  sm90::tma_load_3d(dst + c * 64 * 128, &tb, &full[s], tile.n0 + 64 * c, kb * BK, tile.batch);
                } else {
                  sm90::tma_load_3d_multicast(dst + c * 64 * 128, &tb, &full[s], uint16_t((1u << CLUSTER) - 1),
                                              tile.n0 + 64 * c, kb * BK, tile.batch);
                }
              }
            }
            if (++s == STAGES) s = 0, phase ^= 1;
          }
        }
        __syncwarp();
      }
    }
  } else {
    // ---------------- consumers ----------------
    sm90::setmaxnreg_inc<C::CONSUMER_REGS>();
    const int cw = threadIdx.x / 128 - 1;  // rows 64 cw .. 64 cw + 63 of the tile
    const int ct = threadIdx.x % 128;
    const int warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t4 = lane % 4;
    const uint32_t a_base = sm90::smem_u32(sa) + cw * 64 * 128;
    const uint32_t b_base = sm90::smem_u32(sb);
    uint8_t* ebuf = smem + C::EPI_OFFSET + cw * 2 * C::EPI_CHUNK;
    float alpha = 1.0f;
    if constexpr (C::SCALE == ScaleMode::kPerTensor) alpha = args.a_scale[0] * args.b_scale[0];

    auto release = [&](int st) {
      if (lane == 0) {
        if constexpr (CLUSTER == 1) {
          sm90::mbar_arrive(&empty[st]);
        } else {
#pragma unroll
          for (int r = 0; r < CLUSTER; ++r) sm90::mbar_arrive_cluster(&empty[st], r);
        }
      }
    };
    // The k-steps of stage st into acc (scale_d 0 on the first: overwrite).
    auto issue = [&](int st, float (&acc)[BN / 2], bool overwrite) {
#pragma unroll
      for (int kk = 0; kk < C::K_STEPS; ++kk) {
        const uint64_t da = sm90::smem_desc_sw128(a_base + st * C::A_BYTES + kk * 32, 16, 1024);
        const int sd = (overwrite && kk == 0) ? 0 : 1;
        if constexpr (C::FP8) {
          const uint64_t db = sm90::smem_desc_sw128(b_base + st * C::B_BYTES + kk * 32, 16, 1024);
          sm90::wgmma_ss_fp8<BN, std::is_same_v<typename C::A, e5m2_t>, std::is_same_v<typename C::B, e5m2_t>>(acc, da,
                                                                                                               db, sd);
        } else if constexpr (C::B_KMAJOR) {
          const uint64_t db = sm90::smem_desc_sw128(b_base + st * C::B_BYTES + kk * 32, 16, 1024);
          sm90::wgmma_ss_tb<typename C::A, BN, false>(acc, da, db, sd);
        } else {
          // MN-major: 16 k rows of 128 bytes per step; LBO = one 64-column chunk (BK rows).
          const uint64_t db = sm90::smem_desc_sw128(b_base + st * C::B_BYTES + kk * 16 * 128, BK * 128, 1024);
          sm90::wgmma_ss_tb<typename C::A, BN, true>(acc, da, db, sd);
        }
      }
    };

    int s = 0;
    uint32_t phase = 0;
    for (int64_t t = cluster;; t += clusters) {
      const Tile tile = tile_at(t, warp == 0 && cw == 0);
      if (!tile.valid) break;
      // A warpgroup whose 64 rows all lie past the tile's last row (the 64-row tail of M, or of
      // a segment) consumes its stages without computing and stores nothing: the other
      // warpgroup's wgmma then have the tensor cores to themselves.
      if (tile.m0 + 64 * cw >= tile.row_end) {
        for (int kb = 0; kb < args.k_blocks; ++kb) {
          sm90::mbar_wait(&full[s], phase);
          release(s);
          if (++s == STAGES) s = 0, phase ^= 1;
        }
        continue;
      }
      float acc[BN / 2];
      if constexpr (C::SCALE == ScaleMode::kGroupwise) {
        // Two partial accumulators: stage kb + 1's wgmma run into one while stage kb's partial
        // (the other) is scaled into acc by a_scale(row, kb) * b_scale(n-block, kb) -- rows
        // m0 + 64 cw + 16 warp + g (+ 8).
        const int row0 = tile.m0 + 64 * cw + 16 * warp + g;
        const int nb = tile.n0 / 128;
        auto load_scales = [&](int kb, float (&sc)[2]) {
          const float bs = args.b_scale[tile.batch * args.sb_w + nb * args.sb_n + kb * args.sb_k];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            sc[h] = r < args.m ? args.a_scale[int64_t(r) * args.sa_m + kb * args.sa_k] * bs : 0.0f;
          }
        };
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
        float part0[BN / 2], part1[BN / 2];
        float sc0[2], sc1[2];
        int rs = s;  // the stage to release next (issue runs one ahead)
        auto start = [&](float (&part)[BN / 2]) {
          sm90::mbar_wait(&full[s], phase);
          sm90::fence_regs(part);  // every read of part's previous stage stays before its overwrite
          sm90::wgmma_fence();
          issue(s, part, true);
          sm90::wgmma_commit();
          if (++s == STAGES) s = 0, phase ^= 1;
        };
        auto finish = [&](float (&part)[BN / 2], const float (&sc)[2]) {
          sm90::fence_regs(part);
          release(rs);
          if (++rs == STAGES) rs = 0;
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[i] = fmaf(part[i], sc[(i >> 1) & 1], acc[i]);
          sm90::fence_regs(part);
          sm90::fence_regs(acc);
        };
        // Stages in pairs: both issued, the first scaled while the second runs, then the second
        // (the other warpgroup's wgmma fill that gap). ptxas keeps this pipelined because every
        // pair drains to wait_group 0; chaining the pairs (issue kb + 2 before scaling kb + 1),
        // a conditional wait_group 0 or an empty commit group made it serialise every wgmma
        // (C7514, C7518). An odd first stage is peeled.
        // Scales travel one pair ahead (loaded while the previous pair's wgmma run: a load
        // issued with its own stage came back after the wgmma and stalled the scaling).
        float nx0[2], nx1[2];
        int kb = 0;
        if (args.k_blocks & 1) {
          load_scales(0, sc0);
          start(part0);
          sm90::wgmma_wait<0>();
          finish(part0, sc0);
          kb = 1;
        }
        if (kb < args.k_blocks) load_scales(kb, sc0), load_scales(kb + 1, sc1);
        for (; kb < args.k_blocks; kb += 2) {
          const bool more = kb + 2 < args.k_blocks;
          if (more) load_scales(kb + 2, nx0), load_scales(kb + 3, nx1);
          start(part0);
          start(part1);
          sm90::wgmma_wait<1>();
          finish(part0, sc0);
          sm90::wgmma_wait<0>();
          finish(part1, sc1);
          if (more) sc0[0] = nx0[0], sc0[1] = nx0[1], sc1[0] = nx1[0], sc1[1] = nx1[1];
        }
      } else {
        int prev = -1;
        for (int kb = 0; kb < args.k_blocks; ++kb) {
          sm90::mbar_wait(&full[s], phase);
          sm90::wgmma_fence();
          issue(s, acc, kb == 0);
          sm90::wgmma_commit();
          sm90::wgmma_wait<1>();  // the previous stage's group is done: release it
          if (prev >= 0) release(prev);
          prev = s;
          if (++s == STAGES) s = 0, phase ^= 1;
        }
        sm90::wgmma_wait<0>();
        sm90::fence_regs(acc);
        if (prev >= 0) release(prev);
      }

      // ---- epilogue: 64-row x 128-byte chunks through a swizzled buffer ----
      constexpr int CW = C::OUT_COLS;
      constexpr int CHUNKS = BN / CW;
      const int r_lo = 16 * warp + g;  // this thread's rows r_lo, r_lo + 8 of the warpgroup's 64
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        uint8_t* buf = ebuf + (c & 1) * C::EPI_CHUNK;
        if constexpr (!C::GROUPED) {
          if (ct == 0) sm90::tma_store_wait_read<1>();  // the store that used buf last has read it
        }
        sm90::named_barrier_sync(kEpiBarrier + cw, 128);
#pragma unroll
        for (int jj = 0; jj < CW / 8; ++jj) {
          const int j = c * (CW / 8) + jj;  // 8-column block of the accumulator
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = r_lo + 8 * h;
            const int byte = (8 * jj + 2 * t4) * int(sizeof(TO));
            uint8_t* p = buf + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
            store_pair<TO>(reinterpret_cast<TO*>(p), acc[4 * j + 2 * h] * alpha, acc[4 * j + 2 * h + 1] * alpha);
          }
        }
        if constexpr (!C::GROUPED) {
          sm90::fence_proxy_async();
          sm90::named_barrier_sync(kEpiBarrier + cw, 128);
          if (ct == 0) {
            sm90::tma_store_3d(&tout, buf, tile.n0 + c * CW, tile.m0 + 64 * cw, tile.batch);
            sm90::tma_store_commit();
          }
        } else {
          sm90::named_barrier_sync(kEpiBarrier + cw, 128);
          // 512 16-byte units of the chunk, 4 a thread, clipped to the segment's rows and to n.
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int u = ct + 128 * i;
            const int row = u / 8, unit = u % 8;
            const int grow = tile.m0 + 64 * cw + row;
            const int gcol = tile.n0 + c * CW + unit * (16 / int(sizeof(TO)));
            if (grow < tile.row_end && gcol < args.n) {
              const uint4 v = *reinterpret_cast<const uint4*>(buf + row * 128 + ((unit ^ (row & 7)) << 4));
              *reinterpret_cast<uint4*>(static_cast<TO*>(args.g.out) + int64_t(grow) * args.g.ldo + gcol) = v;
            }
          }
        }
      }
    }
    if constexpr (!C::GROUPED) {
      if (ct == 0) sm90::tma_store_wait<0>();
    }
  }
  if constexpr (CLUSTER > 1) {
    // No CTA leaves while its peer may still arrive on its barriers.
    sm90::cluster_sync();
  }
#else
  // Built for another target: never launched there (device_arch() reports no sm_90a code).
  (void)args, (void)ta, (void)tb, (void)tout;
  __trap();
#endif
}

// ---- host ------------------------------------------------------------------------------------

namespace sm90_detail {

template <typename T>
constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, bf16_t>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if constexpr (std::is_same_v<T, f16_t>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // fp8: bytes
}

// A stride TMA accepts for a dimension of extent 1 (never stepped over): the one before it times
// its rows, rounded up to 16 bytes.
inline uint64_t unit_stride(int64_t rows, int64_t row_bytes) {
  const int64_t b = rows * row_bytes;
  return uint64_t((b + 15) / 16 * 16);
}

// CTAs the persistent grid keeps resident: one per SM, or as many whole clusters as fit.
template <class C>
int resident_ctas(int device) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return sm_count();
  if (cached[device] == 0) {
    int n = sm_count();
    if constexpr (C::CLUSTER > 1) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = C::CLUSTER, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(C::CLUSTER * 256), cfg.blockDim = dim3(C::kThreads);
      cfg.dynamicSmemBytes = C::kSmemBytes;
      cfg.attrs = &attr, cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, gemm_sm90_kernel<C>, &cfg) == cudaSuccess && clusters > 0) {
        n = clusters * C::CLUSTER;
      } else {
        cudaGetLastError();
        n = (n / C::CLUSTER) * C::CLUSTER;
      }
    }
    cached[device] = n;
  }
  return cached[device];
}

template <class C>
Status launch(const Sm90Args& args, const CUtensorMap& ta, const CUtensorMap& tb, const CUtensorMap& tout,
              int64_t tiles, LaunchContext ctx) {
  constexpr auto kernel = gemm_sm90_kernel<C>;
  int device = 0;
  cudaGetDevice(&device);
  Status st = cuda_status(allow_smem<kernel>(C::kSmemBytes, device), "gemm (sm90): raising the shared-memory limit");
  if (!st.ok()) {
    cudaGetLastError();  // the failed attribute call must not be reported by the next launch
    return st;
  }
  const int resident = resident_ctas<C>(device);
  const int64_t want = C::GROUPED ? resident : std::min<int64_t>(tiles * C::CLUSTER, resident);
  if (want <= 0) return Status::Ok();
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2]{};
  cfg.gridDim = dim3(unsigned(want)), cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = static_cast<cudaStream_t>(ctx.stream);
  cfg.attrs = attr;
  if constexpr (C::CLUSTER > 1) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = C::CLUSTER, attr[cfg.numAttrs].val.clusterDim.y = 1;
    attr[cfg.numAttrs++].val.clusterDim.z = 1;
  }
  if (ctx.pdl) {  // the kernel waits (pdl_wait) before its first global access
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, args, ta, tb, tout), "gemm (sm90) kernel launch");
}

// Tensor maps of A, B and out (dense: 3-D with the batch; grouped: out unused).
template <class C>
Status make_maps(const void* a, int64_t lda, int64_t a_bs, int64_t a_rows, int64_t k, const void* b, int64_t ldb,
                 int64_t b_bs, int64_t b_rows_or_k, int64_t n, int64_t b_batches, void* out, int64_t ldo, int64_t o_bs,
                 int64_t m, int64_t batch, CUtensorMap* ta, CUtensorMap* tb, CUtensorMap* tout) {
  constexpr int BN = C::BN, BK = C::BK;
  using TA = typename C::A;
  using TO = typename C::Out;
  const int64_t ea = sizeof(TA), eo = sizeof(TO);
  const uint64_t a_b = batch > 1 && !C::GROUPED ? uint64_t(a_bs * ea) : unit_stride(a_rows, lda * ea);
  if (!tma::encode_3d(ta, tma_dtype<TA>(), a, {uint64_t(k), uint64_t(a_rows), uint64_t(C::GROUPED ? 1 : batch)},
                      {uint64_t(lda * ea), a_b}, {uint32_t(BK), 128u, 1u})) {
    return Status::Error(1, "gemm (sm90): cuTensorMapEncodeTiled failed for a");
  }
  const uint64_t b_b = b_batches > 1 ? uint64_t(b_bs * ea) : unit_stride(b_rows_or_k, ldb * ea);
  bool ok;
  if constexpr (C::B_KMAJOR) {
    ok = tma::encode_3d(tb, tma_dtype<typename C::B>(), b, {uint64_t(k), uint64_t(n), uint64_t(b_batches)},
                        {uint64_t(ldb * ea), b_b}, {uint32_t(BK), uint32_t(BN / C::CLUSTER), 1u});
  } else {
    ok = tma::encode_3d(tb, tma_dtype<typename C::B>(), b, {uint64_t(n), uint64_t(k), uint64_t(b_batches)},
                        {uint64_t(ldb * ea), b_b}, {64u, uint32_t(BK), 1u});
  }
  if (!ok) return Status::Error(1, "gemm (sm90): cuTensorMapEncodeTiled failed for b");
  if constexpr (!C::GROUPED) {
    const uint64_t o_b = batch > 1 ? uint64_t(o_bs * eo) : unit_stride(m, ldo * eo);
    if (!tma::encode_3d(tout, tma_dtype<TO>(), out, {uint64_t(n), uint64_t(m), uint64_t(batch)},
                        {uint64_t(ldo * eo), o_b}, {uint32_t(C::OUT_COLS), 64u, 1u}, CU_TENSOR_MAP_L2_PROMOTION_NONE)) {
      return Status::Error(1, "gemm (sm90): cuTensorMapEncodeTiled failed for out");
    }
  } else {
    *tout = *ta;  // unused by the grouped epilogue
  }
  return Status::Ok();
}

constexpr int kRasterRows = 8;  // cluster rows per raster band

}  // namespace sm90_detail

// Dense / batched GEMM with the sm90 kernel of config C (checked by the caller: unsupported()).
template <class C>
Status launch_gemm_sm90(const GemmParams& p, LaunchContext ctx) {
  using namespace sm90_detail;
  Sm90Args args{};
  args.m = int32_t(p.m), args.n = int32_t(p.n), args.k = int32_t(p.k), args.batch = int32_t(p.batch);
  args.m_tiles = int32_t(ceil_div<int64_t>(ceil_div<int64_t>(p.m, 128), C::CLUSTER) * C::CLUSTER);
  args.n_tiles = int32_t(ceil_div<int64_t>(p.n, C::BN));
  args.k_blocks = int32_t(ceil_div<int64_t>(p.k, C::BK));
  args.raster = kRasterRows;
  args.a_scale = p.a_scale, args.b_scale = p.b_scale;
  args.sa_m = p.a_scale_stride_m, args.sa_k = p.a_scale_stride_k;
  args.sb_n = p.b_scale_stride_n, args.sb_k = p.b_scale_stride_k;
  CUtensorMap ta{}, tb{}, tout{};
  const int64_t b_rows = C::B_KMAJOR ? p.n : p.k;
  Status st = make_maps<C>(p.a, p.lda, p.a_batch_stride, p.m, p.k, p.b, p.ldb, p.b_batch_stride, b_rows, p.n, p.batch,
                           p.out, p.ldo, p.out_batch_stride, p.m, p.batch, &ta, &tb, &tout);
  if (!st.ok()) return st;
  const int64_t tiles = int64_t(args.m_tiles / C::CLUSTER) * args.n_tiles * p.batch;
  return launch<C>(args, ta, tb, tout, tiles, ctx);
}

template <class C>
Status launch_grouped_sm90(const GroupedGemmParams& p, LaunchContext ctx) {
  using namespace sm90_detail;
  Sm90Args args{};
  args.m = int32_t(p.total_rows), args.n = int32_t(p.n), args.k = int32_t(p.k), args.batch = 1;
  args.m_tiles = 0;
  args.n_tiles = int32_t(ceil_div<int64_t>(p.n, C::BN));
  args.k_blocks = int32_t(ceil_div<int64_t>(p.k, C::BK));
  args.raster = kRasterRows;
  args.g = p;
  args.errors = ctx.errors;
  args.a_scale = p.a_scale, args.b_scale = p.b_scale;
  args.sa_m = p.a_scale_stride_m, args.sa_k = p.a_scale_stride_k;
  args.sb_w = p.b_scale_stride_w, args.sb_n = p.b_scale_stride_n, args.sb_k = p.b_scale_stride_k;
  CUtensorMap ta{}, tb{}, tout{};
  const int64_t b_rows = C::B_KMAJOR ? p.n : p.k;
  Status st = make_maps<C>(p.a, p.lda, 0, std::max<int64_t>(p.total_rows, 1), p.k, p.b, p.ldb, p.b_weight_stride,
                           b_rows, p.n, p.num_weights, nullptr, 0, 0, 0, 1, &ta, &tb, &tout);
  if (!st.ok()) return st;
  return launch<C>(args, ta, tb, tout, 1, ctx);
}

// ---- the partitions of gemm_kernels.h ---------------------------------------------------------

// A tactic's (tile_n, cluster) -> one Sm90Config (the stages of each tile_n: kSm90Shapes,
// gemm_tactics.cc). Groupwise scaling has BN = 128 only; grouped GEMM has no clusters.
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
  return Status::Error(1, "gemm: no sm90 kernel for tactic " + tactic_name(t));
}

// 16-bit inputs, out T or float (the only output dtypes invalid() lets through for them).
template <typename T, bool KMAJOR>
Status sm90_16bit(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return p.out_dtype == DType::kF32 ? sm90_shape<T, T, float, false, ScaleMode::kNone, KMAJOR>(p, t, ctx)
                                    : sm90_shape<T, T, T, false, ScaleMode::kNone, KMAJOR>(p, t, ctx);
}

template <typename T>
Status run_sm90_kmajor(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return sm90_16bit<T, true>(p, t, ctx);
}

template <typename T>
Status run_sm90_nmajor(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return sm90_16bit<T, false>(p, t, ctx);
}

// fp8: TA x e4m3 (K-major: wgmma takes 8-bit operands K-major only) -> bf16 or f16 (unsupported()
// routes f32 out and an e5m2 B to the fallback).
template <typename TA, ScaleMode SCALE>
Status sm90_fp8(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return p.out_dtype == DType::kF16 ? sm90_shape<TA, e4m3_t, f16_t, false, SCALE, true>(p, t, ctx)
                                    : sm90_shape<TA, e4m3_t, bf16_t, false, SCALE, true>(p, t, ctx);
}

template <typename TA>
Status run_sm90_fp8_tensor(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return sm90_fp8<TA, ScaleMode::kPerTensor>(p, t, ctx);
}

template <typename TA>
Status run_sm90_fp8_group(const GemmParams& p, const Tactic& t, LaunchContext ctx) {
  return sm90_fp8<TA, ScaleMode::kGroupwise>(p, t, ctx);
}

// Grouped fp8 (e4m3 x e4m3, groupwise scales per weight) -> bf16 or f16: the grouped tile order
// and clipped stores with the groupwise two-accumulator main loop (tile_n 128).
template <typename TA>
Status run_grouped_sm90_fp8(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  return p.out_dtype == DType::kF16 ? sm90_shape<TA, e4m3_t, f16_t, true, ScaleMode::kGroupwise, true>(p, t, ctx)
                                    : sm90_shape<TA, e4m3_t, bf16_t, true, ScaleMode::kGroupwise, true>(p, t, ctx);
}

template <typename T>
Status run_grouped_sm90(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx) {
  const bool kmajor = p.b_layout == BLayout::kKMajor, f32 = p.out_dtype == DType::kF32;
  if (kmajor) {
    return f32 ? sm90_shape<T, T, float, true, ScaleMode::kNone, true>(p, t, ctx)
               : sm90_shape<T, T, T, true, ScaleMode::kNone, true>(p, t, ctx);
  }
  return f32 ? sm90_shape<T, T, float, true, ScaleMode::kNone, false>(p, t, ctx)
             : sm90_shape<T, T, T, true, ScaleMode::kNone, false>(p, t, ctx);
}

}  // namespace kiln::gemm
