// Prefill attention on tensor cores (mma.sync m16n8k16, sm80+): kernel and launcher, the
// FlashAttention-2 scheme over a paged (or ragged: page_size 1) KV cache. See attention.h,
// PrefillParams, for the contract and the causal/window alignment.
//
// One CTA = one work item (request, 64 consecutive queries) x one query head; four warps own 16
// queries each (the MMA's rows). KV tiles of TILE tokens are copied by the whole CTA into shared
// memory (coalesced 16-byte cp.async of whole token rows, XOR-swizzled chunks, two stages: the
// next tile loads while this one is used) and shared by the warps. Per tile and warp: S = Q K^T
// (Q fragments stay in registers), scale / soft-cap / causal and window masks, online softmax on
// the C fragments, P packed to 16 bits as the A operand of O += P V (ldmatrix.trans on V). Tiles
// entirely outside the causal or window range are never loaded.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/attention/attention.h"
#include "ops/attention/state.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"

namespace kiln::attention {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = 32 * kPrefillWarps;
constexpr int kPrefillQueries = 16 * kPrefillWarps;  // queries per CTA (work item)
static_assert(kPrefillQueries == kPrefillQueriesPerItem, "one CTA serves one plan work item");

template <typename T, int HEAD_DIM>
struct PrefillShape {
  static constexpr int CHUNKS = HEAD_DIM * int(sizeof(T)) / 16;
  static constexpr int VEC = 16 / int(sizeof(T));
  static constexpr int TILE = HEAD_DIM >= 256 ? 32 : 64;  // KV tokens per tile (registers for S)
  static constexpr int KSTEPS = HEAD_DIM / 16;
  static constexpr int NTILES = HEAD_DIM / 8;
  static constexpr int STAGES = 2;
  static constexpr int kUnits = STAGES * 2 * TILE * CHUNKS;  // 16-byte units of K and V staging
  static constexpr size_t kSmemBytes = size_t(kUnits) * 16;
  static_assert(CHUNKS >= 8, "the swizzle needs at least 8 chunks per row");
  static_assert((TILE * CHUNKS) % kPrefillThreads == 0, "a tile copies in whole steps");
};

template <typename T, int HEAD_DIM, bool SOFTCAP>
__global__ void __launch_bounds__(kPrefillThreads) prefill_paged_kernel(const PrefillParams p) {
  using S = PrefillShape<T, HEAD_DIM>;
  constexpr int CHUNKS = S::CHUNKS, VEC = S::VEC, TILE = S::TILE, KSTEPS = S::KSTEPS, NTILES = S::NTILES;
  constexpr int NT = TILE / 8;  // n-tiles of S per tile
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int request = p.work_request[blockIdx.x];
  if (request < 0) return;
  const int q_begin = p.qo_indptr[request];
  const int qo_len = p.qo_indptr[request + 1] - q_begin;
  const int kv_len = p.kv_len[request];
  const int offset = kv_len - qo_len;  // query i sits at key position i + offset
  const int q0 = p.work_q_start[blockIdx.x];
  const int head = blockIdx.y;
  const int kv_head = head / int(p.num_qo_heads / p.num_kv_heads);
  const int row0 = q0 + warp * 16;  // this warp's first query

  // Q fragments: rows g, g+8 of the warp's 16 queries (zero past qo_len).
  uint32_t qa[KSTEPS][4];
  {
    const T* q = static_cast<const T*>(p.q) + head * p.q_stride_h;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int qi = row0 + g + (r & 1) * 8;
      const T* qrow = q + int64_t(q_begin + qi) * p.q_stride_n;
#pragma unroll
      for (int kk = 0; kk < KSTEPS; ++kk) {
        const int col = kk * 16 + 2 * t + (r >> 1) * 8;
        qa[kk][r] = qi < qo_len ? *reinterpret_cast<const uint32_t*>(qrow + col) : 0u;
      }
    }
  }
  float o[NTILES][4];
#pragma unroll
  for (int n = 0; n < NTILES; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {neg_inf(), neg_inf()};
  float l[2] = {0.0f, 0.0f};

  // KV range of the CTA: causal stops after the last query's diagonal, a window starts at the
  // first query's window edge (rounded down to a tile).
  const int last_q = min(q0 + kPrefillQueries, qo_len) - 1;
  const int kv_end = p.causal ? max(0, min(kv_len, last_q + offset + 1)) : kv_len;
  int kv_start = p.window_left >= 0 ? max(0, q0 + offset - p.window_left) : 0;
  kv_start = (kv_start / TILE) * TILE;
  const int num_tiles = kv_end > kv_start ? (kv_end - kv_start + TILE - 1) / TILE : 0;

  const PagedKV& kv = p.kv;
  const int32_t* pages = kv.page_indices + kv.page_indptr[request];
  const T* k_head = static_cast<const T*>(kv.k) + kv_head * kv.k_head_stride;
  const T* v_head = static_cast<const T*>(kv.v) + kv_head * kv.v_head_stride;
  const uint32_t page_size = static_cast<uint32_t>(kv.page_size);

  auto issue = [&](int stage, int tile) {
    const int tile_tok0 = kv_start + tile * TILE;
    uint4* kdst = smem + (stage * 2 + 0) * TILE * CHUNKS;
    uint4* vdst = smem + (stage * 2 + 1) * TILE * CHUNKS;
#pragma unroll
    for (int step = 0; step < TILE * CHUNKS / kPrefillThreads; ++step) {
      const int unit = step * kPrefillThreads + threadIdx.x;
      const int row = unit / CHUNKS, chunk = unit % CHUNKS;
      const int tok = tile_tok0 + row;
      const bool valid = tok < kv_end;
      const uint32_t utok = valid ? static_cast<uint32_t>(tok) : 0u;
      const int64_t page = valid ? pages[utok / page_size] : 0;
      const int64_t slot = utok % page_size;
      const int phys = row * CHUNKS + (chunk ^ (row & 7));
      cp_async_16(kdst + phys, k_head + page * kv.k_page_stride + slot * kv.k_slot_stride + chunk * VEC, valid);
      cp_async_16(vdst + phys, v_head + page * kv.v_page_stride + slot * kv.v_slot_stride + chunk * VEC, valid);
    }
    cp_async_commit();
  };

  if (num_tiles > 0) issue(0, 0);
  const float scale = SOFTCAP ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e;
  const int ld_row = lane % 8, ld_mat = lane / 8;
  const int qi0 = row0 + g, qi1 = row0 + g + 8;  // this lane's two query rows
  for (int tile = 0; tile < num_tiles; ++tile) {
    if (tile + 1 < num_tiles) {
      issue((tile + 1) % 2, tile + 1);
    } else {
      cp_async_commit();
    }
    cp_async_wait<1>();
    __syncthreads();  // the whole tile has landed, for every warp
    const int stage = tile % 2;
    const uint4* kt = smem + (stage * 2 + 0) * TILE * CHUNKS;
    const uint4* vt = smem + (stage * 2 + 1) * TILE * CHUNKS;
    const int tile_tok0 = kv_start + tile * TILE;

    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        const int tok = np * 16 + (ld_mat / 2) * 8 + ld_row, chunk = 2 * kk + ld_mat % 2;
        ldmatrix_x4(b, kt + tok * CHUNKS + (chunk ^ (tok & 7)));
        mma_16x8x16<T>(s[2 * np], qa[kk], b[0], b[1]);
        mma_16x8x16<T>(s[2 * np + 1], qa[kk], b[2], b[3]);
      }
    }
    float row_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = tile_tok0 + n * 8 + 2 * t + (i & 1);
        const int qpos = ((i >> 1) ? qi1 : qi0) + offset;
        bool valid = key < kv_end;
        if (p.causal) valid = valid && key <= qpos;
        if (p.window_left >= 0) valid = valid && key >= qpos - p.window_left;
        float x = s[n][i] * scale;
        if constexpr (SOFTCAP) x = tanhf(x) * (p.soft_cap * kLog2e);
        s[n][i] = valid ? x : neg_inf();
        row_max[i >> 1] = fmaxf(row_max[i >> 1], s[n][i]);
      }
    }
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      const float m_new = fmaxf(m[r], row_max[r]);
      rescale[r] = scale_from(m[r], m_new);
      l[r] *= rescale[r];
      m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < NTILES; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
    // P V, one k-step (16 tokens = two n-tiles of S) at a time.
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks) {
      uint32_t pa[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          e[i] = scale_from(s[2 * ks + h][i], m[i >> 1]);
          l[i >> 1] += e[i];
        }
        pa[2 * h + 0] = pack2<T>(e[0], e[1]);
        pa[2 * h + 1] = pack2<T>(e[2], e[3]);
      }
#pragma unroll
      for (int np = 0; np < NTILES / 2; ++np) {
        uint32_t b[4];
        const int tok = ks * 16 + (ld_mat % 2) * 8 + ld_row, chunk = 2 * np + ld_mat / 2;
        ldmatrix_x4_trans(b, vt + tok * CHUNKS + (chunk ^ (tok & 7)));
        mma_16x8x16<T>(o[2 * np], pa, b[0], b[1]);
        mma_16x8x16<T>(o[2 * np + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = r ? qi1 : qi0;
    if (qi >= qo_len) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    T* out = static_cast<T*>(p.out) + int64_t(q_begin + qi) * p.out_stride_n + head * p.out_stride_h;
#pragma unroll
    for (int n = 0; n < NTILES; ++n) {
      const uint32_t packed = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) = packed;
    }
    if (p.lse != nullptr && t == 0) p.lse[int64_t(q_begin + qi) * p.lse_stride_n + head] = merged_lse(m[r], l[r]);
  }
}

template <typename T, int HEAD_DIM, bool SOFTCAP>
Status launch_prefill(const PrefillParams& p, LaunchContext ctx) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "prefill: num_qo_heads (" + std::to_string(p.num_qo_heads) +
                                ") must be a multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) + ")");
  }
  if (p.work_capacity == 0) return Status::Ok();
  if (p.num_qo_heads > 65535) return Status::Error(1, "prefill: too many query heads for one launch");
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  using S = PrefillShape<T, HEAD_DIM>;
  constexpr auto kernel = prefill_paged_kernel<T, HEAD_DIM, SOFTCAP>;
  Status st = cuda_status(allow_smem<kernel>(S::kSmemBytes, device), "prefill: raising the shared-memory limit");
  if (!st.ok()) return st;
  const dim3 grid(static_cast<unsigned>(p.work_capacity), static_cast<unsigned>(p.num_qo_heads));
  kernel<<<grid, kPrefillThreads, S::kSmemBytes, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "prefill kernel launch");
}

}  // namespace kiln::attention
