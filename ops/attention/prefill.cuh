// Prefill attention on tensor cores (mma.sync m16n8k16, sm80+): kernel and launcher, the
// FlashAttention-2 scheme over a paged (or ragged: page_size 1) KV cache. See attention.h,
// PrefillParams, for the contract and the causal/window alignment; docs/perf/prefill.md for the
// tiling and the measurements behind it.
//
// One CTA = one work item (request, 128 consecutive queries) x one query head; eight warps own 16
// queries each (the MMA's rows). KV tiles of TILE tokens are copied by the whole CTA into shared
// memory (coalesced 16-byte cp.async of whole token rows, XOR-swizzled chunks, STAGES tiles in
// flight, the page of every row fetched a tile ahead) and shared by the warps. Per tile and warp:
// S = Q K^T, soft-cap, masks only on tiles that cross the diagonal, the window edge or the end,
// online softmax on the C fragments with the scale folded into exp2's FMA, P packed to 16 bits as
// the A operand of O += P V (ldmatrix.trans on V). Tiles outside the CTA's causal or window range
// are never loaded; a warp skips the tiles its own queries cannot see.
//
// Variants (compile-time, prefill_variants.cuh; each module instantiates one): CUSTOM_MASK ANDs
// every tile's logits with the request's mask bits; POS kRopeLlama rotates Q once and each K tile
// in shared memory as they land (one more barrier a tile), kAlibi adds the bias to the logits.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "ops/attention/attention.h"
#include "ops/attention/online_softmax.cuh"
#include "ops/attention/prefill_variants.cuh"
#include "ops/attention/state.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dtypes.h"
#include "ops/common/fast_div.cuh"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"

namespace kiln::attention {

constexpr int kPrefillQueries = 128;  // queries per CTA (one plan work item)
static_assert(kPrefillQueries == kPrefillQueriesPerItem, "one CTA serves one plan work item");

// The (work item, query head) of CTA b of a 1-D grid of work_capacity x num_qo_heads CTAs. The
// heads go in chunks of at least 4 (whole GQA groups, where the head count allows): items longest
// first within a chunk, a chunk's heads side by side. The hardware starts CTAs in index order, so
// the long causal items of every chunk start early and the last CTAs are short ones (a short
// tail), while the CTAs running at one time read the K/V of a chunk's few KV heads (L2-sized).
struct PrefillCta {
  int item, head;
};

__host__ __device__ inline int prefill_heads_per_chunk(int64_t num_qo_heads, int64_t num_kv_heads) {
  int64_t s = num_qo_heads / num_kv_heads;
  while (s < 4 && num_qo_heads % (2 * s) == 0) s *= 2;
  return static_cast<int>(s);
}

// The order itself, its two divisors computed once (a persistent CTA maps many b).
struct PrefillCtaOrder {
  uint32_t s, per_chunk;  // heads per chunk, CTAs per chunk
  __device__ __forceinline__ explicit PrefillCtaOrder(const PrefillParams& p)
      : PrefillCtaOrder(p, prefill_heads_per_chunk(p.num_qo_heads, p.num_kv_heads)) {}
  // Chunks of `heads` heads (a divisor of num_qo_heads); all of them: items in plan order (most
  // work first), the heads of an item side by side.
  __device__ __forceinline__ PrefillCtaOrder(const PrefillParams& p, int heads)
      : s(static_cast<uint32_t>(heads)), per_chunk(static_cast<uint32_t>(p.work_capacity) * s) {}
  __device__ __forceinline__ PrefillCta operator()(uint32_t b) const {
    const uint32_t chunk = b / per_chunk, rem = b % per_chunk;
    return {static_cast<int>(rem / s), static_cast<int>(chunk * s + rem % s)};
  }
};

__device__ __forceinline__ PrefillCta prefill_cta(const PrefillParams& p, uint32_t b) {
  return PrefillCtaOrder(p)(b);
}

// Grid size check shared by both prefill kernels' launchers.
inline Status prefill_grid(const PrefillParams& p, unsigned* blocks) {
  const int64_t n = p.work_capacity * p.num_qo_heads;
  if (n >= (int64_t{1} << 31)) {
    return Status::Error(1, "prefill: " + std::to_string(p.work_capacity) + " work items x " +
                                std::to_string(p.num_qo_heads) + " heads exceed one launch's 2^31 - 1 CTAs");
  }
  *blocks = static_cast<unsigned>(n);
  return Status::Ok();
}

template <typename T, int HEAD_DIM>
struct PrefillShape {
  static constexpr int CHUNKS = HEAD_DIM * int(sizeof(T)) / 16;  // 16-byte chunks per row
  static constexpr int VEC = 16 / int(sizeof(T));
  static constexpr int TILE = HEAD_DIM >= 256 ? 32 : 64;  // KV tokens per tile (registers for S)
  static constexpr int KSTEPS = HEAD_DIM / 16;
  static constexpr int NTILES = HEAD_DIM / 8;
  // MMA row tiles (16 queries each) per warp. Two let every K/V fragment read from shared memory
  // feed two MMAs, halving shared-memory traffic per FLOP (the limit with one: 8 warps x 32 KB of
  // K/V reads per tile). At head_dim 256, O of 32 rows would need 256 registers: one.
  static constexpr int MT = HEAD_DIM >= 256 ? 1 : 2;
  static constexpr int WARPS = kPrefillQueries / (16 * MT);
  static constexpr int THREADS = 32 * WARPS;
  // KV tiles in flight: Q (staged in shared memory, read per k-step) plus the stages must leave
  // room for two CTAs per SM at head_dim <= 128.
  static constexpr int STAGES = HEAD_DIM <= 64 ? 3 : 2;
  static constexpr int ROWS_PER_STEP = THREADS / CHUNKS;
  static constexpr int UNITS = TILE * CHUNKS / THREADS;  // K (and V) copies per thread and tile
  static constexpr int MIN_BLOCKS = HEAD_DIM <= 128 ? 2 : 1;
  static constexpr int kKVUnits = STAGES * 2 * TILE * CHUNKS;
  static constexpr int kQUnits = kPrefillQueries * CHUNKS;
  static constexpr size_t kSmemBytes = size_t(kKVUnits + kQUnits) * 16;
  static_assert(CHUNKS >= 8, "the swizzle needs at least 8 chunks per row");
  static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "a tile copies in whole steps");
};

// Shared memory of a variant: the plain kernel's, then the RoPE frequencies (float [HEAD_DIM / 2])
// and the custom mask's bits of the current tile: per row, each quad lane's TILE / 4 bits
// (quad_lane_bits), as uint16 [kPrefillQueries][4].
template <int HEAD_DIM, PrefillPosEncoding POS>
constexpr size_t prefill_rope_bytes() {
  return POS == PrefillPosEncoding::kRopeLlama ? HEAD_DIM / 2 * sizeof(float) : 0;
}

template <typename T, int HEAD_DIM, bool CUSTOM_MASK, PrefillPosEncoding POS>
constexpr size_t prefill_smem_bytes() {
  return PrefillShape<T, HEAD_DIM>::kSmemBytes + prefill_rope_bytes<HEAD_DIM, POS>() +
         (CUSTOM_MASK ? kPrefillQueries * 4 * sizeof(uint16_t) : 0);
}

template <typename T, int HEAD_DIM, bool SOFTCAP, bool CUSTOM_MASK = false,
          PrefillPosEncoding POS = PrefillPosEncoding::kNone>
__global__ void __launch_bounds__(PrefillShape<T, HEAD_DIM>::THREADS, PrefillShape<T, HEAD_DIM>::MIN_BLOCKS)
    prefill_paged_kernel(const PrefillParams p, const FastDiv page_div, int64_t* errors) {
  using S = PrefillShape<T, HEAD_DIM>;
  constexpr int CHUNKS = S::CHUNKS, VEC = S::VEC, TILE = S::TILE, KSTEPS = S::KSTEPS, NTILES = S::NTILES;
  constexpr int STAGES = S::STAGES, UNITS = S::UNITS, MT = S::MT, THREADS = S::THREADS;
  constexpr int NT = TILE / 8;  // n-tiles of S per tile
  constexpr bool ROPE = POS == PrefillPosEncoding::kRopeLlama, ALIBI = POS == PrefillPosEncoding::kAlibi;
  extern __shared__ uint4 smem[];
  uint4* q_smem = smem + S::kKVUnits;
  float* rope_freq = reinterpret_cast<float*>(smem + S::kKVUnits + S::kQUnits);  // ROPE only
  uint16_t* mask_bits = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(rope_freq) +
                                                    prefill_rope_bytes<HEAD_DIM, POS>());  // CUSTOM_MASK only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const PrefillCta cta = prefill_cta(p, blockIdx.x);
  const int request = p.work_request[cta.item];
  if (request < 0) return;
  const int q_begin = p.qo_indptr[request];
  const int qo_len = p.qo_indptr[request + 1] - q_begin;
  const int kv_len = p.kv_len[request];
  const int offset = kv_len - qo_len;  // query i sits at key position i + offset
  const int q0 = p.work_q_start[cta.item];
  const int head = cta.head;
  const int kv_head = head / int(p.num_qo_heads / p.num_kv_heads);
  const int wrow = warp * 16 * MT;                           // the warp's first row in the CTA
  const int row0 = q0 + wrow;                                // ... and its first query
  const int row_last = min(row0 + 16 * MT - 1, qo_len - 1);  // its last real query (< row0: none)
  const T* q = static_cast<const T*>(p.q) + head * p.q_stride_h;

  // KV range of the CTA: causal stops after the last query's diagonal, a window starts at the
  // first query's window edge (rounded down to a tile).
  const int last_q = min(q0 + kPrefillQueries, qo_len) - 1;
  const int kv_end = p.causal ? max(0, min(kv_len, last_q + offset + 1)) : kv_len;
  int kv_start = p.window_left >= 0 ? max(0, q0 + offset - p.window_left) : 0;
  kv_start = (kv_start / TILE) * TILE;
  const int num_tiles = kv_end > kv_start ? (kv_end - kv_start + TILE - 1) / TILE : 0;

  const PagedKV& kv = p.kv;
  const int64_t first_page = kv.page_indptr[request];
  bool bad = false;  // this thread met a page id out of range: the CTA's outputs become NaN
  const T* k_head = static_cast<const T*>(kv.k) + kv_head * kv.k_head_stride;
  const T* v_head = static_cast<const T*>(kv.v) + kv_head * kv.v_head_stride;

  // Copies: thread copies chunk `my_chunk` of rows my_row + u * ROWS_PER_STEP of each tile. The
  // page of each of those rows is loaded one tile ahead into registers (pg), so the page table's
  // latency is hidden behind a tile of math instead of stalling every copy.
  const int my_chunk = threadIdx.x % CHUNKS, my_row = threadIdx.x / CHUNKS;
  // Contiguous KV (single prefill, ragged): a request's token t is row t from its first page, so
  // there is no page table to read, only a row stride.
  const bool contiguous = p.kv_contiguous;
  const int64_t k_row = kv.page_size == 1 ? kv.k_page_stride : kv.k_slot_stride;
  const int64_t v_row = kv.page_size == 1 ? kv.v_page_stride : kv.v_slot_stride;
  // The rows of a contiguous request are those of one page id: every one must lie in the cache.
  int64_t contiguous_rows = 0;
  if (contiguous && num_tiles > 0) {  // (a request without keys may have no page entry)
    const int64_t first = page_at(kv, request, first_page, 0, errors);
    // one-token pages (ragged): rows are pages first ..; otherwise slots of page `first`
    const bool fits = first >= 0 && (kv.page_size == 1 ? first + kv_end <= kv.num_pages : kv_end <= kv.page_size);
    if (first >= 0 && !fits) record_error(errors, ErrorCode::kPageSlot, request, first + kv_end, kv.num_pages);
    bad = !fits;
    contiguous_rows = fits ? kv_end : 0;
    k_head += fits ? first * kv.k_page_stride : 0;
    v_head += fits ? first * kv.v_page_stride : 0;
  }
  // Paged KV: the request's entries of page_indices that its keys need are checked once here
  // (none is loaded when they leave the tensor); each id is checked where issue_kv uses it, a
  // tile after its load, as load_page would. A compare and branch on the loaded id next to its
  // load (the 2026-12-01 code) stalls every warp on the page table's latency once a tile
  // (docs/perf/prefill.md, version 6). A bad entry or id only sets `bad` in the loop; the cold
  // rescan after it records which one.
  const int needed_entries = kv_end > 0 ? static_cast<int>(page_div.div(static_cast<uint32_t>(kv_end - 1))) + 1 : 0;
  const bool entries_ok = first_page >= 0 && first_page + needed_entries <= kv.num_indices;
  const int load_end = entries_ok ? kv_end : 0;  // tokens whose page id may be loaded
  const uint32_t num_pages = static_cast<uint32_t>(kv.num_pages < INT_MAX ? kv.num_pages : INT_MAX);
  auto load_pages = [&](int tile, int32_t (&pg)[UNITS]) {
    if (contiguous) return;
#pragma unroll
    for (int u = 0; u < UNITS; ++u) {
      const int tok = kv_start + tile * TILE + my_row + u * S::ROWS_PER_STEP;
      pg[u] = tok < load_end ? kv.page_indices[first_page + page_div.div(static_cast<uint32_t>(tok))] : -1;
    }
  };
  auto issue_kv = [&](int stage, int tile, const int32_t (&pg)[UNITS]) {
    uint4* kdst = smem + (stage * 2 + 0) * TILE * CHUNKS;
    uint4* vdst = smem + (stage * 2 + 1) * TILE * CHUNKS;
    const int tok0 = kv_start + tile * TILE + my_row;
    if (contiguous) {
#pragma unroll
      for (int u = 0; u < UNITS; ++u) {
        const int row = my_row + u * S::ROWS_PER_STEP, tok = tok0 + u * S::ROWS_PER_STEP;
        const bool valid = tok < contiguous_rows;
        const int64_t utok = valid ? tok : 0;
        const int phys = swz<CHUNKS>(row, my_chunk);
        cp_async_16(kdst + phys, k_head + utok * k_row + my_chunk * VEC, valid);
        cp_async_16(vdst + phys, v_head + utok * v_row + my_chunk * VEC, valid);
      }
      return;
    }
#pragma unroll
    for (int u = 0; u < UNITS; ++u) {
      const int row = my_row + u * S::ROWS_PER_STEP, tok = tok0 + u * S::ROWS_PER_STEP;
      const bool ok = static_cast<uint32_t>(pg[u]) < num_pages;  // load_page's check (-1 fails it)
      const bool valid = tok < kv_end && ok;
      bad = bad || (tok < kv_end && !ok);
      const uint32_t utok = valid ? static_cast<uint32_t>(tok) : 0u;
      const int64_t slot = utok - page_div.div(utok) * page_div.d;
      const int64_t page = valid ? pg[u] : 0;
      const int phys = swz<CHUNKS>(row, my_chunk);
      cp_async_16(kdst + phys, k_head + page * kv.k_page_stride + slot * kv.k_slot_stride + my_chunk * VEC, valid);
      cp_async_16(vdst + phys, v_head + page * kv.v_page_stride + slot * kv.v_slot_stride + my_chunk * VEC, valid);
    }
  };

  // Q: the CTA's 128 rows staged in shared memory with the first KV tile (zero past qo_len), read
  // per k-step as A fragments.
  for (int unit = threadIdx.x; unit < kPrefillQueries * CHUNKS; unit += THREADS) {
    const int row = unit / CHUNKS, chunk = unit % CHUNKS;
    const bool valid = q0 + row < qo_len;
    const T* src = q + int64_t(q_begin + (valid ? q0 + row : 0)) * p.q_stride_n + chunk * VEC;
    cp_async_16(q_smem + swz<CHUNKS>(row, chunk), src, valid);
  }

  float o[MT][NTILES][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NTILES; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  float m[MT][2], l[MT][2];  // running max (scaled log2 units) and sum, rows g and g + 8
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = neg_inf(), l[mt][0] = l[mt][1] = 0.0f;

  // Prologue: STAGES - 1 tiles in flight (one commit group each, empty past the end), and the
  // pages of the next one in registers.
  int32_t pg[UNITS];
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < num_tiles) {
      load_pages(j, pg);
      issue_kv(j, j, pg);
    }
    cp_async_commit();
  }
  if (STAGES - 1 < num_tiles) load_pages(STAGES - 1, pg);

  // Logits are scaled into log2 units by kfac inside the exp2's FMA; with soft-cap they are
  // capped (and scaled) first. ALiBi scales them by sm_scale itself, to add the bias.
  const float pre = ALIBI ? 1.0f : p.sm_scale;  // the scale still to apply after the bias
  const float kfac = SOFTCAP ? 1.0f : pre * kLog2e;
  const float cap_in = pre / p.soft_cap, cap_out = p.soft_cap * kLog2e;
  [[maybe_unused]] const float slope = ALIBI ? alibi_slope(head, p.num_qo_heads) : 0.0f;
  // The custom mask's bytes of this request (mask_row_bits reads none outside them).
  [[maybe_unused]] int64_t mask_begin = 0, mask_end = 0;
  if constexpr (CUSTOM_MASK) {
    mask_begin = max(int64_t{0}, static_cast<int64_t>(p.mask_indptr[request]));
    mask_end = min(p.mask_bytes, static_cast<int64_t>(p.mask_indptr[request + 1]));
  }
  if constexpr (ROPE) rope_frequencies<HEAD_DIM, THREADS>(p, rope_freq);  // read after the loop's barrier
  const int ld_row = lane % 8, ld_mat = lane / 8;
  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile `tile` has landed for every warp, and every warp is done with tile - 1
    {
      const int next = tile + STAGES - 1;
      if (next < num_tiles) issue_kv(next % STAGES, next, pg);
      cp_async_commit();
      if (next + 1 < num_tiles) load_pages(next + 1, pg);
    }
    const int tile_tok0 = kv_start + tile * TILE;
    if constexpr (ROPE || CUSTOM_MASK) {
      // The whole CTA rotates the landed tile (and Q with the first one), and gathers the tile's
      // mask bits of its 128 rows into shared memory (the loads issued here, while few registers
      // are live, instead of in the mask step), then one barrier.
      if constexpr (CUSTOM_MASK) {
        for (int row = threadIdx.x; row < kPrefillQueries; row += THREADS) {
          const int qi = q0 + row;
          const int64_t bit0 = mask_begin * 8 + int64_t(qi) * kv_len + tile_tok0;
          const uint64_t w = qi < qo_len ? mask_row_bits<TILE>(p.custom_mask, mask_begin, mask_end, bit0) : 0;
#pragma unroll
          for (int lane_t = 0; lane_t < 4; ++lane_t)
            mask_bits[row * 4 + lane_t] = static_cast<uint16_t>(quad_lane_bits<TILE>(w, lane_t));
        }
      }
      if constexpr (ROPE) {
        if (tile == 0) rope_rotate_tile<T, HEAD_DIM, THREADS, kPrefillQueries>(q_smem, q0 + offset, rope_freq);
        rope_rotate_tile<T, HEAD_DIM, THREADS, TILE>(smem + (tile % STAGES) * 2 * TILE * CHUNKS, tile_tok0, rope_freq);
      }
      __syncthreads();
    }
    const int tile_tok_last = tile_tok0 + TILE - 1;
    // Warps whose queries see nothing of this tile skip it (the causal diagonal and the window's
    // lower edge cut the tile range per warp, not only per CTA).
    bool active = row0 <= row_last;
    if (p.causal) active = active && tile_tok0 <= row_last + offset;
    if (p.window_left >= 0) active = active && tile_tok_last >= row0 + offset - p.window_left;
    if (!active) continue;
    // Only tiles that cross the end of the keys, the diagonal or the window edge need masks.
    bool need_mask = tile_tok_last >= kv_end;
    if (p.causal) need_mask = need_mask || tile_tok_last > row0 + offset;
    if (p.window_left >= 0) need_mask = need_mask || tile_tok0 < row0 + 16 * MT - 1 + offset - p.window_left;

    const int stage = tile % STAGES;
    const uint4* kt = smem + (stage * 2 + 0) * TILE * CHUNKS;
    const uint4* vt = smem + (stage * 2 + 1) * TILE * CHUNKS;

    // S = Q K^T: each K fragment feeds the MT row tiles.
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = wrow + mt * 16 + (ld_mat & 1) * 8 + ld_row, chunk = 2 * kk + (ld_mat >> 1);
        ldmatrix_x4(a[mt], q_smem + swz<CHUNKS>(row, chunk));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        const int tok = np * 16 + (ld_mat / 2) * 8 + ld_row, chunk = 2 * kk + ld_mat % 2;
        ldmatrix_x4(b, kt + swz<CHUNKS>(tok, chunk));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x16<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16x8x16<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    if constexpr (ALIBI) {  // logit = q.k * sm_scale + slope * (j - i)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int first = tile_tok0 + 2 * t - (row0 + mt * 16 + g + r * 8);  // key - query at n = j = 0
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float bias = slope * static_cast<float>(first + n * 8 + j);
              s[mt][n][2 * r + j] = fmaf(s[mt][n][2 * r + j], p.sm_scale, bias);
            }
        }
    }
    if constexpr (SOFTCAP) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mt][n][i] = tanhf(s[mt][n][i] * cap_in) * cap_out;
    }
    if (CUSTOM_MASK || need_mask) {
      // Branch-free: each row's visible keys are one interval [lo, hi] (end of keys, causal
      // diagonal, window edge), so an element costs two compares and a select; a custom mask
      // ANDs in the lane's bits of the row, gathered above.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qi = row0 + mt * 16 + g + r * 8, qpos = qi + offset;
          const int hi = p.causal ? min(kv_end - 1, qpos) : kv_end - 1;
          const int lo = p.window_left >= 0 ? qpos - p.window_left : INT_MIN;
          [[maybe_unused]] uint32_t bits = 0;
          if constexpr (CUSTOM_MASK) bits = mask_bits[(qi - q0) * 4 + t];
#pragma unroll
          for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int key = tile_tok0 + n * 8 + 2 * t + j;
              bool visible = key >= lo && key <= hi;
              if constexpr (CUSTOM_MASK) visible = visible && ((bits >> (2 * n + j)) & 1u);
              s[mt][n][2 * r + j] = visible ? s[mt][n][2 * r + j] : neg_inf();
            }
          }
        }
      }
    }
    float m_use[MT][2], rescale[MT][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float row_max = neg_inf();
#pragma unroll
        for (int n = 0; n < NT; ++n) row_max = fmaxf(row_max, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
        rescale[mt][r] = online_softmax_step(row_max, kfac, m[mt][r], l[mt][r], m_use[mt][r]);
        moved = moved || rescale[mt][r] != 1.0f;
      }
    }
    // Past the first tiles the running max rarely moves: skip the O rescale when it moved for no
    // row of the warp (one vote, so the branch stays uniform).
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NTILES; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) o[mt][n][i] *= rescale[mt][i >> 1];
    }
    // O += P V, one k-step (16 tokens = two n-tiles of S) at a time; each V fragment feeds the MT
    // row tiles.
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float e[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            e[i] = fast_exp2(fmaf(s[mt][2 * ks + h][i], kfac, -m_use[mt][i >> 1]));
            l[mt][i >> 1] += e[i];
          }
          pa[mt][2 * h + 0] = pack2<T>(e[0], e[1]);
          pa[mt][2 * h + 1] = pack2<T>(e[2], e[3]);
        }
      }
#pragma unroll
      for (int np = 0; np < NTILES / 2; ++np) {
        uint32_t b[4];
        const int tok = ks * 16 + (ld_mat % 2) * 8 + ld_row, chunk = 2 * np + ld_mat / 2;
        ldmatrix_x4_trans(b, vt + swz<CHUNKS>(tok, chunk));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x16<T>(o[mt][2 * np], pa[mt], b[0], b[1]);
          mma_16x8x16<T>(o[mt][2 * np + 1], pa[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  if (bad && !contiguous) {  // the cold rescan: which entry or id was bad, as load_page sees it
#pragma unroll 1
    for (int tile = 0; tile < num_tiles; ++tile) {
#pragma unroll 1
      for (int u = 0; u < UNITS; ++u) {
        const int tok = kv_start + tile * TILE + my_row + u * S::ROWS_PER_STEP;
        const int64_t page = page_div.div(static_cast<uint32_t>(tok));
        if (tok < kv_end && load_page(kv, first_page, page) < 0)
          record_page_error(kv, request, first_page, page, errors);
      }
    }
  }
  const bool poisoned = __syncthreads_or(bad);  // a page out of range anywhere: NaN rows

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int qi = row0 + mt * 16 + g + r * 8;
      if (qi >= qo_len) continue;
      const float inv = poisoned ? quiet_nan() : sum > 0.0f ? 1.0f / sum : 0.0f;
      T* out = static_cast<T*>(p.out) + int64_t(q_begin + qi) * p.out_stride_n + head * p.out_stride_h;
#pragma unroll
      for (int n = 0; n < NTILES; ++n) {
        const uint32_t packed = pack2<T>(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) = packed;
      }
      if (p.lse != nullptr && t == 0) {
        p.lse[int64_t(q_begin + qi) * p.lse_stride_n + head] = poisoned ? quiet_nan() : merged_lse(m[mt][r], sum);
      }
    }
  }
}

template <typename T, int HEAD_DIM, bool SOFTCAP, bool CUSTOM_MASK = false,
          PrefillPosEncoding POS = PrefillPosEncoding::kNone>
Status launch_prefill(const PrefillParams& p, LaunchContext ctx) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "prefill: num_qo_heads (" + std::to_string(p.num_qo_heads) +
                                ") must be a multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) + ")");
  }
  if (p.work_capacity == 0) return Status::Ok();
  unsigned blocks = 0;
  if (Status g = prefill_grid(p, &blocks); !g.ok()) return g;
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  using S = PrefillShape<T, HEAD_DIM>;
  constexpr auto kernel = prefill_paged_kernel<T, HEAD_DIM, SOFTCAP, CUSTOM_MASK, POS>;
  constexpr size_t smem_bytes = prefill_smem_bytes<T, HEAD_DIM, CUSTOM_MASK, POS>();
  Status st = cuda_status(allow_smem<kernel>(smem_bytes, device), "prefill: raising the shared-memory limit");
  if (!st.ok()) return st;
  if (p.kv.page_size <= 0 || p.kv.page_size > (int64_t{1} << 30)) {
    return Status::Error(1, "prefill: page_size " + std::to_string(p.kv.page_size) + " out of range");
  }
  const FastDiv page_div(static_cast<uint32_t>(p.kv.page_size));
  if (CUSTOM_MASK && p.mask_indptr == nullptr) {  // (an empty mask may have no data pointer)
    return Status::Error(1, "prefill: this module applies a custom mask; mask_indptr is required");
  }
  kernel<<<blocks, S::THREADS, smem_bytes, static_cast<cudaStream_t>(ctx.stream)>>>(p, page_div, ctx.errors);
  return cuda_status(cudaGetLastError(), "prefill kernel launch");
}

}  // namespace kiln::attention
