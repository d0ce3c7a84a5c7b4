// Paged decode attention on tensor cores (mma.sync m16n8k16, sm80+): kernel and launcher. See
// attention.h for the contract.
//
// One CTA = one work item (request, token range) x one kv head x up to 16 query rows: heads of its
// GQA group (the group, or a divisor of it) times queries of the request (multi-token decode,
// DecodeParams::q_len; one query a request otherwise), so each K/V byte is read once for all of them
// and the arithmetic runs on tensor cores. Row r is query j0 + r / heads of head qo_head0 + r %
// heads. The keys are the MMAs' M side and the query rows their N side: S^T = K Q^T (16 tokens x 8
// rows an MMA; K is the A operand, straight from ldmatrix) and O^T = V^T P^T (16 dims x 8 rows; V^T
// from ldmatrix.trans, P^T from the S^T fragment by one movmatrix a register). With GQA 4 this pads
// half of N, where heads on M (16 rows) padded 3/4 of it: half the MMAs a token, and O is 32
// registers a thread at head_dim 128, not 64. CTAs of 9-16 rows take two n-tiles (NH = 2).
// Four warps; warp w takes the work item's tiles w, w + 4, ... (16 tokens; 32 for fp8) and streams
// them through its own cp.async pipeline in shared memory (kStages deep, rows XOR-swizzled in
// 16-byte chunks so ldmatrix is conflict free). Per tile: S^T = K Q^T, scale / soft-cap / mask,
// online softmax per row (a row's keys lie in the 8 lanes with the same lane % 4: three shuffles
// for its max), P^T packed to 16-bit by movmatrix, O^T += V^T P^T. At the end the four warps'
// states merge through shared memory into out/lse, or a float32 partial slot (split-KV), which the
// request's last CTA to finish merges (merge_if_last).
// An fp8 E4M3 cache (KV = e4m3_t) is staged as bytes and converted at the MMAs, which then run on
// f16 operands: the query is scaled (sm_scale x k_scale, in float32) and rounded to f16 once, P is
// packed to f16 (kv_fp8.cuh has the fragment orders). Every cache's k_scale and v_scale apply
// (1 unless given), as FlashInfer applies them. Several queries a request are causal among
// themselves: the tiles holding the request's last q_len - 1 keys (and a window's first ones) mask
// per row. A ROPE_LLAMA module (ROPE) rotates q at load and each K fragment in registers before
// its MMAs (rope_rotate): dims d and d + D/2 sit in the same lanes and registers of k-steps kk and
// kk + KSTEPS/2.
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
#include "ops/common/fast_div.cuh"
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
  // Tokens per warp per pipeline stage, in MMA m-tiles of 16: an fp8 cache takes 32, so a stage
  // holds the bytes of a 16-bit one and each step of a warp's serial chain (wait, QK, softmax, PV)
  // moves twice the tokens; the chain, not bandwidth, bounded 16-token fp8 tiles
  // (docs/perf/decode-fp8.md).
  static constexpr int TILE = sizeof(KV) == 1 ? 32 : 16;
  static constexpr int STAGES = HEAD_DIM >= 256 ? 2 : 3;
  static constexpr int KSTEPS = HEAD_DIM / 16;  // MMA k-steps of S^T = K Q^T
  static constexpr int DTILES = HEAD_DIM / 16;  // MMA m-tiles of O^T = V^T P^T (16 dims each)
  // Per warp: [stage][K, V][token][chunk] 16-byte units.
  static constexpr int kWarpUnits = STAGES * 2 * TILE * CHUNKS;
  static constexpr size_t kStagingBytes = size_t(kDecodeWarps) * kWarpUnits * 16;
  // Merge of the warps: m and l per [warp][head], o per [warp][head][dim] (rows padded by 4 floats:
  // the lanes storing one dim for heads 2t apart then hit different banks), float32.
  static constexpr int kCombineRow = HEAD_DIM + 4;
  static constexpr size_t kCombineBytes = size_t(kDecodeWarps) * kMaxHeadsPerCta * (kCombineRow + 2) * 4;
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
  int units;  // CTAs per work item (kv heads x head chunks x query chunks)
  const int32_t* work_merge_index;
  const int32_t* merge_indptr;
  int32_t* merge_counter;
  int64_t merge_capacity, num_qo_heads, q_len;
  const float* partial_out;  // 16-byte aligned (the binding checks)
  const float* partial_lse;
  void* out;
  int64_t out_stride_b, out_stride_h;
  float* lse;
  int64_t lse_stride_b;
};

// The CTA's rows: heads qo_head0 .. + heads of queries j0 .. + queries (row r: query j0 + r / heads,
// head qo_head0 + r % heads).
struct CtaRows {
  int qo_head0, heads, j0, queries;
};

template <typename T, int HEAD_DIM>
__device__ __noinline__ void merge_if_last(const SplitMerge p, uint4* smem, int work, int unit, int request,
                                           const CtaRows rows) {
  int* last = reinterpret_cast<int*>(smem);
  const int m = p.work_merge_index[work];
  const bool valid = m >= 0 && m < p.merge_capacity;  // else the plan is corrupt: nothing is written
  __syncthreads();  // every thread's partials written, and the combine buffers this reuses read
  if (threadIdx.x == 0) {
    *last = 0;
    if (valid) {
      __threadfence();
      int* counter = p.merge_counter + int64_t(m) * p.units + unit;
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
  const int64_t lse_stride = p.q_len * p.num_qo_heads, part_stride = lse_stride * QUADS;  // per slot
  // Query by query: a row index spanning queries and heads (a division in the loop) cost this
  // function ~80 registers, and the kernel with it.
  for (int j = rows.j0; j < rows.j0 + rows.queries; ++j) {
    for (int qd = threadIdx.x; qd < rows.heads * QUADS; qd += kDecodeThreads) {
      const int col = (qd % QUADS) * 4, head = rows.qo_head0 + qd / QUADS;
      const int64_t state = (int64_t(first) * p.q_len + j) * p.num_qo_heads + head;  // slot first's row
      const float* lse = p.partial_lse + state;
      const float4* part = reinterpret_cast<const float4*>(p.partial_out) + state * QUADS + qd % QUADS;
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
      const int64_t out_row = int64_t(request) * p.q_len + j;
      T* out = static_cast<T*>(p.out) + out_row * p.out_stride_b + head * p.out_stride_h + col;
      out[0] = Convert<T>::from_float(acc.x * inv);
      out[1] = Convert<T>::from_float(acc.y * inv);
      out[2] = Convert<T>::from_float(acc.z * inv);
      out[3] = Convert<T>::from_float(acc.w * inv);
      if (p.lse != nullptr && col == 0) p.lse[out_row * p.lse_stride_b + head] = merged_lse(mx, sum);
    }
  }
}

// Two 16-bit elements of a register as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t r) {
  return __half22float2(*reinterpret_cast<const __half2*>(&r));
}

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}

// ROPE_LLAMA (rotate-half) of one row's dims d, d + 1 (`l`) with their partners d + D/2, d + D/2 + 1
// (`h`), by the angles pos x freq(d + e), in float32. sincosf, not the intrinsic: the angles reach
// the context length in radians, where __sincosf's error would show.
__device__ __forceinline__ void rope_pair(float2& l, float2& h, float pos, int dim, const DecodeParams& p) {
  float s0, c0, s1, c1;
  sincosf(pos * (p.rope_rcp_scale * exp2f(float(dim) * p.rope_freq_exp)), &s0, &c0);
  sincosf(pos * (p.rope_rcp_scale * exp2f(float(dim + 1) * p.rope_freq_exp)), &s1, &c1);
  const float2 l0 = l;
  l = make_float2(l0.x * c0 - h.x * s0, l0.y * c1 - h.y * s1);
  h = make_float2(h.x * c0 + l0.x * s0, h.y * c1 + l0.y * s1);
}

// rope_pair on an MMA operand register pair (two MT elements each), rounded back to MT once.
template <typename MT>
__device__ __forceinline__ void rope_rotate(uint32_t& lo, uint32_t& hi, float pos, int dim, const DecodeParams& p) {
  float2 l = unpack2<MT>(lo), h = unpack2<MT>(hi);
  rope_pair(l, h, pos, dim, p);
  lo = pack2<MT>(l.x, l.y);
  hi = pack2<MT>(h.x, h.y);
}

// NH: n-tiles of query rows (8 each): the CTA's heads x queries <= 8 NH. ROPE: a ROPE_LLAMA module
// (q and k rotated here; DecodeParams).
template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP, int NH, bool ROPE>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_paged_kernel(const DecodeParams p, const DecodeCtaShape shape, const FastDiv page_div, int64_t* errors) {
  constexpr bool FP8 = sizeof(KV) == 1;
  using MT = std::conditional_t<FP8, __half, T>;  // the MMAs' operand type
  using S = DecodeShape<KV, HEAD_DIM>;
  constexpr int CHUNKS = S::CHUNKS, VEC = S::VEC, STAGES = S::STAGES, KSTEPS = S::KSTEPS, DTILES = S::DTILES;
  constexpr int TILE = S::TILE, TM = TILE / 16;   // token m-tiles per tile
  constexpr int kHeadLanes = 4, kTokenLanes = 8;  // a head's keys: the lanes of one lane % 4, xor 4, 8, 16
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  uint4* wbuf = smem + warp * S::kWarpUnits;  // this warp's pipeline

  // The grid walks a work item's kv heads (x head chunks) fastest, so the CTAs reading the slices
  // of the same token rows run side by side: 8 NHD heads' 256-byte slices make one 2 KB row,
  // fetched from DRAM together (faster than the work item fastest: docs/perf/decode.md).
  const int group_size = int(p.num_qo_heads / p.num_kv_heads);
  const int head_chunks = group_size / shape.heads;
  const int q_len = int(p.q_len), q_chunks = (q_len + shape.queries - 1) / shape.queries;
  const int units = int(p.num_kv_heads) * head_chunks * q_chunks;
  const int unit = int(blockIdx.x % units), work = int(blockIdx.x / units);
  const int request = p.work_request[work];
  if (request < 0) return;  // padding entry (CUDA-graph capacity)
  const int tok_begin = p.work_token_begin[work];
  const int tok_end = p.work_token_end[work];
  const int out_index = p.work_out_index[work];
  const int kv_head = unit / (head_chunks * q_chunks);
  const int q_chunk = unit % q_chunks;
  CtaRows rows;  // row r of the CTA (an N column of the MMAs): query j0 + r / heads, head qo_head0 + r % heads
  rows.heads = shape.heads;
  rows.qo_head0 = kv_head * group_size + (unit / q_chunks % head_chunks) * shape.heads;
  rows.j0 = q_chunk * shape.queries;
  rows.queries = min(shape.queries, q_len - rows.j0);
  const int num_rows = rows.heads * rows.queries;
  // Query j0 + r / heads sits at position pos0 + r / heads and sees keys up to it (and from it -
  // window_left); with one query a request, pos0 = L - 1 and the item's range already says so.
  const int pos0 = p.kv_len[request] - q_len + rows.j0;

  // Q^T as the B operands: lane (g, t) holds row 8 nh + g (zero beyond the CTA's rows), dims
  // 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of each k-step. fp8: the dims in k_operands' order, times
  // the logit scale (so S is in log2 units, or logit / cap with a soft-cap) and k_scale, rounded to
  // f16 (clamped to its range: 65504 is beyond any real logit). ROPE: rotated at the query's
  // position first (dims d and d + D/2 are k-steps kk and kk + KSTEPS/2 at the same place).
  const float logit_scale = SOFTCAP ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e;
  uint32_t qb[KSTEPS][NH][2];
  {
    const float q_scale = logit_scale * p.k_scale;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      const int row = nh * 8 + g;
      const bool real = row < num_rows;
      const int jl = real ? row / rows.heads : 0;
      const T* q = static_cast<const T*>(p.q) + (int64_t(request) * q_len + rows.j0 + jl) * p.q_stride_b +
                   (rows.qo_head0 + (real ? row % rows.heads : 0)) * p.q_stride_h;
      if constexpr (ROPE) {
        const float pos = float(pos0 + jl);
#pragma unroll
        for (int kk = 0; kk < KSTEPS / 2; ++kk) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int col = FP8 ? fp8::qk_dim(kk, half, t) : kk * 16 + 2 * t + half * 8;
            float2 l = unpack2<T>(real ? *reinterpret_cast<const uint32_t*>(q + col) : 0u);
            float2 h = unpack2<T>(real ? *reinterpret_cast<const uint32_t*>(q + col + HEAD_DIM / 2) : 0u);
            rope_pair(l, h, pos, col, p);
            if constexpr (FP8) {
              auto scaled = [&](float x) { return fminf(fmaxf(x * q_scale, -65504.0f), 65504.0f); };
              qb[kk][nh][half] = pack2<__half>(scaled(l.x), scaled(l.y));
              qb[kk + KSTEPS / 2][nh][half] = pack2<__half>(scaled(h.x), scaled(h.y));
            } else {
              qb[kk][nh][half] = pack2<T>(l.x, l.y);
              qb[kk + KSTEPS / 2][nh][half] = pack2<T>(h.x, h.y);
            }
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int col = FP8 ? fp8::qk_dim(kk, half, t) : kk * 16 + 2 * t + half * 8;
            const uint32_t pair = real ? *reinterpret_cast<const uint32_t*>(q + col) : 0u;
            if constexpr (FP8) {
              const T* e = reinterpret_cast<const T*>(&pair);
              auto scaled = [&](T x) { return fminf(fmaxf(Convert<T>::to_float(x) * q_scale, -65504.0f), 65504.0f); };
              qb[kk][nh][half] = pack2<__half>(scaled(e[0]), scaled(e[1]));
            } else {
              qb[kk][nh][half] = pair;
            }
          }
        }
      }
    }
  }
  // O^T accumulators: o[c][nh] rows are dims of m-tile c, columns heads 8 nh + 2t, +1.
  float o[DTILES][NH][4];
#pragma unroll
  for (int c = 0; c < DTILES; ++c) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) o[c][nh][0] = o[c][nh][1] = o[c][nh][2] = o[c][nh][3] = 0.0f;
  }
  float m[NH][2], l[NH][2];  // heads 8 nh + 2t + j: running max (log2 units), this lane's share of the sum
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) m[nh][0] = m[nh][1] = neg_inf(), l[nh][0] = l[nh][1] = 0.0f;

  const PagedKV& kv = p.kv;
  const int64_t first_page = kv.page_indptr[request];
  bool bad = false;  // this thread met a page id out of range: the CTA's outputs become NaN
  const KV* k_head = static_cast<const KV*>(kv.k) + kv_head * kv.k_head_stride;
  const KV* v_head = static_cast<const KV*>(kv.v) + kv_head * kv.v_head_stride;
  const uint32_t page_size = static_cast<uint32_t>(kv.page_size);
  const int num_tiles = (tok_end - tok_begin + TILE - 1) / TILE;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;

  // Copies are coalesced: one cp.async instruction covers 32 / CHUNKS whole token rows (two
  // 256-byte rows at head_dim 128), lane l copying 16-byte chunk l % CHUNKS of rows
  // l / CHUNKS + kRowsPerCopy c.
  constexpr int kRowsPerCopy = 32 / CHUNKS;
  const int copy_chunk = lane % CHUNKS, copy_row = lane / CHUNKS;
  // Pages of 16k tokens with the item starting on a 16-token boundary (the plan's chunks are
  // multiples of 64): each 16-row m-tile of a tile lies in one page, so it takes one page id and a
  // row's address is the m-tile's plus row x slot stride. Other caches look up a page per token
  // (lanes 0..TILE-1) and hand it to the copying lanes by shuffle. (The per-row shuffles and
  // 64-bit products were ~200 of a 16-bit tile loop's ~670 instructions.)
  const bool whole_pages = kv.page_size % 16 == 0 && tok_begin % 16 == 0;
  const int64_t k_row_step = kRowsPerCopy * kv.k_slot_stride, v_row_step = kRowsPerCopy * kv.v_slot_stride;
  static_assert(16 % kRowsPerCopy == 0, "a copy instruction's rows lie in one m-tile");
  auto issue = [&](int stage, int tile) {
    const int tile_tok0 = tok_begin + (warp + tile * kDecodeWarps) * TILE;
    uint4* kdst = wbuf + (stage * 2 + 0) * TILE * CHUNKS + copy_row * CHUNKS;
    uint4* vdst = wbuf + (stage * 2 + 1) * TILE * CHUNKS + copy_row * CHUNKS;
    if (whole_pages) {
#pragma unroll
      for (int mt = 0; mt < TM; ++mt) {
        const int tok0 = tile_tok0 + mt * 16;
        const uint32_t page_index = page_div.div(static_cast<uint32_t>(tok0));
        // The same address in every lane; none past the item (its rows are zero-filled, not read).
        const int64_t id = tok0 < tok_end ? load_page(kv, first_page, page_index) : -1;
        const int64_t page = id >= 0 ? id : 0;
        const int64_t slot0 = tok0 - int64_t(page_index) * kv.page_size + copy_row;
        const KV* ksrc = k_head + page * kv.k_page_stride + slot0 * kv.k_slot_stride + copy_chunk * VEC;
        const KV* vsrc = v_head + page * kv.v_page_stride + slot0 * kv.v_slot_stride + copy_chunk * VEC;
#pragma unroll
        for (int c = 0; c < 16 / kRowsPerCopy; ++c) {
          const int row = mt * 16 + c * kRowsPerCopy + copy_row;
          const bool valid = id >= 0 && tile_tok0 + row < tok_end;
          const int phys = (row - copy_row) * CHUNKS + S::swizzle(row, copy_chunk);
          cp_async_16(kdst + phys, ksrc, valid);
          cp_async_16(vdst + phys, vsrc, valid);
          ksrc += k_row_step;
          vsrc += v_row_step;
        }
        if (tok0 < tok_end && id < 0) {  // cold: say why (once), and poison the CTA's outputs
          if (lane == 0) record_page_error(kv, request, first_page, page_index, errors);
          bad = true;
        }
      }
      cp_async_commit();
    } else {
      const int my_tok = tile_tok0 + lane % TILE;
      const uint32_t utok = my_tok < tok_end ? static_cast<uint32_t>(my_tok) : 0u;
      const uint32_t my_page_index = page_div.div(utok);
      // -1: past the request, or no page (recorded after the copies are issued; its rows are not read)
      const int my_page = my_tok < tok_end ? static_cast<int>(load_page(kv, first_page, my_page_index)) : -1;
      const int my_slot = static_cast<int>(utok - my_page_index * page_size);
#pragma unroll
      for (int c = 0; c < TILE / kRowsPerCopy; ++c) {
        const int row = c * kRowsPerCopy + copy_row;
        const int row_page = __shfl_sync(0xffffffffu, my_page, row);
        const int64_t slot = __shfl_sync(0xffffffffu, my_slot, row);
        const bool valid = row_page >= 0;
        const int64_t page = valid ? row_page : 0;
        const int phys = c * kRowsPerCopy * CHUNKS + S::swizzle(row, copy_chunk);
        cp_async_16(kdst + phys, k_head + page * kv.k_page_stride + slot * kv.k_slot_stride + copy_chunk * VEC, valid);
        cp_async_16(vdst + phys, v_head + page * kv.v_page_stride + slot * kv.v_slot_stride + copy_chunk * VEC, valid);
      }
      cp_async_commit();
      if (my_tok < tok_end && my_page < 0) {  // cold: say why, and poison the CTA's outputs
        record_page_error(kv, request, first_page, my_page_index, errors);
        bad = true;
      }
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
  // ldmatrix addressing: lanes 8j..8j+7 give the rows of matrix j. Matrices 0/1 are the m-tile's
  // tokens 0-7 / 8-15 (A rows g and g+8), 2/3 the same tokens one chunk on (A columns 8-15).
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

    const int tile_tok0 = tok_begin + (warp + tile * kDecodeWarps) * TILE;
    // S^T = K Q^T: s[mt][nh] rows are tokens 16 mt + g, +8; columns rows 8 nh + 2t, +1 of the CTA.
    // ROPE: each k-step's fragment and its partner D/2 dims on (the same lanes and registers) are
    // loaded together and rotated at the tokens' positions before their MMAs.
    float s[TM][NH][4] = {};
#pragma unroll
    for (int mt = 0; mt < TM; ++mt) {
      const int tok = mt * 16 + (ld_mat % 2) * 8 + ld_row;
      const float row_pos = float(tile_tok0 + mt * 16 + g);  // A row g's token (g + 8: + 8)
      if constexpr (FP8 && ROPE) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS / 2; kk += 2) {
          uint32_t r[4], r2[4];
          ldmatrix_x4(r, kt + tok * CHUNKS + S::swizzle(tok, kk + ld_mat / 2));
          ldmatrix_x4(r2, kt + tok * CHUNKS + S::swizzle(tok, kk + KSTEPS / 2 + ld_mat / 2));
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            uint32_t a[4], b[4];
            fp8::k_operands(r[2 * c2], a[0], a[2]);
            fp8::k_operands(r[2 * c2 + 1], a[1], a[3]);
            fp8::k_operands(r2[2 * c2], b[0], b[2]);
            fp8::k_operands(r2[2 * c2 + 1], b[1], b[3]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // a[i]: token row g + 8 (i & 1), dims qk_dim(kk + c2, i >> 1, t)
              rope_rotate<MT>(a[i], b[i], row_pos + float((i & 1) * 8), fp8::qk_dim(kk + c2, i >> 1, t), p);
            }
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
              mma_16x8x16<MT>(s[mt][nh], a, qb[kk + c2][nh][0], qb[kk + c2][nh][1]);
              mma_16x8x16<MT>(s[mt][nh], b, qb[kk + c2 + KSTEPS / 2][nh][0], qb[kk + c2 + KSTEPS / 2][nh][1]);
            }
          }
        }
      } else if constexpr (ROPE) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS / 2; ++kk) {
          uint32_t a[4], b[4];
          ldmatrix_x4(a, kt + tok * CHUNKS + S::swizzle(tok, 2 * kk + ld_mat / 2));
          ldmatrix_x4(b, kt + tok * CHUNKS + S::swizzle(tok, 2 * (kk + KSTEPS / 2) + ld_mat / 2));
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // a[i]: token row g + 8 (i & 1), dims 16 kk + 2t + 8 (i >> 1)
            rope_rotate<MT>(a[i], b[i], row_pos + float((i & 1) * 8), kk * 16 + 2 * t + (i >> 1) * 8, p);
          }
#pragma unroll
          for (int nh = 0; nh < NH; ++nh) {
            mma_16x8x16<MT>(s[mt][nh], a, qb[kk][nh][0], qb[kk][nh][1]);
            mma_16x8x16<MT>(s[mt][nh], b, qb[kk + KSTEPS / 2][nh][0], qb[kk + KSTEPS / 2][nh][1]);
          }
        }
      } else if constexpr (FP8) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {  // a 16-byte chunk holds one k-step of fp8 dims
          uint32_t r[4];
          ldmatrix_x4(r, kt + tok * CHUNKS + S::swizzle(tok, kk + ld_mat / 2));
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            uint32_t a[4];
            fp8::k_operands(r[2 * c2], a[0], a[2]);      // tokens g: k positions 2t.., 2t+8..
            fp8::k_operands(r[2 * c2 + 1], a[1], a[3]);  // tokens g + 8
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) mma_16x8x16<MT>(s[mt][nh], a, qb[kk + c2][nh][0], qb[kk + c2][nh][1]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, kt + tok * CHUNKS + S::swizzle(tok, 2 * kk + ld_mat / 2));
#pragma unroll
          for (int nh = 0; nh < NH; ++nh) mma_16x8x16<MT>(s[mt][nh], a, qb[kk][nh][0], qb[kk][nh][1]);
        }
      }
    }
    // Only the item's last tile has keys past its end; with several queries a request, the tiles
    // holding its last q_len - 1 keys (or a window's first ones) have keys some rows do not see.
    const bool edge = tile_tok0 + TILE > tok_end || tile_tok0 + TILE - 1 > pos0 ||
                      (p.window_left >= 0 && tile_tok0 < pos0 + rows.queries - 1 - p.window_left);
    int last_key[NH][2];  // the last key column 8 nh + 2t + j sees: its query's position
    if (edge) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
        last_key[nh][0] = pos0 + (nh * 8 + 2 * t) / rows.heads;
        last_key[nh][1] = pos0 + (nh * 8 + 2 * t + 1) / rows.heads;
      }
    }
    const int window = p.window_left >= 0 ? p.window_left : 1 << 30;
    float col_max[NH][2];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) col_max[nh][0] = col_max[nh][1] = neg_inf();
#pragma unroll
    for (int mt = 0; mt < TM; ++mt) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float x = s[mt][nh][i] * scale;
          if constexpr (SOFTCAP) x = tanhf(x) * (p.soft_cap * kLog2e);
          if (edge) {
            const int key = tile_tok0 + mt * 16 + g + (i >> 1) * 8, last = last_key[nh][i & 1];
            if (key >= tok_end || key > last || key < last - window) x = neg_inf();
          }
          s[mt][nh][i] = x;
          col_max[nh][i & 1] = fmaxf(col_max[nh][i & 1], x);
        }
      }
    }
    float rescale[NH][2], m_use[NH][2];
    bool moved = false;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        rescale[nh][j] =
            online_softmax_step<kHeadLanes, kTokenLanes>(col_max[nh][j], 1.0f, m[nh][j], l[nh][j], m_use[nh][j]);
        moved |= rescale[nh][j] != 1.0f;
      }
    }
    if (__any_sync(0xffffffffu, moved)) {  // once the maxima settle, most tiles move none
#pragma unroll
      for (int c = 0; c < DTILES; ++c) {
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
          o[c][nh][0] *= rescale[nh][0];
          o[c][nh][1] *= rescale[nh][1];
          o[c][nh][2] *= rescale[nh][0];
          o[c][nh][3] *= rescale[nh][1];
        }
      }
    }
    // P^T = exp2(S^T - m) as the B operands of O^T += V^T P^T, one k-step per token m-tile: the
    // S^T fragment's 8 x 8 halves (tokens g / g + 8 x heads 2t, 2t+1), packed and transposed,
    // are b0 / b1 (tokens 2t, 2t+1 / 2t+8, 2t+9 of head g).
    uint32_t pb[TM][NH][2];
#pragma unroll
    for (int mt = 0; mt < TM; ++mt) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          e[i] = fast_exp2(s[mt][nh][i] - m_use[nh][i & 1]);
          l[nh][i & 1] += e[i];
        }
        pb[mt][nh][0] = movmatrix_trans(pack2<MT>(e[0], e[1]));
        pb[mt][nh][1] = movmatrix_trans(pack2<MT>(e[2], e[3]));
      }
    }
    // O^T += V^T P^T per token m-tile mt, with V^T from ldmatrix.trans (16-bit: matrices 0/1 the
    // tokens 0-7 of dims 0-7 / 8-15 of m-tile c, 2/3 tokens 8-15; fp8: matrices 0/1 the tokens
    // 0-7 / 8-15 of chunk c, 2/3 of chunk c + 1, each a whole m-tile of 16 dims after v_operands).
#pragma unroll
    for (int mt = 0; mt < TM; ++mt) {
      if constexpr (FP8) {
        const int tok = mt * 16 + (ld_mat % 2) * 8 + ld_row;
#pragma unroll
        for (int c = 0; c < DTILES; c += 2) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, vt + tok * CHUNKS + S::swizzle(tok, c + ld_mat / 2));
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            uint32_t a[4];
            fp8::v_operands(r[2 * c2], a[0], a[1]);      // tokens 0-7: rows g (dim 2g), g + 8 (2g + 1)
            fp8::v_operands(r[2 * c2 + 1], a[2], a[3]);  // tokens 8-15
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) mma_16x8x16<MT>(o[c + c2][nh], a, pb[mt][nh][0], pb[mt][nh][1]);
          }
        }
      } else {
        const int tok = mt * 16 + (ld_mat / 2) * 8 + ld_row;
#pragma unroll
        for (int c = 0; c < DTILES; ++c) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, vt + tok * CHUNKS + S::swizzle(tok, 2 * c + ld_mat % 2));
#pragma unroll
          for (int nh = 0; nh < NH; ++nh) mma_16x8x16<MT>(o[c][nh], a, pb[mt][nh][0], pb[mt][nh][1]);
        }
      }
    }
    __syncwarp();  // all lanes are done reading this stage before it is refilled
  }
  cp_async_wait<0>();
  // The staging buffers become the combine buffer; and a bad page anywhere poisons the CTA's rows.
  const bool poisoned = __syncthreads_or(bad);

  // Head sums over the 8 lanes holding a head's keys, then each warp's (m, l, o) into shared memory.
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
    for (int j = 0; j < 2; ++j) l[nh][j] = row_sum_over_lanes<kHeadLanes, kTokenLanes>(l[nh][j]);
  }
  constexpr int ROW = S::kCombineRow;
  float* c_m = reinterpret_cast<float*>(smem);        // [warp][head]
  float* c_l = c_m + kDecodeWarps * kMaxHeadsPerCta;  // [warp][head]
  float* c_o = c_l + kDecodeWarps * kMaxHeadsPerCta;  // [warp][head][ROW]
  if (g == 0) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        c_m[warp * kMaxHeadsPerCta + nh * 8 + 2 * t + j] = m[nh][j];
        c_l[warp * kMaxHeadsPerCta + nh * 8 + 2 * t + j] = l[nh][j];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < DTILES; ++c) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int head = nh * 8 + 2 * t + (i & 1), row = g + (i >> 1) * 8;
        const int dim = FP8 ? fp8::pv_dim(c, row) : c * 16 + row;
        c_o[(warp * kMaxHeadsPerCta + head) * ROW + dim] = o[c][nh][i];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < num_rows * HEAD_DIM; idx += kDecodeThreads) {
    const int row = idx / HEAD_DIM, col = idx % HEAD_DIM;
    float m_all = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m_all = fmaxf(m_all, c_m[w * kMaxHeadsPerCta + row]);
    float l_all = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float wgt = scale_from(c_m[w * kMaxHeadsPerCta + row], m_all);
      l_all += wgt * c_l[w * kMaxHeadsPerCta + row];
      acc += wgt * c_o[(w * kMaxHeadsPerCta + row) * ROW + col];
    }
    const float value = poisoned ? quiet_nan() : l_all > 0.0f ? acc / l_all * p.v_scale : 0.0f;
    const float lse = poisoned ? quiet_nan() : merged_lse(m_all, l_all);
    const int head = rows.qo_head0 + row % rows.heads, j = rows.j0 + row / rows.heads;
    if (out_index < 0) {
      const int64_t out_row = int64_t(request) * q_len + j;
      static_cast<T*>(p.out)[out_row * p.out_stride_b + head * p.out_stride_h + col] = Convert<T>::from_float(value);
      if (p.lse != nullptr && col == 0) p.lse[out_row * p.lse_stride_b + head] = lse;
    } else {
      const int64_t state = (int64_t(out_index) * q_len + j) * p.num_qo_heads + head;
      p.partial_out[state * HEAD_DIM + col] = value;
      if (col == 0) p.partial_lse[state] = lse;
    }
  }
  if (out_index >= 0) {
    const SplitMerge merge{
        units,   p.work_merge_index, p.merge_indptr, p.merge_counter, p.merge_capacity, p.num_qo_heads,
        p.q_len, p.partial_out,      p.partial_lse,  p.out,           p.out_stride_b,   p.out_stride_h,
        p.lse,   p.lse_stride_b};
    merge_if_last<T, HEAD_DIM>(merge, smem, work, unit, request, rows);
  }
}

// ROPE: a ROPE_LLAMA module (pos_encoding_mode; DecodeParams).
template <typename T, typename KV, int HEAD_DIM, bool SOFTCAP, bool ROPE = false>
Status launch_decode(const DecodeParams& p, LaunchContext ctx) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "decode: num_qo_heads (" + std::to_string(p.num_qo_heads) +
                                ") must be a multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) + ")");
  }
  if (p.q_len < 1 || p.q_len > 0x7fffffffLL || (p.kv_len == nullptr && p.work_capacity > 0)) {
    return Status::Error(
        1, "decode: q_len must be >= 1 (got " + std::to_string(p.q_len) + ") and kv_len the requests' lengths");
  }
  if (p.work_capacity == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const DecodeCtaShape shape = decode_cta_shape(p.num_qo_heads / p.num_kv_heads, p.q_len);
  const int rows = shape.heads * shape.queries;
  const int64_t units = decode_ctas_per_item(p.num_qo_heads, p.num_kv_heads, p.q_len);
  if (p.work_capacity * units > 0x7fffffffLL) {
    return Status::Error(1, "decode: " + std::to_string(p.work_capacity) + " work items x " + std::to_string(units) +
                                " CTAs each exceed one launch's grid (2^31 - 1)");
  }
  const dim3 grid(static_cast<unsigned>(p.work_capacity * units));
  if (p.merge_capacity > 0 && p.merge_counter == nullptr) {
    return Status::Error(1, "decode: a split-KV plan needs its merge_counter buffer");
  }
  using S = DecodeShape<KV, HEAD_DIM>;
  // One n-tile of query rows up to 8 a CTA (every GQA group of <= 8 at one query), two up to 16.
  constexpr auto kernel1 = decode_paged_kernel<T, KV, HEAD_DIM, SOFTCAP, 1, ROPE>;
  constexpr auto kernel2 = decode_paged_kernel<T, KV, HEAD_DIM, SOFTCAP, 2, ROPE>;
  const auto kernel = rows <= 8 ? kernel1 : kernel2;
  Status st =
      cuda_status(rows <= 8 ? allow_smem<kernel1>(S::kSmemBytes, device) : allow_smem<kernel2>(S::kSmemBytes, device),
                  "decode: raising the shared-memory limit");
  if (!st.ok()) return st;
  const FastDiv page_div(static_cast<uint32_t>(p.kv.page_size));
  kernel<<<grid, kDecodeThreads, S::kSmemBytes, stream>>>(p, shape, page_div, ctx.errors);
  return cuda_status(cudaGetLastError(), "decode kernel launch");
}

}  // namespace kiln::attention
