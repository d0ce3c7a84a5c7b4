// Paged decode attention on tensor cores (mma.sync m16n8k16, sm80+): kernel and launcher. See
// attention.h for the contract.
//
// One CTA = one work item (request, token range) x one kv head x up to 16 of its query heads
// (the GQA group, or a divisor of it): the query heads are the 16 rows of the MMA A operand
// (padded with zeros), so each K/V byte is read once for the whole group and the arithmetic runs
// on tensor cores, as in FlashAttention-2 with the query heads in place of query tokens.
// Four warps; warp w takes the work item's tiles w, w + 4, ... (16 tokens; 32 for fp8) and streams them through
// its own cp.async pipeline in shared memory (kStages deep, rows XOR-swizzled in 16-byte chunks so
// ldmatrix is conflict free). Per tile: S = Q K^T (ldmatrix.x4 on K), scale / soft-cap / mask,
// online softmax on the C fragments (one max per row per tile, quad shuffles), P packed to 16-bit
// in registers as the A operand of O += P V (ldmatrix.x4.trans on V). At the end the four warps'
// states merge through shared memory into out/lse, or a float32 partial slot (split-KV), which
// the request's last CTA to finish merges (merge_if_last).
// An fp8 E4M3 cache (KV = e4m3_t) is staged as bytes and converted at the MMAs, which then run on
// f16 operands: the query is scaled (sm_scale x k_scale, in float32) and rounded to f16 once, P is
// packed to f16 (kv_fp8.cuh has the fragment orders). Every cache's k_scale and v_scale apply
// (1 unless given), as FlashInfer applies them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/attention/attention.h"
#include "ops/attention/kv_fp8.cuh"
#include "ops/attention/online_softmax.cuh"
#include "ops/attention/state.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"

namespace kiln::attention {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
// The in-launch split-KV merge (merge_if_last): slots a thread loads at once.
constexpr int kMergeBatch = 16;

// KV: the cache's element type (16-bit, or 8-bit E4M3).
template <typename KV, int HEAD_DIM>
struct DecodeShape {
  static constexpr int CHUNKS = HEAD_DIM * int(sizeof(KV)) / 16;  // 16-byte chunks per token row
  static constexpr int VEC = 16 / int(sizeof(KV));
  // Tokens per warp per pipeline stage, in MMA k-steps of 16 for P V: an fp8 cache takes 32, so a
  // stage holds the bytes of a 16-bit one and each step of a warp's serial chain (wait, QK, softmax,
  // PV) moves twice the tokens; the chain, not bandwidth, bounded 16-token fp8 tiles (0.76x bf16).
  static constexpr int TILE = sizeof(KV) == 1 ? 32 : 16;
  static constexpr int STAGES = HEAD_DIM >= 256 ? 2 : 3;
  static constexpr int KSTEPS = HEAD_DIM / 16;  // MMA k-steps of Q K^T
  static constexpr int NTILES = HEAD_DIM / 8;   // MMA n-tiles of P V
  // Per warp: [stage][K, V][token][chunk] 16-byte units.
  static constexpr int kWarpUnits = STAGES * 2 * TILE * CHUNKS;
  static constexpr size_t kStagingBytes = size_t(kDecodeWarps) * kWarpUnits * 16;
  // Merge of the warps: m and l per [warp][row], o per [warp][row][dim], float32.
  static constexpr size_t kCombineBytes = size_t(kDecodeWarps) * kMaxHeadsPerCta * (HEAD_DIM + 2) * 4;
  static constexpr size_t kSmemBytes = kStagingBytes > kCombineBytes ? kStagingBytes : kCombineBytes;
  static_assert(CHUNKS >= 4 && CHUNKS % 2 == 0, "the swizzle needs at least 4 chunks per row");
  // The physical chunk of (token row, chunk): ldmatrix reads one chunk of 8 consecutive rows, and
  // the XOR puts those 8 in distinct 16-byte bank groups (rows of 4 chunks pair up in 128 bytes).
  static __device__ __forceinline__ int swizzle(int row, int chunk) {
    if constexpr (CHUNKS >= 8) {
      return chunk ^ (row & 7);
    } else {
      return chunk ^ ((row >> 1) & 3);
    }
  }
};

// The split-KV merge inside the decode launch: a CTA that wrote partial slots counts itself in
// (merge entry, head chunk)'s counter, and the last of the request's CTAs there merges every slot
// of its query heads into out/lse (the result of merge_states_vec_kernel) and zeroes the counter
// for the next launch. The barrier, then thread 0's fence (cumulative), orders the CTA's partials
// before its count; the last CTA's fence after the count orders the others' partials before its
// loads, which go to L2 (ld.global.cg), where every SM's writes land. The merge is the tail of
// the launch, so its latency is the batch-1 time: a thread takes 4 dims of one head and loads
// kMergeBatch slots' lse and partials at once (one L2 round trip for up to kMergeBatch slots),
// with an online max across batches. A poisoned slot (NaN) makes the merged row NaN. Not
// inlined, and its arguments by value (a reference to the kernel's parameters would copy them
// all to local memory at entry): the decode loop's registers stay what they are without it.
struct SplitMerge {
  const int32_t* work_merge_index;
  const int32_t* merge_indptr;
  int32_t* merge_counter;
  int64_t merge_capacity, num_qo_heads;
  const float* partial_out;  // 16-byte aligned (the binding checks)
  const float* partial_lse;
  void* out;
  int64_t out_stride_b, out_stride_h;
  float* lse;
  int64_t lse_stride_b;
};

template <typename T, int HEAD_DIM>
__device__ __noinline__ void merge_if_last(const SplitMerge p, uint4* smem, int work, int request, int qo_head0,
                                           int heads) {
  int* last = reinterpret_cast<int*>(smem);
  const int m = p.work_merge_index[work];
  const bool valid = m >= 0 && m < p.merge_capacity;  // else the plan is corrupt: nothing is written
  __syncthreads();  // every thread's partials written, and the combine buffers this reuses read
  if (threadIdx.x == 0) {
    *last = 0;
    if (valid) {
      __threadfence();
      int* counter = p.merge_counter + int64_t(m) * gridDim.y + blockIdx.y;
      const int pieces = p.merge_indptr[m + 1] - p.merge_indptr[m];
      if (atomicAdd(counter, 1) == pieces - 1) {
        *last = 1;
        *counter = 0;  // every CTA of this entry has arrived: no other access in this launch
        __threadfence();
      }
    }
  }
  __syncthreads();
  if (!*last) return;
  constexpr int QUADS = HEAD_DIM / 4;  // float4 columns of a head
  const int first = p.merge_indptr[m], pieces = p.merge_indptr[m + 1] - first;
  const int64_t lse_stride = p.num_qo_heads, part_stride = p.num_qo_heads * QUADS;  // per slot
  for (int qd = threadIdx.x; qd < heads * QUADS; qd += kDecodeThreads) {
    const int row = qd / QUADS, col = (qd % QUADS) * 4, head = qo_head0 + row;
    const float* lse = p.partial_lse + int64_t(first) * lse_stride + head;
    const float4* part = reinterpret_cast<const float4*>(p.partial_out) + int64_t(first) * part_stride +
                         int64_t(head) * QUADS + qd % QUADS;
    float mx = neg_inf(), sum = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j0 = 0; j0 < pieces; j0 += kMergeBatch) {
      float l[kMergeBatch];
      float4 v[kMergeBatch];
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {  // every load of the batch before any use
        const bool in = j0 + u < pieces;
        l[u] = in ? __ldcg(lse + int64_t(j0 + u) * lse_stride) : neg_inf();
        v[u] = in ? __ldcg(part + int64_t(j0 + u) * part_stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float bm = mx;
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) bm = fmaxf(bm, l[u]);
      const float r = scale_from(mx, bm);
      sum *= r;
      acc = make_float4(acc.x * r, acc.y * r, acc.z * r, acc.w * r);
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        const float w = scale_from(l[u], bm);
        sum += w;
        acc = make_float4(acc.x + w * v[u].x, acc.y + w * v[u].y, acc.z + w * v[u].z, acc.w + w * v[u].w);
      }
      mx = bm;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.out) + request * p.out_stride_b + head * p.out_stride_h + col;
    out[0] = Convert<T>::from_float(acc.x * inv);
    out[1] = Convert<T>::from_float(acc.y * inv);
    out[2] = Convert<T>::from_float(acc.z * inv);
    out[3] = Convert<T>::from_float(acc.w * inv);
    if (p.lse != nullptr && col == 0) p.lse[request * p.lse_stride_b + head] = merged_lse(mx, sum);
  }
}

template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_paged_kernel(const DecodeParams p, int heads_per_cta, int64_t* errors) {
  constexpr bool FP8 = sizeof(KV) == 1;
  using MT = std::conditional_t<FP8, __half, T>;  // the MMAs' operand type
  using S = DecodeShape<KV, HEAD_DIM>;
  constexpr int CHUNKS = S::CHUNKS, VEC = S::VEC, STAGES = S::STAGES, KSTEPS = S::KSTEPS, NTILES = S::NTILES;
  constexpr int TILE = S::TILE, TN = TILE / 8, TK = TILE / 16;  // S n-tiles, P V k-steps per tile
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  uint4* wbuf = smem + warp * S::kWarpUnits;  // this warp's pipeline

  const int work = blockIdx.x;
  const int request = p.work_request[work];
  if (request < 0) return;  // padding entry (CUDA-graph capacity)
  const int tok_begin = p.work_token_begin[work];
  const int tok_end = p.work_token_end[work];
  const int out_index = p.work_out_index[work];
  const int group_size = int(p.num_qo_heads / p.num_kv_heads);
  const int head_chunks = group_size / heads_per_cta;
  const int kv_head = blockIdx.y / head_chunks;
  const int qo_head0 = kv_head * group_size + (blockIdx.y % head_chunks) * heads_per_cta;

  // Q as the A operand: rows g and g+8 are query heads (zero beyond heads_per_cta). fp8: the
  // dims in k_operands' order, times the logit scale (so S is in log2 units, or logit / cap with
  // a soft-cap) and k_scale, rounded to f16 (clamped to its range: 65504 is beyond any real logit).
  const float logit_scale = SOFTCAP ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e;
  uint32_t qa[KSTEPS][4];
  {
    const T* q = static_cast<const T*>(p.q) + request * p.q_stride_b + qo_head0 * p.q_stride_h;
    const float q_scale = logit_scale * p.k_scale;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = g + (r & 1) * 8;
        const int col = FP8 ? fp8::qk_dim(kk, r, t) : kk * 16 + 2 * t + (r >> 1) * 8;
        const uint32_t pair =
            row < heads_per_cta ? *reinterpret_cast<const uint32_t*>(q + row * p.q_stride_h + col) : 0u;
        if constexpr (FP8) {
          const T* e = reinterpret_cast<const T*>(&pair);
          auto scaled = [&](T x) { return fminf(fmaxf(Convert<T>::to_float(x) * q_scale, -65504.0f), 65504.0f); };
          qa[kk][r] = pack2<__half>(scaled(e[0]), scaled(e[1]));
        } else {
          qa[kk][r] = pair;
        }
      }
    }
  }
  float o[NTILES][4];
#pragma unroll
  for (int n = 0; n < NTILES; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {neg_inf(), neg_inf()};  // running max of rows g, g+8 (log2 units)
  float l[2] = {0.0f, 0.0f};            // this lane's share of the running sums

  const PagedKV& kv = p.kv;
  const int64_t first_page = kv.page_indptr[request];
  bool bad = false;  // this thread met a page id out of range: the CTA's outputs become NaN
  const KV* k_head = static_cast<const KV*>(kv.k) + kv_head * kv.k_head_stride;
  const KV* v_head = static_cast<const KV*>(kv.v) + kv_head * kv.v_head_stride;
  const uint32_t page_size = static_cast<uint32_t>(kv.page_size);
  const int num_tiles = (tok_end - tok_begin + TILE - 1) / TILE;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;

  // Copies are coalesced: one cp.async instruction covers 32 / CHUNKS whole token rows (two
  // 256-byte rows at head_dim 128). Lanes 0..TILE-1 look up the page and slot of the tile's tokens
  // once and the copying lanes fetch them by shuffle.
  constexpr int kRowsPerCopy = 32 / CHUNKS;
  const int copy_chunk = lane % CHUNKS;
  auto issue = [&](int stage, int tile) {
    const int tile_tok0 = tok_begin + (warp + tile * kDecodeWarps) * TILE;
    const int my_tok = tile_tok0 + (lane % TILE);
    const uint32_t utok = my_tok < tok_end ? static_cast<uint32_t>(my_tok) : 0u;
    // -1: past the request, or no page (recorded after the copies are issued; its rows are not read)
    const int my_page = my_tok < tok_end ? static_cast<int>(load_page(kv, first_page, utok / page_size)) : -1;
    const bool missing = my_tok < tok_end && my_page < 0;
    const int my_slot = static_cast<int>(utok % page_size);
    uint4* kdst = wbuf + (stage * 2 + 0) * TILE * CHUNKS;
    uint4* vdst = wbuf + (stage * 2 + 1) * TILE * CHUNKS;
#pragma unroll
    for (int c = 0; c < TILE / kRowsPerCopy; ++c) {
      const int row = c * kRowsPerCopy + lane / CHUNKS;
      const int row_page = __shfl_sync(0xffffffffu, my_page, row);
      const int64_t slot = __shfl_sync(0xffffffffu, my_slot, row);
      const bool valid = row_page >= 0;
      const int64_t page = valid ? row_page : 0;
      const int phys = row * CHUNKS + S::swizzle(row, copy_chunk);
      cp_async_16(kdst + phys, k_head + page * kv.k_page_stride + slot * kv.k_slot_stride + copy_chunk * VEC, valid);
      cp_async_16(vdst + phys, v_head + page * kv.v_page_stride + slot * kv.v_slot_stride + copy_chunk * VEC, valid);
    }
    cp_async_commit();
    if (missing) {  // cold: say why, and poison the CTA's outputs
      record_page_error(kv, request, first_page, utok / page_size, errors);
      bad = true;
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < my_tiles) {
      issue(s, s);
    } else {
      cp_async_commit();  // empty group keeps the wait count uniform
    }
  }
  const float scale = FP8 ? 1.0f : logit_scale * p.k_scale;  // fp8: folded into the query
  const int ld_row = lane % 8, ld_mat = lane / 8;
  for (int tile = 0; tile < my_tiles; ++tile) {
    if (tile + STAGES - 1 < my_tiles) {
      issue((tile + STAGES - 1) % STAGES, tile + STAGES - 1);
    } else {
      cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();
    __syncwarp();  // every lane's copies of this tile have landed
    const int stage = tile % STAGES;
    const uint4* kt = wbuf + (stage * 2 + 0) * TILE * CHUNKS;
    const uint4* vt = wbuf + (stage * 2 + 1) * TILE * CHUNKS;

    // S = Q K^T over the tile's tokens: TN n-tiles of 8 tokens, 16 tokens (h) at a time.
    float s[TN][4] = {};
#pragma unroll
    for (int h = 0; h < TK; ++h) {
      if constexpr (FP8) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {
          uint32_t r[4];  // ldmatrix: matrix j = tokens 16 h + (j / 2) * 8.., chunk kk + j % 2 (16 dims)
          const int tok = h * 16 + (ld_mat / 2) * 8 + ld_row, chunk = kk + ld_mat % 2;
          ldmatrix_x4(r, kt + tok * CHUNKS + S::swizzle(tok, chunk));
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t b0, b1;
            fp8::k_operands(r[j], b0, b1);
            mma_16x8x16<MT>(s[2 * h + j / 2], qa[kk + j % 2], b0, b1);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
          uint32_t b[4];  // ldmatrix: matrix j = tokens 16 h + (j / 2) * 8.., chunk 2 kk + j % 2
          const int tok = h * 16 + (ld_mat / 2) * 8 + ld_row, chunk = 2 * kk + ld_mat % 2;
          ldmatrix_x4(b, kt + tok * CHUNKS + S::swizzle(tok, chunk));
          mma_16x8x16<MT>(s[2 * h], qa[kk], b[0], b[1]);
          mma_16x8x16<MT>(s[2 * h + 1], qa[kk], b[2], b[3]);
        }
      }
    }
    const int tile_tok0 = tok_begin + (warp + tile * kDecodeWarps) * TILE;
    float row_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int n = 0; n < TN; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float x = s[n][i] * scale;
        if constexpr (SOFTCAP) x = tanhf(x) * (p.soft_cap * kLog2e);
        const bool valid = tile_tok0 + n * 8 + 2 * t + (i & 1) < tok_end;
        s[n][i] = valid ? x : neg_inf();
        row_max[i >> 1] = fmaxf(row_max[i >> 1], s[n][i]);
      }
    }
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_use;  // (P below is scale_from(s, m), which handles a row with no key itself)
      rescale[r] = online_softmax_step(row_max[r], 1.0f, m[r], l[r], m_use);
    }
#pragma unroll
    for (int n = 0; n < NTILES; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
    // P = exp2(S - m), as the A operands of P V, one per k-step of 16 tokens (the C layout of two
    // n-tiles is A's layout).
    uint32_t pa[TK][4];
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        e[i] = scale_from(s[n][i], m[i >> 1]);
        l[i >> 1] += e[i];
      }
      pa[n / 2][2 * (n % 2) + 0] = pack2<MT>(e[0], e[1]);
      pa[n / 2][2 * (n % 2) + 1] = pack2<MT>(e[2], e[3]);
    }
    // O += P V per k-step h: ldmatrix.trans matrix j = tokens 16 h + (j % 2) * 8.., chunk (16-bit:
    // 2 np + j / 2; fp8: 2 np + j / 2 of 16 dims, two n-tiles each).
#pragma unroll
    for (int h = 0; h < TK; ++h) {
      if constexpr (FP8) {
#pragma unroll
        for (int np = 0; np < NTILES / 4; ++np) {
          uint32_t r[4];
          const int tok = h * 16 + (ld_mat % 2) * 8 + ld_row, chunk = 2 * np + ld_mat / 2;
          ldmatrix_x4_trans(r, vt + tok * CHUNKS + S::swizzle(tok, chunk));
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            uint32_t even0, odd0, even1, odd1;
            fp8::v_operands(r[2 * c2], even0, odd0);      // tokens 16 h + 0..7
            fp8::v_operands(r[2 * c2 + 1], even1, odd1);  // tokens 16 h + 8..15
            const int c = 2 * np + c2;
            mma_16x8x16<MT>(o[2 * c], pa[h], even0, even1);
            mma_16x8x16<MT>(o[2 * c + 1], pa[h], odd0, odd1);
          }
        }
      } else {
#pragma unroll
        for (int np = 0; np < NTILES / 2; ++np) {
          uint32_t b[4];
          const int tok = h * 16 + (ld_mat % 2) * 8 + ld_row, chunk = 2 * np + ld_mat / 2;
          ldmatrix_x4_trans(b, vt + tok * CHUNKS + S::swizzle(tok, chunk));
          mma_16x8x16<MT>(o[2 * np], pa[h], b[0], b[1]);
          mma_16x8x16<MT>(o[2 * np + 1], pa[h], b[2], b[3]);
        }
      }
    }
    __syncwarp();  // all lanes are done reading this stage before it is refilled
  }
  cp_async_wait<0>();
  // The staging buffers become the combine buffer; and a bad page anywhere poisons the CTA's rows.
  const bool poisoned = __syncthreads_or(bad);

  // Row sums over the quad, then each warp's (m, l, o) into shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  float* c_m = reinterpret_cast<float*>(smem);        // [warp][row]
  float* c_l = c_m + kDecodeWarps * kMaxHeadsPerCta;  // [warp][row]
  float* c_o = c_l + kDecodeWarps * kMaxHeadsPerCta;  // [warp][row][dim]
  if (t == 0) {
    c_m[warp * kMaxHeadsPerCta + g] = m[0];
    c_m[warp * kMaxHeadsPerCta + g + 8] = m[1];
    c_l[warp * kMaxHeadsPerCta + g] = l[0];
    c_l[warp * kMaxHeadsPerCta + g + 8] = l[1];
  }
#pragma unroll
  for (int n = 0; n < NTILES; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >> 1) * 8, j = 2 * t + (i & 1);
      const int col = FP8 ? fp8::pv_dim(n, j) : n * 8 + j;
      c_o[(warp * kMaxHeadsPerCta + row) * HEAD_DIM + col] = o[n][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < heads_per_cta * HEAD_DIM; idx += kDecodeThreads) {
    const int row = idx / HEAD_DIM, col = idx % HEAD_DIM;
    float m_all = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m_all = fmaxf(m_all, c_m[w * kMaxHeadsPerCta + row]);
    float l_all = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float wgt = scale_from(c_m[w * kMaxHeadsPerCta + row], m_all);
      l_all += wgt * c_l[w * kMaxHeadsPerCta + row];
      acc += wgt * c_o[(w * kMaxHeadsPerCta + row) * HEAD_DIM + col];
    }
    const float value = poisoned ? quiet_nan() : l_all > 0.0f ? acc / l_all * p.v_scale : 0.0f;
    const float lse = poisoned ? quiet_nan() : merged_lse(m_all, l_all);
    const int head = qo_head0 + row;
    if (out_index < 0) {
      static_cast<T*>(p.out)[request * p.out_stride_b + head * p.out_stride_h + col] = Convert<T>::from_float(value);
      if (p.lse != nullptr && col == 0) p.lse[request * p.lse_stride_b + head] = lse;
    } else {
      p.partial_out[(int64_t(out_index) * p.num_qo_heads + head) * HEAD_DIM + col] = value;
      if (col == 0) p.partial_lse[int64_t(out_index) * p.num_qo_heads + head] = lse;
    }
  }
  if (out_index >= 0) {
    const SplitMerge merge{p.work_merge_index, p.merge_indptr, p.merge_counter, p.merge_capacity,
                           p.num_qo_heads,     p.partial_out,  p.partial_lse,   p.out,
                           p.out_stride_b,     p.out_stride_h, p.lse,           p.lse_stride_b};
    merge_if_last<T, HEAD_DIM>(merge, smem, work, request, qo_head0, heads_per_cta);
  }
}

template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP>
Status launch_decode(const DecodeParams& p, LaunchContext ctx) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "decode: num_qo_heads (" + std::to_string(p.num_qo_heads) +
                                ") must be a multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) + ")");
  }
  if (p.work_capacity == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t group_size = p.num_qo_heads / p.num_kv_heads;
  const int heads = heads_per_cta(group_size);
  const dim3 grid(static_cast<unsigned>(p.work_capacity), static_cast<unsigned>(p.num_kv_heads * (group_size / heads)));
  if (grid.y > 65535) return Status::Error(1, "decode: too many kv heads x head chunks for one launch");
  using S = DecodeShape<KV, HEAD_DIM>;
  constexpr auto kernel = decode_paged_kernel<T, KV, HEAD_DIM, SOFTCAP>;
  Status st = cuda_status(allow_smem<kernel>(S::kSmemBytes, device), "decode: raising the shared-memory limit");
  if (!st.ok()) return st;
  if (p.merge_capacity > 0 && p.merge_counter == nullptr) {
    return Status::Error(1, "decode: a split-KV plan needs its merge_counter buffer");
  }
  kernel<<<grid, kDecodeThreads, S::kSmemBytes, stream>>>(p, heads, ctx.errors);
  return cuda_status(cudaGetLastError(), "decode kernel launch");
}

}  // namespace kiln::attention
