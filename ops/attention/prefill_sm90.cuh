// Prefill attention for Hopper (sm_90a): the FlashAttention-3 scheme (wgmma + TMA, warp
// specialised, ping-pong between two consumer warpgroups) over the same work list and
// PrefillParams contract as prefill.cuh (see attention.h for the causal/window alignment).
// docs/perf/prefill-sm90.md has the design notes and measurements.
//
// One CTA = one plan work item (128 queries) x one query head, 384 threads:
//   warpgroup 0, producer: one thread issues TMA loads (Q once; K and V tiles of BLOCK_N keys into
//     a STAGES-deep shared-memory ring, "full" mbarriers counting bytes, "empty" mbarriers counting
//     the consumers' 256 arrivals); the other producer warps retire. Where TMA boxes cannot tile
//     the cache (pages under 16 tokens, page sizes that neither divide nor are multiples of the
//     tile, strides a tensor map rejects) all 128 producer threads gather K and V with cp.async
//     instead (sm90_gather_kv), into the same swizzled tiles, completing on the same barriers.
//   warpgroups 1 and 2, consumers, 64 queries each: S = Q K^T with wgmma (Q and K K-major in
//     shared memory, 128-byte swizzle), scale / soft-cap / masks / online softmax on the
//     accumulator registers, P packed to 16 bits in registers as the A operand of O += P V (V
//     MN-major, the transpose bit). Each consumer overlaps its own GEMMs with its softmax (S of the
//     next tile and P V of this one are in flight while the softmax runs), and the two take turns
//     issuing GEMMs (named-barrier ping-pong), so one's softmax runs under the other's GEMMs.
// setmaxnreg moves registers from the producer (40-72, by head_dim and grid) to the consumers
// (232-216).
//
// KV tiles come in TMA boxes of 64 head-dim columns (128 bytes, the swizzle span) by B rows:
//   paged cache: B = min(page_size, BLOCK_N), one box per page (page_size | BLOCK_N, at most
//     kSm90MaxTmaBoxes boxes a chunk) or one box per tile inside a page (BLOCK_N | page_size);
//     pages past the request's last are skipped. Other paged caches are gathered.
//   kv_contiguous, page_size 1 (ragged): keys of a request are consecutive cache pages; one box
//     of BLOCK_N pages per tile.
//   kv_contiguous, one page per request (single prefill): one box of BLOCK_N slots per tile.
// Rows past the cache's extent read as zero (TMA out-of-bounds fill); rows past kv_len inside a
// paged cache's last page are stale memory, so each consumer zeroes V's rows >= kv_len of the last
// tile before P V (0 * NaN would otherwise poison O); K's are masked to -inf like any key. The
// gather zero-fills rows past kv_len itself.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's entry point
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/attention/attention.h"
#include "ops/attention/online_softmax.cuh"
#include "ops/attention/prefill.cuh"
#include "ops/attention/state.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"
#include "ops/common/sm90.cuh"
#include "ops/common/tma_host.h"

namespace kiln::attention {

constexpr int kSm90Consumers = 2;                         // consumer warpgroups, 64 queries each
constexpr int kSm90Threads = 128 * (1 + kSm90Consumers);  // + the producer warpgroup
constexpr int kSm90Queries = 64 * kSm90Consumers;         // queries per CTA: one plan work item
static_assert(kSm90Queries == kPrefillQueriesPerItem, "one CTA serves one plan work item");

template <typename T, int HEAD_DIM>
struct Sm90Shape {
  // KV keys per tile: a consumer's S is 64 x BLOCK_N f32 (BLOCK_N / 2 registers a thread) next to
  // O (HEAD_DIM / 2) and P (BLOCK_N / 4): 128 keys up to head_dim 128 (FA3's causal tile), 64 at
  // 256 where O alone takes 128 registers.
  static constexpr int BLOCK_N = HEAD_DIM <= 128 ? 128 : 64;
  static constexpr int CHUNKS = HEAD_DIM / 64;              // 128-byte column chunks
  static constexpr int Q_CHUNK_BYTES = kSm90Queries * 128;  // 128 rows x 128 B
  static constexpr int Q_BYTES = CHUNKS * Q_CHUNK_BYTES;
  static constexpr int KV_CHUNK_BYTES = BLOCK_N * 128;      // one chunk of a K or V tile
  static constexpr int KV_BYTES = CHUNKS * KV_CHUNK_BYTES;  // one K or V tile
  // As many stages as fit next to Q in 227 KB: 3 at head_dim 64 (16 KB tiles), else 2 (32 KB).
  static constexpr int STAGES = HEAD_DIM == 64 ? 3 : 2;
  // Q buffers: two where they fit (head_dim <= 128), so that a persistent CTA's producer loads
  // the next work unit's Q while the consumers still read this one's; one at 256.
  static constexpr int QBUF = HEAD_DIM <= 128 ? 2 : 1;
  // prefill_sm90_kernel's layout (one Q buffer; its mbarriers, then its bad-page flag)
  static constexpr int BAR_OFFSET_1 = Q_BYTES + 2 * STAGES * KV_BYTES;
  static constexpr int NUM_BARS_1 = 1 + 4 * STAGES;
  static constexpr size_t kSmemBytes1 = size_t(BAR_OFFSET_1) + NUM_BARS_1 * 8 + 16 + 1024;
  static constexpr int BAR_OFFSET = QBUF * Q_BYTES + 2 * STAGES * KV_BYTES;  // mbarriers after the tiles
  // q_full, q_empty, the page verdict's `checked` and desc_full per Q buffer, full and empty per
  // K and V stage
  static constexpr int NUM_BARS = 4 * QBUF + 4 * STAGES;
  // mbarriers, the units' descriptors (Sm90Unit), the scheduler's position (two words), and slack
  // for the 1024-byte alignment of the base
  static constexpr size_t kSmemBytes = size_t(BAR_OFFSET) + NUM_BARS * 8 + QBUF * 48 + 16 + 1024;
  // Registers a thread: producer + 2 x consumer = 3 x 168 (the launch allocation, 384 x 168 =
  // 64512), multiples of 8. At head_dim 64 (8 boxes a tile, 3 stages) the producer's per-box
  // pages and destinations need 72 (56 spills to the stack); its consumers fit in the 216 left.
  // At 128 the consumers need all 232 (224 measured 9 % slower).
  static constexpr int PRODUCER_REGS = HEAD_DIM == 64 ? 72 : 40;
  static constexpr int CONSUMER_REGS = (3 * 168 - PRODUCER_REGS) / 2;
  // The persistent kernel's split. Its producer also carries the walk over the units (the ring
  // position, the unit's fields, the scheduler's state), and at 40 registers it spilled at
  // head_dim 128 and 256 (72- and 48-byte frames: a local load and store a tile in the gather's
  // loop, 6 loads a tile in the one-box TMA loop). At 56 it spills nothing, and its consumers'
  // code at 224 is their code at 232 but for 4 register moves (nvcc 13.0, -Xptxas -v and SASS,
  // docs/perf/prefill-sm90.md "Gathered calls on the persistent grid"); the 9 % above was a
  // different consumer loop.
  static constexpr int PERSISTENT_PRODUCER_REGS = HEAD_DIM == 64 ? 72 : 56;
  static constexpr int PERSISTENT_CONSUMER_REGS = (3 * 168 - PERSISTENT_PRODUCER_REGS) / 2;
  static_assert(CONSUMER_REGS % 8 == 0 && PERSISTENT_CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
  static_assert(HEAD_DIM % 64 == 0, "head_dim must be a multiple of 64 (the swizzle span)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

// Status code of launch_prefill_sm90 when it declines a call before launching anything (the
// driver refused a tensor map): the caller may run the FA2 kernel instead.
constexpr int kSm90Declined = 0x5390;

// How a KV tile is loaded (host-chosen, see the header comment): TMA boxes, or gathered row by
// row with cp.async by the whole producer warpgroup (`gather`: any page size, any stride that
// keeps rows 16-byte aligned).
struct Sm90KvBoxes {
  int rows;        // B: rows per box (TMA)
  bool page_axis;  // boxes run along the page axis (ragged: one-token pages)
  bool gather;     // cp.async gather instead of TMA boxes
};

// The most TMA boxes per 64-column chunk of a tile the automatic choice gives a paged cache whose
// pages divide the tile (BLOCK_N / page_size); with more, it gathers: past 4 boxes the TMA producer
// measured slower than the gather (docs/perf/prefill-sm90.md, "Gather producer").
constexpr int kSm90MaxTmaBoxes = 4;

// Named barriers (id 0 is __syncthreads'): consumer c's turn to issue GEMMs is barrier 1 + c
// (256 = both consumers: c syncs, the other arrives); 3 + c orders consumer c's V zeroing; 5 + c
// hands the page check's verdict (bad_kv) from the producer to consumer c's epilogue in
// prefill_sm90_kernel (one barrier per consumer: neither waits for the other to finish; the
// persistent kernel uses the unit's `checked` mbarrier instead, reusable across units); 7 gathers
// the gather producer's page verdicts over its 128 threads.
constexpr int kSm90TurnBarrier = 1, kSm90ZeroBarrier = 3, kSm90CheckBarrier = 5, kSm90GatherBarrier = 7;

// A work unit (plan item x query head) as the producer publishes it to the consumers in shared
// memory, one per Q buffer: written before Q's full barrier is armed (request < 0: no more units,
// the consumers leave), `bad` before the unit's `checked` barrier. `ring` is the K/V ring position
// of the unit's first tile (the tiles the CTA streamed before it): tile i of the unit is in stage
// (ring + i) % STAGES, phase ((ring + i) / STAGES) & 1, for the K/V producer and the consumers
// alike.
struct Sm90Unit {
  int request, q_begin, qo_len, kv_len, q0, head, kv_start, kv_end, num_tiles, ring, bad;
};
static_assert(sizeof(Sm90Unit) <= 48, "Sm90Shape::kSmemBytes keeps 48 bytes a descriptor");

// Unit k of persistent CTA c of G (k = 0, 1, ...): the plan's CTA order (prefill_cta), dealt out
// in rounds of G that alternate direction, so a CTA that got a long unit in one round gets a
// short one in the next (the units of a chunk run longest first). G = the unit count gives one
// unit a CTA (the non-persistent grid).
__device__ __forceinline__ uint32_t sm90_unit_index(uint32_t k, uint32_t c, uint32_t G) {
  return k * G + ((k & 1u) ? G - 1u - c : c);
}

// The pages of a request's KV range [kv_start, kv_stop) that are not there, recorded (the cold
// path: the producers call it only after they saw a bad id, reading the page table again).
__device__ __forceinline__ void sm90_record_bad_pages(const PrefillParams& p, int request, int kv_start, int kv_stop,
                                                      int64_t* errors) {
  const int first = p.kv.page_indptr[request], pages = p.kv.page_indptr[request + 1] - first;
  const int ps = static_cast<int>(p.kv.page_size);
  const int pi_end = min(pages, (kv_stop + ps - 1) / ps);
  for (int pi = kv_start / ps; pi < pi_end; ++pi) {
    if (load_page(p.kv, first, pi) < 0) record_page_error(p.kv, request, first, pi, errors);
  }
}

// The gather producer (Sm90KvBoxes::gather): the producer warpgroup's 128 threads copy every KV
// tile's rows with cp.async, 16 bytes an instruction, into the layout the TMA boxes write (chunks
// of [BLOCK_N rows x 128 B], the 16-byte unit j of row r at j ^ (r % 8): the 128-byte swizzle),
// so the consumers' descriptors are the same. Warp w copies rows [w, w + 1) * BLOCK_N / 4 of a
// tile, and its lane r looks up the r-th of them (one page-table load a lane and tile, checked like
// load_page: an entry outside the request's checked range or an id outside [0, num_pages) is not
// read, its rows are zero-filled and the CTA's outputs poisoned), and a shuffle hands each row's
// offset to the lanes that copy it. Lane (g, q) = (lane / 4, lane % 4) copies the 16-byte units
// q + 4m of the rows g + 8k: all its rows share r % 8 = g, so its swizzled positions take two
// values (units q and q + 4 of a 128-byte row) and every address is a register plus an immediate
// (the producer has 40-72 registers). Rows past kv_len are zero-filled (src-size 0, no
// read), so the consumers need not zero V's stale tail. Each thread's copies of a tile complete
// on the stage's full barrier (cp.async.mbarrier.arrive.noinc: 128 arrivals a phase); the caller
// waits for its own copies before it exits. Tile i of the unit uses stage (it0 + i) % STAGES.
template <typename T, int HEAD_DIM>
__device__ __forceinline__ bool sm90_gather_kv(const PrefillParams& p, int request, int kv_head, int kv_start,
                                               int kv_len, int num_tiles, int it0, uint8_t* sk, uint8_t* sv,
                                               uint64_t* k_full, uint64_t* v_full, uint64_t* k_empty,
                                               uint64_t* v_empty) {
  using S = Sm90Shape<T, HEAD_DIM>;
  constexpr int N = S::BLOCK_N, STAGES = S::STAGES;
  constexpr int VEC = 16 / int(sizeof(T));  // elements a 16-byte copy
  constexpr int UNITS = HEAD_DIM / VEC;     // 16-byte units a row: 8, 16, 32
  constexpr int WARP_ROWS = N / 4;          // rows of a tile per producer warp: 32 or 16
  static_assert(UNITS % 8 == 0 && WARP_ROWS % 8 == 0 && WARP_ROWS <= 32, "gather tiling");
  const PagedKV& kv = p.kv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const uint32_t swz = uint32_t((q ^ g) << 4);  // unit q of a row r with r % 8 = g; unit q + 4: swz ^ 64
  const T* kbase = static_cast<const T*>(kv.k) + kv_head * kv.k_head_stride + q * VEC;
  const T* vbase = static_cast<const T*>(kv.v) + kv_head * kv.v_head_stride + q * VEC;
  const int first_page = kv.page_indptr[request];
  const int num_pages = kv.page_indptr[request + 1] - first_page;
  // The request's entries of page_indices, checked once (as the TMA path does): entries outside
  // the tensor are not read at all.
  const bool entries_ok = first_page >= 0 && int64_t(first_page) + max(num_pages, 0) <= kv.num_indices;
  const int loaded_pages = entries_ok ? num_pages : 0;
  const int page_size = static_cast<int>(kv.page_size);
  bool bad = !entries_ok && num_pages > 0 && num_tiles > 0;
  auto copy = [&](const T* base, int64_t off, uint8_t* tile) {
    uint8_t* row_g = tile + (warp * WARP_ROWS + g) * 128;
#pragma unroll
    for (int k = 0; k < WARP_ROWS / 8; ++k) {  // row g + 8k of the warp's: 1024 bytes further each
      const int64_t o = __shfl_sync(0xffffffffu, off, g + 8 * k);
#pragma unroll
      for (int m = 0; m < UNITS / 4; ++m) {  // unit q + 4m: chunk m / 2, position swz ^ 64 (m % 2)
        cp_async_16(row_g + k * 1024 + (m / 2) * S::KV_CHUNK_BYTES + (swz ^ ((m & 1) << 6)),
                    o >= 0 ? base + o + 4 * m * VEC : base, o >= 0);
      }
    }
  };
  for (int i = 0; i < num_tiles; ++i) {
    const int s = (it0 + i) % STAGES;  // the ring runs on across a persistent CTA's units
    const uint32_t phase = ((it0 + i) / STAGES) & 1;
    const int tok = kv_start + i * N + warp * WARP_ROWS + lane;  // the row this lane looks up
    const int pi = tok / page_size, slot = tok - pi * page_size;
    const bool in = lane < WARP_ROWS && tok < kv_len && pi < loaded_pages;
    const int id = in ? kv.page_indices[first_page + pi] : 0;
    const bool ok = in && id >= 0 && id < kv.num_pages;
    bad |= in && !ok;
    const int64_t koff = ok ? id * kv.k_page_stride + slot * kv.k_slot_stride : -1;
    const int64_t voff = ok ? id * kv.v_page_stride + slot * kv.v_slot_stride : -1;
    sm90::mbar_wait(&k_empty[s], phase ^ 1);
    copy(kbase, koff, sk + s * S::KV_BYTES);
    sm90::cp_async_mbar_arrive_noinc(&k_full[s]);
    sm90::mbar_wait(&v_empty[s], phase ^ 1);
    copy(vbase, voff, sv + s * S::KV_BYTES);
    sm90::cp_async_mbar_arrive_noinc(&v_full[s]);
  }
  return sm90::named_barrier_or(kSm90GatherBarrier, 128, bad);
}

// The kernel with one CTA a work unit (prefill_cta(p, blockIdx.x)): everything at 256 (one Q
// buffer fits, see the launcher), and the persistent kernel's baseline (Sm90Grid::kPerUnit).
// Its layout is Sm90Shape's single-Q one (BAR_OFFSET_1, NUM_BARS_1, kSmemBytes1).
template <typename T, int HEAD_DIM, bool SOFTCAP>
__global__ void __launch_bounds__(kSm90Threads, 1)
    prefill_sm90_kernel(const PrefillParams p, const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                        const Sm90KvBoxes boxes, int64_t* errors) {
#if defined(KILN_SM90A)
  using S = Sm90Shape<T, HEAD_DIM>;
  constexpr int N = S::BLOCK_N, STAGES = S::STAGES, CHUNKS = S::CHUNKS;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzle atoms are 1024 bytes: TMA and the wgmma descriptors (base offset 0) both
  // assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sq = smem;
  uint8_t* sk = smem + S::Q_BYTES;
  uint8_t* sv = sk + STAGES * S::KV_BYTES;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::BAR_OFFSET_1);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + STAGES;
  uint64_t* k_empty = v_full + STAGES;
  uint64_t* v_empty = k_empty + STAGES;
  // Set when a page of the CTA's keys is not there (recorded in `errors`; its box lies past the
  // tensor map, which TMA fills with zeros): the consumers then write NaN. The producer sets it
  // before a tile's full barrier is armed (one-token pages) or after its last tile, before
  // kSm90CheckBarrier, which the consumers pass before their epilogue.
  uint32_t* bad_kv = reinterpret_cast<uint32_t*>(bars + S::NUM_BARS_1);

  const PrefillCta cta = prefill_cta(p, blockIdx.x);
  const int item = cta.item;
  const int request = p.work_request[item];
  if (request < 0) return;  // padding item: the whole CTA leaves before any barrier exists
  const int q_begin = p.qo_indptr[request];
  const int qo_len = p.qo_indptr[request + 1] - q_begin;
  const int kv_len = p.kv_len[request];
  const int offset = kv_len - qo_len;  // query i sits at key position i + offset
  const int q0 = p.work_q_start[item];
  const int head = cta.head;
  const int kv_head = head / int(p.num_qo_heads / p.num_kv_heads);

  // KV range, as in prefill.cuh: causal ends after the last query's diagonal, a window starts at
  // the first query's edge (rounded down to a tile); tiles outside are never loaded. Both
  // consumers walk the CTA's range (the same tiles, so they share every K/V load).
  const int last_q = min(q0 + kSm90Queries, qo_len) - 1;
  const int kv_end = p.causal ? max(0, min(kv_len, last_q + offset + 1)) : kv_len;
  int kv_start = p.window_left >= 0 ? max(0, q0 + offset - p.window_left) : 0;
  kv_start = (kv_start / N) * N;
  const int num_tiles = kv_end > kv_start ? (kv_end - kv_start + N - 1) / N : 0;

  // Arrivals a full barrier's phase takes: the TMA thread's one (with the bytes it expects), or
  // each gather thread's cp.async arrival. The page check's barrier counts the producer warps.
  const uint32_t full_arrivals = boxes.gather ? 128 : 1;
  const int check_threads = (boxes.gather ? 128 : 32) + 128;
  if (threadIdx.x == 0) {
    *bad_kv = 0;
    sm90::mbar_init(q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(&k_full[s], full_arrivals);
      sm90::mbar_init(&v_full[s], full_arrivals);
      sm90::mbar_init(&k_empty[s], 128 * kSm90Consumers);
      sm90::mbar_init(&v_empty[s], 128 * kSm90Consumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<S::PRODUCER_REGS>();
    auto load_q = [&] {
      sm90::prefetch_tensor_map(&tq);
      sm90::mbar_arrive_expect_tx(q_full, S::Q_BYTES);
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
        sm90::tma_load_3d(sq + c * S::Q_CHUNK_BYTES, &tq, q_full, c * 64, head, q_begin + q0);
    };
    if (boxes.gather) {  // Q by TMA, K and V gathered by all 128 threads
      if (threadIdx.x == 0) load_q();
      const bool bad = sm90_gather_kv<T, HEAD_DIM>(p, request, kv_head, kv_start, kv_len, num_tiles, 0, sk, sv, k_full,
                                                   v_full, k_empty, v_empty);
      cp_async_commit();  // no copy of this thread may still be in flight when it exits
      cp_async_wait<0>();
      if (bad) {
        if (threadIdx.x == 0) {
          sm90_record_bad_pages(p, request, kv_start, kv_start + num_tiles * N, errors);
          *bad_kv = 1;
        }
      }
      __threadfence_block();
      for (int c = 0; c < kSm90Consumers; ++c) sm90::named_barrier_arrive(kSm90CheckBarrier + c, check_threads);
      return;
    }
    if (threadIdx.x != 0) return;
    sm90::prefetch_tensor_map(&tk);
    sm90::prefetch_tensor_map(&tv);
    load_q();
    const int first_page = p.kv.page_indptr[request];
    const int num_pages = p.kv.page_indptr[request + 1] - first_page;
    const int page_size = static_cast<int>(p.kv.page_size);
    // The request's entries of page_indices, checked once here: the producer then reads them
    // without a check of its own (an id outside the cache is a box past the tensor map).
    const bool entries_ok = first_page >= 0 && int64_t(first_page) + max(num_pages, 0) <= p.kv.num_indices;
    // Contiguous rows along the page axis (one-token pages): all from the request's first id.
    int64_t first_id = 0;
    if (boxes.page_axis && num_tiles > 0) {
      first_id = page_at(p.kv, request, first_page, 0, errors);
      if (first_id >= 0 && first_id + kv_end > p.kv.num_pages) {
        record_error(errors, ErrorCode::kPageSlot, request, first_id + kv_end, p.kv.num_pages);
        first_id = -1;
      }
      if (first_id < 0) *bad_kv = 1;
    }
    const int oob = static_cast<int>(p.kv_num_pages);  // a page coordinate TMA fills with zeros
    // Entries past page_indices are not read: such a request's boxes are not loaded at all (its
    // outputs are poisoned, so the stale tiles they leave never reach them).
    const int loaded_pages = entries_ok ? num_pages : 0;
    // Whether a page the loop loads is not there: a compare per box, no branch on the issue path.
    bool bad_page = !entries_ok && num_pages > 0 && num_tiles > 0 && !boxes.page_axis;
    const int B = boxes.rows, nbox = boxes.page_axis ? 1 : N / B;
    constexpr int MAX_BOXES = N / 16;  // B >= 16 or B == N (prefill_sm90_boxes)
    for (int i = 0; i < num_tiles; ++i) {
      const int s = i % STAGES;
      const uint32_t phase = (i / STAGES) & 1;
      const int tok0 = kv_start + i * N;
      // The tile's boxes: (page, first slot) each, or -1 past the request's pages (rows >= kv_len,
      // not loaded: the consumers mask them and zero V there). The page-table loads are
      // independent (one latency, not one per box) and shared by K and V; their entries lie in
      // [first_page, first_page + loaded_pages), checked above. An id outside the cache, negative
      // or >= num_pages, is a box past the tensor map: TMA fills it with zeros, and the CTA's
      // outputs are poisoned (bad_page).
      // One division a tile (the producer's issue rate bounds the kernel): box b < nbox holds
      // tokens tok0 + b * B, so it is page pi0 + b at slot slot0 (B == page_size) or the tile's
      // only box (nbox == 1).
      const int pi0 = tok0 / page_size, slot0 = tok0 - pi0 * page_size;
      int box_page[MAX_BOXES], box_slot[MAX_BOXES];
      uint32_t bytes = 0;
#pragma unroll
      for (int b = 0; b < MAX_BOXES; ++b) {  // the page-table loads, all independent
        const int pi = pi0 + b;
        const bool load = b < nbox && (boxes.page_axis || pi < loaded_pages);
        const int id = !load             ? -1
                       : boxes.page_axis ? (first_id >= 0 ? static_cast<int>(first_id) + tok0 : -1)
                                         : p.kv.page_indices[first_page + pi];
        box_page[b] = !load ? -1 : id >= 0 ? id : oob;
        box_slot[b] = boxes.page_axis ? 0 : slot0;
        bytes += load ? uint32_t(CHUNKS * (boxes.page_axis ? N : B) * 128) : 0u;
        bad_page |= load && !boxes.page_axis && static_cast<uint32_t>(id) >= static_cast<uint32_t>(oob);
      }
      auto issue = [&](const CUtensorMap* map, uint8_t* dst, uint64_t* bar) {
#pragma unroll
        for (int b = 0; b < MAX_BOXES; ++b) {
          if (box_page[b] < 0) continue;
#pragma unroll
          for (int c = 0; c < CHUNKS; ++c) {
            sm90::tma_load_4d(dst + c * S::KV_CHUNK_BYTES + b * B * 128, map, bar, c * 64, box_slot[b], kv_head,
                              box_page[b]);
          }
        }
      };
      sm90::mbar_wait(&k_empty[s], phase ^ 1);
      sm90::mbar_arrive_expect_tx(&k_full[s], bytes);
      issue(&tk, sk + s * S::KV_BYTES, &k_full[s]);
      sm90::mbar_wait(&v_empty[s], phase ^ 1);
      sm90::mbar_arrive_expect_tx(&v_full[s], bytes);
      issue(&tv, sv + s * S::KV_BYTES, &v_full[s]);
    }
    // Every tile is issued, a few ahead of the consumers: now say which page was not there (the
    // cold path) and hand the verdict to their epilogues.
    if (bad_page) {  // (reads the page table again: nothing of the loop's stays live for this)
      sm90_record_bad_pages(p, request, kv_start, kv_start + num_tiles * N, errors);
      *bad_kv = 1;
    }
    __threadfence_block();
    for (int c = 0; c < kSm90Consumers; ++c) sm90::named_barrier_arrive(kSm90CheckBarrier + c, check_threads);
    return;
  }

  // ---------------- consumers ----------------
  sm90::setmaxnreg_inc<S::CONSUMER_REGS>();
  const int cw = threadIdx.x / 128 - 1;  // consumer warpgroup: queries q0 + 64 cw ..
  const int ct = threadIdx.x % 128;
  const int warp = ct / 32, lane = ct % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = q0 + 64 * cw;         // this warpgroup's first query
  const int qi0 = row0 + warp * 16 + g;  // this thread's two query rows: qi0, qi0 + 8
  // Logits go to log2 units inside exp2's FMA (kfac); with soft-cap they are capped (and scaled)
  // first. Masks and row maxima work on the raw logits (kfac > 0 keeps their order).
  const float kfac = SOFTCAP ? 1.0f : p.sm_scale * kLog2e;
  const float cap_in = p.sm_scale / p.soft_cap, cap_out = p.soft_cap * kLog2e;
  // Stale rows past kv_len exist only in real pages, and the gather zero-fills them itself.
  const bool zero_tail = !p.kv_contiguous && !boxes.gather;
  // cp.async writes shared memory through the generic proxy and wgmma reads it through the async
  // proxy: after a gathered tile's full barrier, each consumer thread fences the two.
  const bool gathered = boxes.gather;

  float o[HEAD_DIM / 2];
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.0f;
  float m[2] = {neg_inf(), neg_inf()};  // running max, log2 units
  float l[2] = {0.0f, 0.0f};

  // Ping-pong: a consumer issues its GEMMs only in its turn and passes the turn on right after,
  // so the tensor cores serve one warpgroup's GEMMs while the other's softmax runs. Consumer 0
  // goes first; each consumer takes (num_tiles + 1) turns, and consumer 0 takes one more at the
  // end so that every arrival on its barrier is consumed.
  auto take_turn = [&] { sm90::named_barrier_sync(kSm90TurnBarrier + cw, 256); };
  auto pass_turn = [&] { sm90::named_barrier_arrive(kSm90TurnBarrier + (1 - cw), 256); };
  if (cw == 1) pass_turn();

  const uint32_t sq_addr = sm90::smem_u32(sq) + cw * 64 * 128;  // this warpgroup's 64 rows of Q
  // S = Q K^T of tile i into acc, issued as one wgmma group (not waited for): HEAD_DIM / 16
  // k-steps, each 32 bytes further inside the 128-byte chunk rows of Q and K.
  auto issue_s = [&](int i, float (&acc)[N / 2]) {
    const int s = i % STAGES;
    const uint32_t sk_addr = sm90::smem_u32(sk + s * S::KV_BYTES);
    sm90::mbar_wait(&k_full[s], (i / STAGES) & 1);
    if (gathered) sm90::fence_proxy_async();
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      const uint32_t in_chunk = (kk % 4) * 32;
      const uint64_t da = sm90::smem_desc_sw128(sq_addr + (kk / 4) * S::Q_CHUNK_BYTES + in_chunk, 16, 1024);
      const uint64_t db = sm90::smem_desc_sw128(sk_addr + (kk / 4) * S::KV_CHUNK_BYTES + in_chunk, 16, 1024);
      sm90::wgmma_ss<T, N>(acc, da, db, kk > 0 ? 1 : 0);
    }
    sm90::wgmma_commit();
  };

  // O += P V of tile i, issued as one wgmma group: N / 16 k-steps of 16 keys (16 rows of 128
  // bytes = 2048 bytes each).
  auto issue_pv = [&](int i, uint32_t (&pa)[N / 16][4]) {
    const uint32_t sv_addr = sm90::smem_u32(sv + (i % STAGES) * S::KV_BYTES);
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) {
      const uint64_t db = sm90::smem_desc_sw128(sv_addr + ks * 16 * 128, S::KV_CHUNK_BYTES, 1024);
      sm90::wgmma_rs<T, HEAD_DIM, true>(o, pa[ks], db, 1);
    }
    sm90::wgmma_commit();
  };

  // Waits for V of tile i; zeroes its rows >= kv_len where they may be stale memory (whole
  // 128-byte rows, so the swizzle does not matter) before the tensor cores read them. Both
  // consumers zero the same rows (zeros over zeros), each ordering only its own writes.
  auto prepare_pv = [&](int i) {
    const int s = i % STAGES, tok0 = kv_start + i * N;
    sm90::mbar_wait(&v_full[s], (i / STAGES) & 1);
    if (gathered) sm90::fence_proxy_async();
    if (zero_tail && tok0 + N > kv_len) {
      uint8_t* vt = sv + s * S::KV_BYTES;
      const int first = max(kv_len - tok0, 0);
      for (int idx = ct; idx < CHUNKS * (N - first) * 8; idx += 128) {
        const int c = idx / ((N - first) * 8), rem = idx % ((N - first) * 8);
        const int row = first + rem / 8, part = rem % 8;
        *reinterpret_cast<uint4*>(vt + c * S::KV_CHUNK_BYTES + row * 128 + part * 16) = make_uint4(0, 0, 0, 0);
      }
      sm90::fence_proxy_async();
      sm90::named_barrier_sync(kSm90ZeroBarrier + cw, 128);
    }
  };

  // Soft-cap, masks and the online-softmax step of tile i, in place: acc (S, the m64nNk16
  // fragment: acc[4j + e] is row qi0 + 8 (e >> 1), key tok0 + 8j + 2t + (e & 1)) becomes the
  // probabilities; m and l are updated and `rescale` gets the factor O must be multiplied by.
  // Writes no register a wgmma in flight reads (P V reads pa and o only).
  auto softmax = [&](int i, float (&acc)[N / 2], float (&rescale)[2]) -> bool {
    const int tok0 = kv_start + i * N;
    if constexpr (SOFTCAP) {
#pragma unroll
      for (int x = 0; x < N / 2; ++x) acc[x] = tanhf(acc[x] * cap_in) * cap_out;
    }
    // Masks only where some key of the tile may be invisible to some query of the warpgroup;
    // each row's visible keys are one interval [lo, hi], so an element costs two compares.
    const bool boundary = tok0 + N > kv_end || (p.causal && tok0 + N - 1 > row0 + offset) ||
                          (p.window_left >= 0 && tok0 < row0 + 63 + offset - p.window_left);
    if (boundary) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qpos = qi0 + 8 * r + offset;
        const int hi = p.causal ? min(kv_end - 1, qpos) : kv_end - 1;
        const int lo = p.window_left >= 0 ? qpos - p.window_left : INT_MIN;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = tok0 + 8 * j + 2 * t + e;
            acc[4 * j + 2 * r + e] = (key >= lo && key <= hi) ? acc[4 * j + 2 * r + e] : neg_inf();
          }
        }
      }
    }
    float m_use[2];
    bool moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_max = neg_inf();
#pragma unroll
      for (int j = 0; j < N / 8; ++j) row_max = fmaxf(row_max, fmaxf(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]));
      rescale[r] = online_softmax_step(row_max, kfac, m[r], l[r], m_use[r]);
      moved = moved || rescale[r] != 1.0f;
    }
#pragma unroll
    for (int x = 0; x < N / 2; ++x) {
      acc[x] = fast_exp2(fmaf(acc[x], kfac, -m_use[(x >> 1) & 1]));
      l[(x >> 1) & 1] += acc[x];
    }
    // Past the first tiles the running max rarely moves: the O rescale is skipped when it moved
    // for no row of the warp (one vote, so the branch stays uniform).
    return __any_sync(0xffffffffu, moved);
  };

  auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
      o[4 * j + 0] *= rescale[0];
      o[4 * j + 1] *= rescale[0];
      o[4 * j + 2] *= rescale[1];
      o[4 * j + 3] *= rescale[1];
    }
  };

  // P to 16 bits in the A fragments of the P V k-steps: keys 16ks..16ks+15 are the accumulator
  // n-blocks 2ks and 2ks+1 (for 16-bit types the accumulator layout of a 16-column slice is the A
  // layout of one k-step).
  auto pack_p = [&](const float (&pr)[N / 2], uint32_t (&pa)[N / 16][4]) {
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* e = pr + 4 * (2 * ks + h);
        pa[ks][2 * h + 0] = pack2<T>(e[0], e[1]);
        pa[ks][2 * h + 1] = pack2<T>(e[2], e[3]);
      }
    }
  };

  sm90::mbar_wait(q_full, 0);
  float sacc[N / 2], rescale[2];
  uint32_t pa[N / 16][4];
  if (num_tiles > 0) {
    // FA3's intra-warpgroup overlap: S of tile i+1 and P V of tile i run on the tensor cores while
    // the softmax of tile i+1 runs on the CUDA cores; P is packed and O rescaled once P V of tile
    // i is done. Two ptxas rules shape the loop (else it serialises every wgmma, warnings C7513 /
    // C7514): no instruction defines an input register (o, pa) of a wgmma in flight, and the
    // second group is not conditional (the last tile is peeled out).
    take_turn();
    issue_s(0, sacc);
    pass_turn();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(sacc);
    sm90::mbar_arrive(&k_empty[0]);
    softmax(0, sacc, rescale);  // O is still zero: no rescale
    pack_p(sacc, pa);
    for (int i = 0; i + 1 < num_tiles; ++i) {
      prepare_pv(i);
      sm90::fence_regs(o);
      sm90::fence_regs(pa);
      take_turn();
      issue_s(i + 1, sacc);
      issue_pv(i, pa);
      pass_turn();
      sm90::wgmma_wait<1>();  // S of tile i+1 (the older group) is done; P V may still run
      sm90::fence_regs(sacc);
      sm90::mbar_arrive(&k_empty[(i + 1) % STAGES]);
      const bool moved = softmax(i + 1, sacc, rescale);
      sm90::wgmma_wait<0>();
      sm90::fence_regs(o);
      sm90::fence_regs(pa);
      sm90::mbar_arrive(&v_empty[i % STAGES]);
      if (moved) rescale_o(rescale);
      pack_p(sacc, pa);
    }
    const int last = num_tiles - 1;
    prepare_pv(last);
    sm90::fence_regs(o);
    sm90::fence_regs(pa);
    take_turn();
    issue_pv(last, pa);
    pass_turn();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    sm90::fence_regs(pa);
    sm90::mbar_arrive(&v_empty[last % STAGES]);
  }
  if (cw == 0) take_turn();  // consumes consumer 1's last arrival

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  sm90::named_barrier_sync(kSm90CheckBarrier + cw, check_threads);  // the page check's verdict
  const bool poisoned = *bad_kv != 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qi0 + 8 * r;
    if (qi >= qo_len) continue;
    const float inv = poisoned ? quiet_nan() : l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    T* out = static_cast<T*>(p.out) + int64_t(q_begin + qi) * p.out_stride_n + head * p.out_stride_h;
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * t) = pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0)
      p.lse[int64_t(q_begin + qi) * p.lse_stride_n + head] = poisoned ? quiet_nan() : merged_lse(m[r], l[r]);
  }
#else
  // Built for another target: never launched there (prefill_sm90_supported), loud if it were.
  (void)p, (void)tq, (void)tk, (void)tv, (void)boxes, (void)errors;
  __trap();
#endif
}

// The persistent kernel: one CTA an SM walking the units (sm90_unit_index), for every call at
// head_dim 64 and 128, TMA-loaded or gathered (docs/perf/prefill-sm90.md, "Persistent grid" and
// "Gathered calls on the persistent grid"). Its producer gets 56 registers at head_dim 128 and
// 256 where prefill_sm90_kernel's gets 40 (Sm90Shape::PERSISTENT_PRODUCER_REGS): at 40 it
// spilled, and its gather measured 13 % slower than prefill_sm90_kernel's at 128.
template <typename T, int HEAD_DIM, bool SOFTCAP>
__global__ void __launch_bounds__(kSm90Threads, 1)
    prefill_sm90_persistent_kernel(const PrefillParams p, const __grid_constant__ CUtensorMap tq,
                                   const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                   const Sm90KvBoxes boxes, const uint32_t units, int64_t* errors) {
#if defined(KILN_SM90A)
  using S = Sm90Shape<T, HEAD_DIM>;
  constexpr int N = S::BLOCK_N, STAGES = S::STAGES, CHUNKS = S::CHUNKS;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzle atoms are 1024 bytes: TMA and the wgmma descriptors (base offset 0) both
  // assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sq = smem;  // QBUF buffers of Q_BYTES
  uint8_t* sk = smem + S::QBUF * S::Q_BYTES;
  uint8_t* sv = sk + STAGES * S::KV_BYTES;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::BAR_OFFSET);
  uint64_t* q_full = bars;                  // per Q buffer: Q (and the unit's descriptor) landed
  uint64_t* q_empty = q_full + S::QBUF;     // ... both consumers are done with the unit
  uint64_t* checked = q_empty + S::QBUF;    // ... the unit's page verdict (`bad`) is written
  uint64_t* desc_full = checked + S::QBUF;  // ... its descriptor is written (for the K/V producer)
  uint64_t* k_full = desc_full + S::QBUF;
  uint64_t* v_full = k_full + STAGES;
  uint64_t* k_empty = v_full + STAGES;
  uint64_t* v_empty = k_empty + STAGES;
  // The units' descriptors, one per Q buffer. `bad` is set when a page of the unit's keys is not
  // there (recorded in `errors`; its box lies past the tensor map, which TMA fills with zeros, or
  // the gather zero-fills it): the consumers then write NaN.
  Sm90Unit* unit_desc = reinterpret_cast<Sm90Unit*>(bars + S::NUM_BARS);
  // The scheduler's position: walk[0] the next sm90_unit_index to look at, walk[1] the ring
  // position of the next unit's first tile.
  uint32_t* walk = reinterpret_cast<uint32_t*>(unit_desc + S::QBUF);

  // Arrivals a full barrier's phase takes: the TMA thread's one (with the bytes it expects), or
  // each gather thread's cp.async arrival.
  const uint32_t full_arrivals = boxes.gather ? 128 : 1;
  if (threadIdx.x == 0) {
    for (int b = 0; b < S::QBUF; ++b) {
      sm90::mbar_init(&q_full[b], 1);
      sm90::mbar_init(&q_empty[b], 128 * kSm90Consumers);
      sm90::mbar_init(&checked[b], 1);
      sm90::mbar_init(&desc_full[b], 1);
    }
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(&k_full[s], full_arrivals);
      sm90::mbar_init(&v_full[s], full_arrivals);
      sm90::mbar_init(&k_empty[s], 128 * kSm90Consumers);
      sm90::mbar_init(&v_empty[s], 128 * kSm90Consumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  // Work units: this CTA's, sm90_unit_index(k, blockIdx.x, gridDim.x) for k = 0, 1, ... below
  // `units` (one a CTA when the grid has one CTA per unit). The producer walks them, skips the
  // plan's padding items, publishes each unit's descriptor with its Q, and streams its K/V tiles
  // through the one ring (its position runs on across units, Sm90Unit::ring, so the next unit's
  // first tiles load while the consumers finish this one and write its outputs).
  if (threadIdx.x < 128) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<S::PERSISTENT_PRODUCER_REGS>();
    // The scheduler publishes unit n into Q buffer n % QBUF once the consumers are done with the
    // unit that used it before: the descriptor, then Q by TMA (q_full, whose arrival releases the
    // descriptor to the consumers), then desc_full for the K/V producer. Its walk over the units
    // (`walk`: the next sm90_unit_index to look at, the ring position) lives in shared memory, so
    // no producer thread keeps it in registers (56-72 of them; kept live in 40 it spilled inside
    // the tile loops).
    auto publish = [&](int n) {  // unit n (n = 0, 1, ...), or the end; scheduler thread only
      const int qb = n % S::QBUF;
      sm90::mbar_wait(&q_empty[qb], ((n / S::QBUF) & 1) ^ 1);
      // One CTA a unit: the hardware deals the CTAs out dynamically, in prefill_cta's order. A
      // persistent grid deals them statically (sm90_unit_index), which balances only over a list
      // sorted by work: all heads in one chunk, so the units run in the plan's order of items
      // (most work first). prefill_cta's chunks of 4 heads measured far slower on long causal
      // calls (each chunk restarts the long items; docs/perf/prefill-sm90.md, "Persistent grid").
      const PrefillCtaOrder order =
          gridDim.x < units ? PrefillCtaOrder(p, static_cast<int>(p.num_qo_heads)) : PrefillCtaOrder(p);
      uint32_t k = walk[0];
      int request = -1;
      uint32_t b = 0;
      PrefillCta cta{};
      for (;; ++k) {  // the next unit that is not a padding item (CUDA-graph capacity)
        b = sm90_unit_index(k, blockIdx.x, gridDim.x);
        if (b >= units) break;
        cta = order(b);
        request = p.work_request[cta.item];
        if (request >= 0) break;
      }
      walk[0] = k + 1;
      if (b >= units) {  // no more units: an empty descriptor tells everyone to leave
        unit_desc[qb].request = -1;
        sm90::mbar_arrive(&q_full[qb]);
        sm90::mbar_arrive(&desc_full[qb]);
        return;
      }
      const int q_begin = p.qo_indptr[request];
      const int qo_len = p.qo_indptr[request + 1] - q_begin;
      const int kv_len = p.kv_len[request];
      const int offset = kv_len - qo_len;  // query i sits at key position i + offset
      const int q0 = p.work_q_start[cta.item];
      // KV range, as in prefill.cuh: causal ends after the last query's diagonal, a window starts
      // at the first query's edge (rounded down to a tile); tiles outside are never loaded. Both
      // consumers walk the unit's range (the same tiles, so they share every K/V load).
      const int last_q = min(q0 + kSm90Queries, qo_len) - 1;
      const int kv_end = p.causal ? max(0, min(kv_len, last_q + offset + 1)) : kv_len;
      int kv_start = p.window_left >= 0 ? max(0, q0 + offset - p.window_left) : 0;
      kv_start = (kv_start / N) * N;
      const int num_tiles = kv_end > kv_start ? (kv_end - kv_start + N - 1) / N : 0;
      const int ring = static_cast<int>(walk[1]);
      walk[1] = static_cast<uint32_t>(ring + num_tiles);
      unit_desc[qb] = Sm90Unit{request, q_begin, qo_len, kv_len, q0, cta.head, kv_start, kv_end, num_tiles, ring, 0};
      sm90::mbar_arrive_expect_tx(&q_full[qb], S::Q_BYTES);  // (release: the descriptor with it)
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
        sm90::tma_load_3d(sq + qb * S::Q_BYTES + c * S::Q_CHUNK_BYTES, &tq, &q_full[qb], c * 64, cta.head,
                          q_begin + q0);
      sm90::mbar_arrive(&desc_full[qb]);
    };
    const int group = int(p.num_qo_heads / p.num_kv_heads);
    if (!boxes.gather) {
      // TMA: thread 32 schedules, thread 0 issues every K/V box; the rest retire.
      if (threadIdx.x == 32) {
        sm90::prefetch_tensor_map(&tq);
        walk[0] = walk[1] = 0;
        for (int n = 0;; ++n) {
          publish(n);
          if (unit_desc[n % S::QBUF].request < 0) break;
        }
        return;
      }
      if (threadIdx.x != 0) return;
      sm90::prefetch_tensor_map(&tk);
      sm90::prefetch_tensor_map(&tv);
      for (int n = 0;; ++n) {
        const int qb = n % S::QBUF;
        sm90::mbar_wait(&desc_full[qb], (n / S::QBUF) & 1);
        const Sm90Unit& unit = unit_desc[qb];
        const int request = unit.request;
        if (request < 0) break;
        const int kv_head = unit.head / group, kv_start = unit.kv_start, kv_end = unit.kv_end;
        const int num_tiles = unit.num_tiles, it = unit.ring;
        bool unit_bad = false;
        const int first_page = p.kv.page_indptr[request];
        const int num_pages = p.kv.page_indptr[request + 1] - first_page;
        const int page_size = static_cast<int>(p.kv.page_size);
        // The request's entries of page_indices, checked once here: the producer then reads them
        // without a check of its own (an id outside the cache is a box past the tensor map).
        const bool entries_ok = first_page >= 0 && int64_t(first_page) + max(num_pages, 0) <= p.kv.num_indices;
        // Contiguous rows along the page axis (one-token pages): all from the request's first id.
        int first_id = 0;  // (< num_pages: an int32 id)
        if (boxes.page_axis && num_tiles > 0) {
          first_id = static_cast<int>(page_at(p.kv, request, first_page, 0, errors));
          if (first_id >= 0 && int64_t(first_id) + kv_end > p.kv.num_pages) {
            record_error(errors, ErrorCode::kPageSlot, request, int64_t(first_id) + kv_end, p.kv.num_pages);
            first_id = -1;
          }
          unit_bad = first_id < 0;
        }
        const int oob = static_cast<int>(p.kv_num_pages);  // a page coordinate TMA fills with zeros
        // Entries past page_indices are not read: such a request's boxes are not loaded at all
        // (its outputs are poisoned, so the stale tiles they leave never reach them).
        const int loaded_pages = entries_ok ? num_pages : 0;
        // Whether a page the loop loads is not there: a compare per box, no branch on the issue path.
        bool bad_page = !entries_ok && num_pages > 0 && num_tiles > 0 && !boxes.page_axis;
        const int B = boxes.rows, nbox = boxes.page_axis ? 1 : N / B;
        // The tile loop, compiled for at most 1, kSm90MaxTmaBoxes and N / 16 boxes a chunk (B >= 16
        // or B == N, prefill_sm90_boxes): the producer has few registers (the 8-box arrays spilled
        // at 40, -Xptxas -v), so the common one-box caches (single prefill, ragged, pages >= the
        // tile) and 2-4 boxes get loops of their own.
        auto stream = [&](auto max_boxes) {
          constexpr int MAX_BOXES = decltype(max_boxes)::value;
          for (int i = 0; i < num_tiles; ++i) {
            const int s = (it + i) % STAGES;
            const uint32_t phase = ((it + i) / STAGES) & 1;
            const int tok0 = kv_start + i * N;
            // The tile's boxes: (page, first slot) each, or -1 past the request's pages (rows >=
            // kv_len, not loaded: the consumers mask them and zero V there). The page-table loads
            // are independent (one latency, not one per box) and shared by K and V; their entries
            // lie in [first_page, first_page + loaded_pages), checked above. An id outside the
            // cache, negative or >= num_pages, is a box past the tensor map: TMA fills it with
            // zeros, and the unit's outputs are poisoned (bad_page).
            // One division a tile (the producer's issue rate bounds the kernel): box b < nbox holds
            // tokens tok0 + b * B, so it is page pi0 + b at slot slot0 (B == page_size) or the
            // tile's only box (nbox == 1).
            const int pi0 = tok0 / page_size, slot0 = tok0 - pi0 * page_size;
            int box_page[MAX_BOXES];
            const int box_slot = boxes.page_axis ? 0 : slot0;  // every box's first slot
            uint32_t bytes = 0;
#pragma unroll
            for (int bx = 0; bx < MAX_BOXES; ++bx) {  // the page-table loads, all independent
              const int pi = pi0 + bx;
              const bool load = bx < nbox && (boxes.page_axis || pi < loaded_pages);
              const int id = !load             ? -1
                             : boxes.page_axis ? (first_id >= 0 ? first_id + tok0 : -1)
                                               : p.kv.page_indices[first_page + pi];
              box_page[bx] = !load ? -1 : id >= 0 ? id : oob;
              bytes += load ? uint32_t(CHUNKS * (boxes.page_axis ? N : B) * 128) : 0u;
              bad_page |= load && !boxes.page_axis && static_cast<uint32_t>(id) >= static_cast<uint32_t>(oob);
            }
            auto issue = [&](const CUtensorMap* map, uint8_t* dst, uint64_t* bar) {
#pragma unroll
              for (int bx = 0; bx < MAX_BOXES; ++bx) {
                if (box_page[bx] < 0) continue;
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) {
                  sm90::tma_load_4d(dst + c * S::KV_CHUNK_BYTES + bx * B * 128, map, bar, c * 64, box_slot, kv_head,
                                    box_page[bx]);
                }
              }
            };
            sm90::mbar_wait(&k_empty[s], phase ^ 1);
            sm90::mbar_arrive_expect_tx(&k_full[s], bytes);
            issue(&tk, sk + s * S::KV_BYTES, &k_full[s]);
            sm90::mbar_wait(&v_empty[s], phase ^ 1);
            sm90::mbar_arrive_expect_tx(&v_full[s], bytes);
            issue(&tv, sv + s * S::KV_BYTES, &v_full[s]);
          }
        };
        constexpr int kFew = kSm90MaxTmaBoxes < N / 16 ? kSm90MaxTmaBoxes : N / 16;
        if (nbox == 1) {
          stream(std::integral_constant<int, 1>{});
        } else if (nbox <= kFew) {
          stream(std::integral_constant<int, kFew>{});
        } else {
          stream(std::integral_constant<int, N / 16>{});
        }
        // Every tile of the unit is issued, a few ahead of the consumers: now say which page was
        // not there (the cold path; it reads the page table again, nothing of the loop's stays
        // live for it).
        if (bad_page) {
          sm90_record_bad_pages(p, request, kv_start, kv_start + num_tiles * N, errors);
          unit_bad = true;
        }
        unit_desc[qb].bad = unit_bad ? 1 : 0;  // the verdict, before the consumers' epilogues
        sm90::mbar_arrive(&checked[qb]);
      }
      return;
    }
    // Gather: all 128 threads copy K and V; thread 0 also schedules, a unit at a time.
    if (threadIdx.x == 0) {
      sm90::prefetch_tensor_map(&tq);
      walk[0] = walk[1] = 0;
    }
    for (int n = 0;; ++n) {
      const int qb = n % S::QBUF;
      if (threadIdx.x == 0) publish(n);
      sm90::mbar_wait(&desc_full[qb], (n / S::QBUF) & 1);
      const Sm90Unit& unit = unit_desc[qb];
      const int request = unit.request;
      if (request < 0) break;
      const int kv_start = unit.kv_start, num_tiles = unit.num_tiles;
      const bool bad = sm90_gather_kv<T, HEAD_DIM>(p, request, unit.head / group, kv_start, unit.kv_len, num_tiles,
                                                   unit.ring, sk, sv, k_full, v_full, k_empty, v_empty);
      if (threadIdx.x == 0) {
        if (bad) sm90_record_bad_pages(p, request, kv_start, kv_start + num_tiles * N, errors);
        unit_desc[qb].bad = bad ? 1 : 0;  // the verdict, before the consumers' epilogues
        sm90::mbar_arrive(&checked[qb]);
      }
    }
    cp_async_commit();  // no copy of this thread may still be in flight when it exits
    cp_async_wait<0>();
    return;
  }
  // ---------------- consumers ----------------
  sm90::setmaxnreg_inc<S::PERSISTENT_CONSUMER_REGS>();
  const int cw = threadIdx.x / 128 - 1;  // consumer warpgroup: queries q0 + 64 cw ..
  const int ct = threadIdx.x % 128;
  const int warp = ct / 32, lane = ct % 32;
  const int g = lane / 4, t = lane % 4;
  // Logits go to log2 units inside exp2's FMA (kfac); with soft-cap they are capped (and scaled)
  // first. Masks and row maxima work on the raw logits (kfac > 0 keeps their order).
  const float kfac = SOFTCAP ? 1.0f : p.sm_scale * kLog2e;
  const float cap_in = p.sm_scale / p.soft_cap, cap_out = p.soft_cap * kLog2e;
  // Stale rows past kv_len exist only in real pages, and the gather zero-fills them itself.
  const bool zero_tail = !p.kv_contiguous && !boxes.gather;
  // cp.async writes shared memory through the generic proxy and wgmma reads it through the async
  // proxy: after a gathered tile's full barrier, each consumer thread fences the two.
  const bool gathered = boxes.gather;

  // Ping-pong: a consumer issues its GEMMs only in its turn and passes the turn on right after,
  // so the tensor cores serve one warpgroup's GEMMs while the other's softmax runs. Consumer 0
  // goes first; each consumer takes (num_tiles + 1) turns a unit (both walk the same tiles), the
  // turns run on across units, and consumer 0 takes one more at the end so that every arrival on
  // its barrier is consumed.
  auto take_turn = [&] { sm90::named_barrier_sync(kSm90TurnBarrier + cw, 256); };
  auto pass_turn = [&] { sm90::named_barrier_arrive(kSm90TurnBarrier + (1 - cw), 256); };
  if (cw == 1) pass_turn();

  for (int n = 0;; ++n) {
    const int qb = n % S::QBUF;
    const uint32_t use = static_cast<uint32_t>(n / S::QBUF);
    sm90::mbar_wait(&q_full[qb], use & 1);  // Q and the unit's descriptor
    // The descriptor's fields, broadcast from lane 0 (CUTLASS's idiom for warp-uniform values;
    // 14 fewer SASS instructions a tile than plain shared-memory loads). The ring position `it`
    // is one of them, read afresh each unit: carried across units in a register (it +=
    // num_tiles, even it += 3) it kept the tile loop off the uniform datapath (its counter, the
    // stages and the wgmma descriptors in vector registers: 1152 instructions and 48 R2UR a tile
    // against 1089 and 18 one CTA a unit); read here it is 1079 and 18 (nvcc 13.0,
    // docs/perf/prefill-sm90.md).
    const Sm90Unit& unit = unit_desc[qb];
    auto uniform = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
    const int request = uniform(unit.request);
    if (request < 0) break;  // no more units
    const int q_begin = uniform(unit.q_begin), qo_len = uniform(unit.qo_len), kv_len = uniform(unit.kv_len);
    const int q0 = uniform(unit.q0), head = uniform(unit.head);
    const int kv_start = uniform(unit.kv_start), kv_end = uniform(unit.kv_end), num_tiles = uniform(unit.num_tiles);
    const int it = uniform(unit.ring);     // tiles consumed before this unit (the ring's position)
    const int offset = kv_len - qo_len;    // query i sits at key position i + offset
    const int row0 = q0 + 64 * cw;         // this warpgroup's first query
    const int qi0 = row0 + warp * 16 + g;  // this thread's two query rows: qi0, qi0 + 8

    float o[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.0f;
    float m[2] = {neg_inf(), neg_inf()};  // running max, log2 units
    float l[2] = {0.0f, 0.0f};

    const uint32_t sq_addr = sm90::smem_u32(sq + qb * S::Q_BYTES) + cw * 64 * 128;  // this warpgroup's 64 rows of Q
    // A k-step's descriptor is its tile's plus the step's offset (>> 4, the address field's unit):
    // the field holds (address & 0x3FFFF) >> 4 and every tile lies below 2^18, so the add never
    // carries out of it; one descriptor computed a tile instead of one a k-step.
    const uint64_t da0 = sm90::smem_desc_sw128(sq_addr, 16, 1024);
    // S = Q K^T of tile i into acc, issued as one wgmma group (not waited for): HEAD_DIM / 16
    // k-steps, each 32 bytes further inside the 128-byte chunk rows of Q and K.
    auto issue_s = [&](int i, float (&acc)[N / 2]) {
      const int s = (it + i) % STAGES;
      const uint64_t db0 = sm90::smem_desc_sw128(sm90::smem_u32(sk + s * S::KV_BYTES), 16, 1024);
      sm90::mbar_wait(&k_full[s], ((it + i) / STAGES) & 1);
      if (gathered) sm90::fence_proxy_async();
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const uint32_t in_chunk = (kk % 4) * 32;
        const uint64_t da = da0 + (((kk / 4) * S::Q_CHUNK_BYTES + in_chunk) >> 4);
        const uint64_t db = db0 + (((kk / 4) * S::KV_CHUNK_BYTES + in_chunk) >> 4);
        sm90::wgmma_ss<T, N>(acc, da, db, kk > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };

    // O += P V of tile i, issued as one wgmma group: N / 16 k-steps of 16 keys (16 rows of 128
    // bytes = 2048 bytes each).
    auto issue_pv = [&](int i, uint32_t (&pa)[N / 16][4]) {
      const uint64_t db0 =
          sm90::smem_desc_sw128(sm90::smem_u32(sv + ((it + i) % STAGES) * S::KV_BYTES), S::KV_CHUNK_BYTES, 1024);
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < N / 16; ++ks) {
        const uint64_t db = db0 + ((ks * 16 * 128) >> 4);
        sm90::wgmma_rs<T, HEAD_DIM, true>(o, pa[ks], db, 1);
      }
      sm90::wgmma_commit();
    };

    // Waits for V of tile i; zeroes its rows >= kv_len where they may be stale memory (whole
    // 128-byte rows, so the swizzle does not matter) before the tensor cores read them. Both
    // consumers zero the same rows (zeros over zeros), each ordering only its own writes.
    auto prepare_pv = [&](int i) {
      const int s = (it + i) % STAGES, tok0 = kv_start + i * N;
      sm90::mbar_wait(&v_full[s], ((it + i) / STAGES) & 1);
      if (gathered) sm90::fence_proxy_async();
      if (zero_tail && tok0 + N > kv_len) {
        uint8_t* vt = sv + s * S::KV_BYTES;
        const int first = max(kv_len - tok0, 0);
        for (int idx = ct; idx < CHUNKS * (N - first) * 8; idx += 128) {
          const int c = idx / ((N - first) * 8), rem = idx % ((N - first) * 8);
          const int row = first + rem / 8, part = rem % 8;
          *reinterpret_cast<uint4*>(vt + c * S::KV_CHUNK_BYTES + row * 128 + part * 16) = make_uint4(0, 0, 0, 0);
        }
        sm90::fence_proxy_async();
        sm90::named_barrier_sync(kSm90ZeroBarrier + cw, 128);
      }
    };

    // Soft-cap, masks and the online-softmax step of tile i, in place: acc (S, the m64nNk16
    // fragment: acc[4j + e] is row qi0 + 8 (e >> 1), key tok0 + 8j + 2t + (e & 1)) becomes the
    // probabilities; m and l are updated and `rescale` gets the factor O must be multiplied by.
    // Writes no register a wgmma in flight reads (P V reads pa and o only).
    auto softmax = [&](int i, float (&acc)[N / 2], float (&rescale)[2]) -> bool {
      const int tok0 = kv_start + i * N;
      if constexpr (SOFTCAP) {
#pragma unroll
        for (int x = 0; x < N / 2; ++x) acc[x] = tanhf(acc[x] * cap_in) * cap_out;
      }
      // Masks only where some key of the tile may be invisible to some query of the warpgroup;
      // each row's visible keys are one interval [lo, hi], so an element costs two compares.
      const bool boundary = tok0 + N > kv_end || (p.causal && tok0 + N - 1 > row0 + offset) ||
                            (p.window_left >= 0 && tok0 < row0 + 63 + offset - p.window_left);
      if (boundary) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qpos = qi0 + 8 * r + offset;
          const int hi = p.causal ? min(kv_end - 1, qpos) : kv_end - 1;
          const int lo = p.window_left >= 0 ? qpos - p.window_left : INT_MIN;
#pragma unroll
          for (int j = 0; j < N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = tok0 + 8 * j + 2 * t + e;
              acc[4 * j + 2 * r + e] = (key >= lo && key <= hi) ? acc[4 * j + 2 * r + e] : neg_inf();
            }
          }
        }
      }
      float m_use[2];
      bool moved = false;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float row_max = neg_inf();
#pragma unroll
        for (int j = 0; j < N / 8; ++j) row_max = fmaxf(row_max, fmaxf(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]));
        rescale[r] = online_softmax_step(row_max, kfac, m[r], l[r], m_use[r]);
        moved = moved || rescale[r] != 1.0f;
      }
#pragma unroll
      for (int x = 0; x < N / 2; ++x) {
        acc[x] = fast_exp2(fmaf(acc[x], kfac, -m_use[(x >> 1) & 1]));
        l[(x >> 1) & 1] += acc[x];
      }
      // Past the first tiles the running max rarely moves: the O rescale is skipped when it moved
      // for no row of the warp (one vote, so the branch stays uniform).
      return __any_sync(0xffffffffu, moved);
    };

    auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
      for (int j = 0; j < HEAD_DIM / 8; ++j) {
        o[4 * j + 0] *= rescale[0];
        o[4 * j + 1] *= rescale[0];
        o[4 * j + 2] *= rescale[1];
        o[4 * j + 3] *= rescale[1];
      }
    };

    // P to 16 bits in the A fragments of the P V k-steps: keys 16ks..16ks+15 are the accumulator
    // n-blocks 2ks and 2ks+1 (for 16-bit types the accumulator layout of a 16-column slice is the A
    // layout of one k-step).
    auto pack_p = [&](const float (&pr)[N / 2], uint32_t (&pa)[N / 16][4]) {
#pragma unroll
      for (int ks = 0; ks < N / 16; ++ks) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float* e = pr + 4 * (2 * ks + h);
          pa[ks][2 * h + 0] = pack2<T>(e[0], e[1]);
          pa[ks][2 * h + 1] = pack2<T>(e[2], e[3]);
        }
      }
    };

    float sacc[N / 2], rescale[2];
    uint32_t pa[N / 16][4];
    if (num_tiles > 0) {
      // FA3's intra-warpgroup overlap: S of tile i+1 and P V of tile i run on the tensor cores while
      // the softmax of tile i+1 runs on the CUDA cores; P is packed and O rescaled once P V of tile
      // i is done. Two ptxas rules shape the loop (else it serialises every wgmma, warnings C7513 /
      // C7514): no instruction defines an input register (o, pa) of a wgmma in flight, and the
      // second group is not conditional (the last tile is peeled out).
      take_turn();
      issue_s(0, sacc);
      pass_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(sacc);
      sm90::mbar_arrive(&k_empty[it % STAGES]);
      softmax(0, sacc, rescale);  // O is still zero: no rescale
      pack_p(sacc, pa);
      for (int i = 0; i + 1 < num_tiles; ++i) {
        prepare_pv(i);
        sm90::fence_regs(o);
        sm90::fence_regs(pa);
        take_turn();
        issue_s(i + 1, sacc);
        issue_pv(i, pa);
        pass_turn();
        sm90::wgmma_wait<1>();  // S of tile i+1 (the older group) is done; P V may still run
        sm90::fence_regs(sacc);
        sm90::mbar_arrive(&k_empty[(it + i + 1) % STAGES]);
        const bool moved = softmax(i + 1, sacc, rescale);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
        sm90::fence_regs(pa);
        sm90::mbar_arrive(&v_empty[(it + i) % STAGES]);
        if (moved) rescale_o(rescale);
        pack_p(sacc, pa);
      }
      const int last = num_tiles - 1;
      prepare_pv(last);
      sm90::fence_regs(o);
      sm90::fence_regs(pa);
      take_turn();
      issue_pv(last, pa);
      pass_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(o);
      sm90::fence_regs(pa);
      sm90::mbar_arrive(&v_empty[(it + last) % STAGES]);
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    sm90::mbar_wait(&checked[qb], use & 1);  // the page check's verdict
    const bool poisoned = unit.bad != 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = qi0 + 8 * r;
      if (qi >= qo_len) continue;
      const float inv = poisoned ? quiet_nan() : l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      T* out = static_cast<T*>(p.out) + int64_t(q_begin + qi) * p.out_stride_n + head * p.out_stride_h;
#pragma unroll
      for (int j = 0; j < HEAD_DIM / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * t) =
            pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
      if (p.lse != nullptr && t == 0)
        p.lse[int64_t(q_begin + qi) * p.lse_stride_n + head] = poisoned ? quiet_nan() : merged_lse(m[r], l[r]);
    }
    sm90::mbar_arrive(&q_empty[qb]);  // Q's buffer and the descriptor are free for a later unit
  }
  if (cw == 0) take_turn();  // consumes consumer 1's last arrival
#else
  // Built for another target: never launched there (prefill_sm90_supported), loud if it were.
  (void)p, (void)tq, (void)tk, (void)tv, (void)boxes, (void)units, (void)errors;
  __trap();
#endif
}

// ---- host ------------------------------------------------------------------------------------

namespace sm90_host {

template <typename T>
constexpr CUtensorMapDataType tma_dtype() {
  return sizeof(T) == 2 && std::is_same_v<T, bf16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

}  // namespace sm90_host

// Whether the gather producer may serve calls TMA cannot tile (page sizes under 16 or neither
// dividing nor a multiple of the tile, strides a tensor map rejects). Off, those calls fall back
// to the FA2 kernel as before (docs/perf/prefill-sm90.md, "Gather producer").
constexpr bool kSm90Gather = true;

// How the KV tiles are loaded: the measured choice, or either producer forced (the self-test's
// A/B timing, tests/cuda/prefill_sm90_selftest.cu).
enum class Sm90Load { kAuto, kTma, kGather };

// Whether calls at head_dim 64 and 128 run the persistent kernel (one CTA per SM walking the
// work units, sm90_unit_index, the next unit's Q and K/V loaded under the current one's last tiles
// and epilogue) instead of prefill_sm90_kernel (one CTA a unit); docs/perf/prefill-sm90.md,
// "Persistent grid". Everything at 256 keeps one CTA a unit (one Q buffer fits). The calls TMA
// loads measured faster persistent. kSm90PersistentGather sends the gathered calls at head_dim 64
// too, where they measured faster; at 128 they stay one CTA a unit, where the persistent gather
// measured slower or equal ("Gathered calls on the persistent grid" has the figures).
// Sm90Grid forces either kernel (the self-test's A/B timing).
constexpr bool kSm90Persistent = true;
constexpr bool kSm90PersistentGather = true;
enum class Sm90Grid { kAuto, kPerUnit, kPersistent };

namespace sm90_host {

// Whether k and v can be described by tensor maps: 16-byte aligned bases, every stride (bytes) a
// positive multiple of 16 below 2^40 (tma::stride_ok).
inline bool kv_tma_ok(const PrefillParams& p, int64_t e) {
  const PagedKV& kv = p.kv;
  return tma::aligned16(kv.k) && tma::aligned16(kv.v) && tma::stride_ok(kv.k_page_stride * e) &&
         tma::stride_ok(kv.k_head_stride * e) && tma::stride_ok(kv.v_page_stride * e) &&
         tma::stride_ok(kv.v_head_stride * e) && tma::stride_ok(kv.k_slot_stride * e) &&
         tma::stride_ok(kv.v_slot_stride * e);
}

// Whether every K and V row starts on 16 bytes (what the gather's 16-byte copies need): aligned
// bases and strides in multiples of 16 bytes, except along an axis of extent 1 (never stepped).
inline bool kv_rows_aligned(const PrefillParams& p, int64_t e) {
  const PagedKV& kv = p.kv;
  auto ok = [&](int64_t stride, int64_t extent) { return extent <= 1 || (stride * e) % 16 == 0; };
  return tma::aligned16(kv.k) && tma::aligned16(kv.v) && ok(kv.k_page_stride, p.kv_num_pages) &&
         ok(kv.v_page_stride, p.kv_num_pages) && ok(kv.k_slot_stride, kv.page_size) &&
         ok(kv.v_slot_stride, kv.page_size) && ok(kv.k_head_stride, p.num_kv_heads) &&
         ok(kv.v_head_stride, p.num_kv_heads);
}

}  // namespace sm90_host

// How a call's KV tiles are loaded: TMA boxes where k/v take tensor maps and the tile is one box
// a chunk (ragged, single, pages a multiple of the tile) or, for pages dividing the tile, at most
// kSm90MaxTmaBoxes boxes a chunk; else the gather (kSm90Gather, rows 16-byte aligned); else
// rows = 0 (the sm90a kernel cannot). `load` forces one producer (rows = 0 where it cannot).
template <typename T, int HEAD_DIM>
Sm90KvBoxes prefill_sm90_boxes(const PrefillParams& p, Sm90Load load = Sm90Load::kAuto) {
  constexpr int N = Sm90Shape<T, HEAD_DIM>::BLOCK_N;
  const int64_t ps = p.kv.page_size, e = sizeof(T);
  const bool gather_ok = kSm90Gather && sm90_host::kv_rows_aligned(p, e);
  if (load != Sm90Load::kGather && sm90_host::kv_tma_ok(p, e)) {
    if (p.kv_contiguous) return ps == 1 ? Sm90KvBoxes{N, true, false} : Sm90KvBoxes{N, false, false};
    if (ps % N == 0) return {N, false, false};
    // Pages under 16 rows would take more than BLOCK_N / 16 boxes a chunk (the single TMA thread
    // would bound the kernel) and break the boxes' 1024-byte swizzle alignment: never TMA.
    const bool tma_tiles = N % ps == 0 && ps >= 16;
    if (tma_tiles && (load == Sm90Load::kTma || !gather_ok || N / ps <= kSm90MaxTmaBoxes)) {
      return {static_cast<int>(ps), false, false};
    }
  }
  if (load != Sm90Load::kTma && gather_ok) return {N, false, true};
  return {0, false, false};
}

// Whether the sm90a kernel can serve this call (else launch_prefill does). `why` gets the reason.
template <typename T, int HEAD_DIM, bool SOFTCAP>
bool prefill_sm90_supported(const PrefillParams& p, int device, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  // Device and module checks, once per device: a 9.0 device, and sm_90a code in this module (a
  // plain 9.0 or PTX-JIT build compiles the kernel to a trap; the arch context builds 9.0 as 9.0a).
  constexpr int kMaxDevices = 64;
  static int8_t cached[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no device, -2 no sm_90a code
  if (device < 0 || device >= kMaxDevices) return no("device ordinal out of range");
  if (cached[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaFuncAttributes attr{};
    if (major != 9 || minor != 0) {
      cached[device] = -1;
    } else if (cudaFuncGetAttributes(&attr, prefill_sm90_kernel<T, HEAD_DIM, SOFTCAP>) != cudaSuccess ||
               attr.binaryVersion != 90 || (attr.ptxVersion != 0 && attr.ptxVersion != 90)) {
      cudaGetLastError();
      cached[device] = -2;
    } else {
      cached[device] = 1;
    }
  }
  if (cached[device] == -1) return no("the device is not compute capability 9.0");
  if (cached[device] == -2) return no("the module has no sm_90a machine code (9.0a not in its arch list)");
  if (tma::encoder() == nullptr) return no("the driver has no cuTensorMapEncodeTiled");
  const int64_t e = sizeof(T);
  if (prefill_sm90_boxes<T, HEAD_DIM>(p).rows == 0) {
    if (!kSm90Gather && sm90_host::kv_tma_ok(p, e)) {
      return no("page_size " + std::to_string(p.kv.page_size) +
                " neither divides nor is a multiple of the KV tile (the gather producer is off)");
    }
    return no(kSm90Gather
                  ? "k_cache or v_cache rows are not 16-byte aligned (data pointer and strides)"
                  : "k or v is not 16-byte aligned or has a stride TMA cannot take (the gather producer is off)");
  }
  if (!tma::aligned16(p.q) || !tma::stride_ok(p.q_stride_n * e) || !tma::stride_ok(p.q_stride_h * e)) {
    return no("q is not 16-byte aligned or has a stride TMA cannot take (q_stride_n " + std::to_string(p.q_stride_n) +
              ", q_stride_h " + std::to_string(p.q_stride_h) + " elements)");
  }
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return no("unsupported head counts");
  }
  return true;
}

template <typename T, int HEAD_DIM, bool SOFTCAP>
Status launch_prefill_sm90(const PrefillParams& p, LaunchContext ctx, Sm90Load load = Sm90Load::kAuto,
                           Sm90Grid grid = Sm90Grid::kAuto) {
  using S = Sm90Shape<T, HEAD_DIM>;
  if (p.work_capacity == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  int device = 0;
  cudaGetDevice(&device);
  std::string why;
  if (!prefill_sm90_supported<T, HEAD_DIM, SOFTCAP>(p, device, &why)) {
    return Status::Error(1, "prefill (sm90a kernel): " + why);
  }
  const Sm90KvBoxes boxes = prefill_sm90_boxes<T, HEAD_DIM>(p, load);
  if (boxes.rows == 0) return Status::Error(1, "prefill (sm90a kernel): the forced KV producer cannot load this cache");
  const auto encode = tma::encoder();
  const CUtensorMapDataType dt = sm90_host::tma_dtype<T>();
  const cuuint64_t e = sizeof(T);
  CUtensorMap tq{}, tk{}, tv{};
  {
    const cuuint64_t dims[3] = {cuuint64_t(HEAD_DIM), cuuint64_t(p.num_qo_heads), cuuint64_t(p.q_rows)};
    const cuuint64_t strides[2] = {cuuint64_t(p.q_stride_h) * e, cuuint64_t(p.q_stride_n) * e};
    const cuuint32_t box[3] = {64, 1, cuuint32_t(kSm90Queries)};
    const cuuint32_t estr[3] = {1, 1, 1};
    if (encode(&tq, dt, 3, const_cast<void*>(p.q), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return Status::Error(kSm90Declined, "prefill (sm90a kernel): cuTensorMapEncodeTiled failed for q");
    }
  }
  const PagedKV& kv = p.kv;
  const cuuint32_t box[4] = {64, boxes.page_axis ? 1u : cuuint32_t(boxes.rows), 1,
                             boxes.page_axis ? cuuint32_t(boxes.rows) : 1u};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  for (int which = 0; which < 2 && !boxes.gather; ++which) {  // the gather reads k and v by pointer
    const cuuint64_t dims[4] = {cuuint64_t(HEAD_DIM), cuuint64_t(kv.page_size), cuuint64_t(p.num_kv_heads),
                                cuuint64_t(p.kv_num_pages)};
    const cuuint64_t strides[3] = {cuuint64_t(which ? kv.v_slot_stride : kv.k_slot_stride) * e,
                                   cuuint64_t(which ? kv.v_head_stride : kv.k_head_stride) * e,
                                   cuuint64_t(which ? kv.v_page_stride : kv.k_page_stride) * e};
    if (encode(which ? &tv : &tk, dt, 4, const_cast<void*>(which ? kv.v : kv.k), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return Status::Error(kSm90Declined, std::string("prefill (sm90a kernel): cuTensorMapEncodeTiled failed for ") +
                                              (which ? "v" : "k"));
    }
  }
  unsigned units = 0;
  if (Status g = prefill_grid(p, &units); !g.ok()) return g;
  // The persistent kernel at head_dim 64 and 128 when TMA loads, and for the gather at 64
  // (kSm90PersistentGather); prefill_sm90_kernel for the gather at 128 and everything at 256 (one
  // Q buffer). Sm90Grid forces either.
  const bool persistent =
      grid == Sm90Grid::kPersistent || (grid == Sm90Grid::kAuto && kSm90Persistent && S::QBUF == 2 &&
                                        (!boxes.gather || (kSm90PersistentGather && HEAD_DIM == 64)));
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if (!persistent) {
    constexpr auto kernel = prefill_sm90_kernel<T, HEAD_DIM, SOFTCAP>;
    Status st =
        cuda_status(allow_smem<kernel>(S::kSmemBytes1, device), "prefill (sm90a): raising the shared-memory limit");
    if (!st.ok()) return st;
    kernel<<<units, kSm90Threads, S::kSmemBytes1, stream>>>(p, tq, tk, tv, boxes, ctx.errors);
    return cuda_status(cudaGetLastError(), "prefill (sm90a) kernel launch");
  }
  constexpr auto kernel = prefill_sm90_persistent_kernel<T, HEAD_DIM, SOFTCAP>;
  Status st =
      cuda_status(allow_smem<kernel>(S::kSmemBytes, device), "prefill (sm90a): raising the shared-memory limit");
  if (!st.ok()) return st;
  int sms = 0;  // one CTA per SM (the kernel takes all of an SM's shared memory)
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    return cuda_status(cudaGetLastError(), "prefill (sm90a): the multiprocessor count");
  }
  const unsigned blocks = std::min(units, static_cast<unsigned>(sms));
  kernel<<<blocks, kSm90Threads, S::kSmemBytes, stream>>>(p, tq, tk, tv, boxes, units, ctx.errors);
  return cuda_status(cudaGetLastError(), "prefill (sm90a) kernel launch");
}

}  // namespace kiln::attention
