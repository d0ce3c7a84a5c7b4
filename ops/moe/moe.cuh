// MoE routing and data-movement CUDA kernels and their launchers (see moe.h for the contract).
//
// Every kernel is one launch of a size fixed by the shapes (no host synchronisation, no
// allocation), so a layer built on them captures in a CUDA graph and replays with new routing.
// - topk: one warp per token; the token's scores and keys sit in shared memory, lane l owns
//   experts l, l + 32, ... and marks the ones taken (or outside the chosen groups) in a register
//   mask; each of the k picks is a warp arg-max (moe.h's beats(): larger key, then lower id).
// - sort: one block for the whole batch (n = T * k is at most a few hundred thousand ids). W warps
//   each own a contiguous slice of the ids; pass 1 counts per (warp, expert) with warp match
//   (one shared-memory add per distinct expert of 32 ids), a scan turns the counts into starts,
//   pass 2 repeats the walk and writes each id's row, in flat order within an expert (stable).
// - gather / unpermute: bandwidth bound, 16-byte vectors where the hidden size, strides and
//   pointers allow, narrower otherwise (down to scalars for any hidden size).
// Ids outside [-1, E) and src_idx entries outside [-1, n) are recorded in the device's error record
// (ops/common/device_error.h) and give no row: nothing is read or written through them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/device_error.h"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/mma.cuh"
#include "ops/common/vec.cuh"
#include "ops/moe/moe.h"

namespace kiln::moe {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kTopkWarps = 4;
constexpr int kSmemBytes = 48 * 1024;  // without the opt-in attribute
constexpr int kSortMaxWarps = 32;
constexpr int kCopyThreads = 256;
constexpr int64_t kMaxGridY = 65535;

// Warp arg-max of (key, id) under beats(); every lane gets the winner.
__device__ __forceinline__ void warp_best(float& key, int& id) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float k2 = __shfl_xor_sync(kFull, key, offset);
    const int i2 = __shfl_xor_sync(kFull, id, offset);
    if (i2 >= 0 && beats(k2, i2, key, id)) key = k2, id = i2;
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kTopkWarps * 32) topk_kernel(const TopkParams p) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = int64_t(blockIdx.x) * kTopkWarps + warp;
  if (token >= p.tokens) return;
  const int E = static_cast<int>(p.experts);
  const int G = p.num_groups > 0 ? p.num_groups : 0;
  float* score = smem + int64_t(warp) * (2 * E + G);
  float* key = score + E;
  float* gkey = key + E;
  const T* x = static_cast<const T*>(p.logits) + token * p.logit_stride;
  if (p.scoring == Scoring::kSoftmax) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) {
      const float v = Convert<T>::to_float(x[e]);
      score[e] = v;
      m = fmaxf(m, v);
    }
    m = warp_max(m);
    float s = 0.f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(score[e] - m);
      score[e] = v;
      s += v;
    }
    s = warp_sum(s);
    const float inv = 1.0f / s;
    for (int e = lane; e < E; e += 32) score[e] *= inv;
  } else {
    for (int e = lane; e < E; e += 32) score[e] = sigmoid(Convert<T>::to_float(x[e]));
  }
  for (int e = lane; e < E; e += 32) key[e] = score[e] + (p.bias != nullptr ? p.bias[e] : 0.f);
  __syncwarp();
  uint32_t excluded = 0;  // bit i: expert lane + 32 i is taken or outside the chosen groups
  if (G > 0) {
    const int gsize = E / G;
    for (int g = lane; g < G; g += 32) {
      float b1 = 0.f, b2 = 0.f;
      int i1 = -1, i2 = -1;
      for (int e = g * gsize; e < (g + 1) * gsize; ++e) {
        const float v = key[e];
        if (beats(v, e, b1, i1)) {
          b2 = b1, i2 = i1, b1 = v, i1 = e;
        } else if (beats(v, e, b2, i2)) {
          b2 = v, i2 = e;
        }
      }
      gkey[g] = b1 + b2;
    }
    __syncwarp();
    uint32_t gtaken = 0;  // bit i: group lane + 32 i is chosen
    for (int r = 0; r < p.topk_group; ++r) {
      float best = 0.f;
      int bid = -1;
      for (int g = lane, i = 0; g < G; g += 32, ++i) {
        if (!((gtaken >> i) & 1u) && beats(gkey[g], g, best, bid)) best = gkey[g], bid = g;
      }
      warp_best(best, bid);
      if (bid % 32 == lane) gtaken |= 1u << (bid / 32);
    }
    __syncwarp();
    for (int g = lane, i = 0; g < G; g += 32, ++i) gkey[g] = ((gtaken >> i) & 1u) ? 1.f : 0.f;
    __syncwarp();
    for (int e = lane, i = 0; e < E; e += 32, ++i) {
      if (gkey[e / gsize] == 0.f) excluded |= 1u << i;
    }
  }
  float sum = 0.f;  // every lane sees every pick, so every lane holds the sum
  for (int j = 0; j < p.top_k; ++j) {
    float best = 0.f;
    int bid = -1;
    for (int e = lane, i = 0; e < E; e += 32, ++i) {
      if (!((excluded >> i) & 1u) && beats(key[e], e, best, bid)) best = key[e], bid = e;
    }
    warp_best(best, bid);
    bid = max(bid, 0);  // never negative: the binding checks top_k against the candidates
    if (bid % 32 == lane) excluded |= 1u << (bid / 32);
    const float w = score[bid];
    sum += w;
    if (lane == j % 32) {  // pick j belongs to lane j % 32, which rescales it below
      p.ids[token * p.top_k + j] = bid;
      p.weights[token * p.top_k + j] = w;
    }
  }
  const float factor = (p.renormalize ? 1.0f / sum : 1.0f) * p.scale;
  for (int j = lane; j < p.top_k; j += 32) p.weights[token * p.top_k + j] *= factor;
}

template <typename T>
Status launch_topk(const TopkParams& p, LaunchContext ctx) {
  if (p.tokens == 0 || p.top_k == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const size_t smem = size_t(kTopkWarps) * (2 * p.experts + std::max(p.num_groups, 0)) * sizeof(float);
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(p.tokens, kTopkWarps));
  topk_kernel<T><<<blocks, kTopkWarps * 32, smem, static_cast<cudaStream_t>(ctx.stream)>>>(p);
  return cuda_status(cudaGetLastError(), "moe topk kernel launch");
}

// Warps of the sort: as many as the per-(warp, expert) counters and the three per-expert arrays
// leave room for in 48 KiB, at most 32.
inline int sort_warps(int64_t experts) {
  // 16 words of slack for the kernel's static shared memory (`routed`).
  const int64_t room = kSmemBytes / int64_t(sizeof(int32_t)) - 3 * experts - 16;
  return static_cast<int>(std::clamp<int64_t>(room / std::max<int64_t>(experts, 1), 1, kSortMaxWarps));
}

// The local expert of a global id (expert parallelism, moe.h), or -1 for no row: -1 itself, another
// rank's expert, or an id outside [0, total_experts) (which the caller reports).
__device__ __forceinline__ int32_t local_expert(const SortParams& p, int32_t id) {
  const int64_t l = int64_t(id) - p.first_expert;
  return id >= 0 && l >= 0 && l < p.experts ? static_cast<int32_t>(l) : -1;
}

__global__ void __launch_bounds__(kSortMaxWarps * 32) sort_kernel(const SortParams p) {
  extern __shared__ int32_t ismem[];
  const int W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = static_cast<int>(p.experts);
  const int64_t bs = p.block_size;
  int32_t* cnt = ismem;          // [W][E]: counts, then each warp's next rank within the expert
  int32_t* start = cnt + W * E;  // [E]: the expert's first row
  int32_t* pstart = start + E;   // [E]: the expert's first slot of sorted_ids
  int32_t* pend = pstart + E;    // [E]: one past its last (padded) slot
  __shared__ int32_t routed;     // rows that have an expert (offs[E - 1])
  for (int i = threadIdx.x; i < W * E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int64_t per = ceil_div<int64_t>(p.n, W);
  const int64_t lo = std::min<int64_t>(p.n, warp * per), hi = std::min<int64_t>(p.n, lo + per);
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const int32_t id = i < hi ? p.ids[i] : -1;
    const int32_t e = local_expert(p, id);
    const bool valid = e >= 0;
    if (i < hi && (id < -1 || id >= p.total_experts)) {
      record_error(p.errors, ErrorCode::kExpertId, i, id, p.total_experts);
    }
    const unsigned peers = __match_any_sync(kFull, valid ? e : -1);
    if (valid && lane == __ffs(peers) - 1) cnt[warp * E + e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < W; ++w) {
      const int32_t c = cnt[w * E + e];
      cnt[w * E + e] = run;
      run += c;
    }
    start[e] = run;  // the expert's count for now
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scans of the counts and of the padded counts, 32 experts a lane
    const int chunk = ceil_div(E, 32);
    const int e0 = std::min(E, lane * chunk), e1 = std::min(E, e0 + chunk);
    int32_t rows = 0, slots = 0;
    for (int e = e0; e < e1; ++e) {
      rows += start[e];
      if (bs > 0) slots += static_cast<int32_t>(ceil_div<int64_t>(start[e], bs) * bs);
    }
    int32_t rows_incl = rows, slots_incl = slots;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t r = __shfl_up_sync(kFull, rows_incl, offset), s = __shfl_up_sync(kFull, slots_incl, offset);
      if (lane >= offset) rows_incl += r, slots_incl += s;
    }
    int32_t row = rows_incl - rows, slot = slots_incl - slots;
    for (int e = e0; e < e1; ++e) {
      const int32_t c = start[e];
      start[e] = row;
      pstart[e] = slot;
      row += c;
      if (bs > 0) slot += static_cast<int32_t>(ceil_div<int64_t>(c, bs) * bs);
      pend[e] = slot;
      if (p.offs != nullptr) p.offs[e] = row;
    }
    if (lane == 31) {
      routed = rows_incl;
      if (p.num_post_pad != nullptr) p.num_post_pad[0] = slots_incl;
    }
  }
  __syncthreads();
  if (p.src_idx != nullptr) {
    for (int64_t r = routed + threadIdx.x; r < p.n; r += blockDim.x) p.src_idx[r] = -1;
  }
  if (bs > 0 && p.sorted_ids != nullptr) {
    const int64_t len = p.n + p.experts * (bs - 1);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) p.sorted_ids[i] = static_cast<int32_t>(p.n);
    const int64_t blocks = ceil_div<int64_t>(len, bs);
    const int32_t total = E > 0 ? pend[E - 1] : 0;
    for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
      const int64_t pos = b * bs;
      int32_t e = -1;
      if (pos < total) {  // the first expert whose padded run ends past pos
        int l = 0, r = E - 1;
        while (l < r) {
          const int mid = (l + r) / 2;
          if (pend[mid] > pos)
            r = mid;
          else
            l = mid + 1;
        }
        e = l;
      }
      if (p.expert_ids != nullptr) p.expert_ids[b] = e;
    }
  }
  __syncthreads();
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const int32_t e = local_expert(p, i < hi ? p.ids[i] : -1);
    const bool valid = e >= 0;
    const unsigned peers = __match_any_sync(kFull, valid ? e : -1);
    if (valid) {
      const int32_t within = cnt[warp * E + e] + __popc(peers & ((1u << lane) - 1u));
      if (p.src_idx != nullptr) p.src_idx[start[e] + within] = static_cast<int32_t>(i);
      if (p.sorted_ids != nullptr) p.sorted_ids[pstart[e] + within] = static_cast<int32_t>(i);
    }
    __syncwarp();
    if (valid && lane == __ffs(peers) - 1) cnt[warp * E + e] += __popc(peers);
    __syncwarp();
  }
}

inline Status launch_sort(const SortParams& p, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int warps = sort_warps(p.experts);
  const size_t smem = (size_t(warps) * p.experts + 3 * p.experts) * sizeof(int32_t);
  SortParams q = p;
  q.errors = ctx.errors;
  sort_kernel<<<1, warps * 32, smem, stream>>>(q);
  return cuda_status(cudaGetLastError(), "moe sort kernel launch");
}

inline bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// The widest vector (<= 16 bytes) the hidden size, the row strides and the pointers allow.
template <typename T>
int choose_vec(int64_t hidden, std::initializer_list<int64_t> strides, std::initializer_list<const void*> ptrs) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    bool ok = hidden % vec == 0;
    for (int64_t s : strides) ok = ok && s % vec == 0;
    for (const void* q : ptrs) ok = ok && aligned(q, vec * int64_t(sizeof(T)));
    if (ok) return vec;
  }
  return 1;
}

inline dim3 copy_grid(int64_t rows, int64_t vecs_per_row) {
  const int64_t target = int64_t(sm_count()) * 8;
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(ceil_div<int64_t>(vecs_per_row, kCopyThreads), target));
  const int64_t gy = std::max<int64_t>(1, std::min<int64_t>({rows, kMaxGridY, std::max<int64_t>(1, target / gx)}));
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kCopyThreads) gather_kernel(const GatherParams p) {
  using V = Vec<T, VEC>;
  const int64_t nvec = p.hidden_size / VEC;
  const int64_t bound = p.tokens * p.top_k;
  for (int64_t r = blockIdx.y; r < p.n; r += gridDim.y) {
    const int32_t s = p.src_idx[r];
    const bool ok = s >= 0 && s < bound;
    if (!ok && s != -1 && blockIdx.x == 0 && threadIdx.x == 0)
      record_error(p.errors, ErrorCode::kSourceIndex, r, s, bound);
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    const T* in = static_cast<const T*>(p.hidden) + (ok ? (s / p.top_k) * p.in_stride : 0);
    for (int64_t j = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; j < nvec;
         j += int64_t(gridDim.x) * kCopyThreads) {
      V v;
      if (ok) {
        v = V::load(in + j * VEC);
      } else {
#pragma unroll
        for (int q = 0; q < VEC; ++q) v.set(q, 0.f);
      }
      v.store(out + j * VEC);
    }
  }
}

template <typename T>
Status launch_gather(const GatherParams& p, LaunchContext ctx) {
  if (p.n == 0 || p.hidden_size == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  GatherParams q = p;
  q.errors = ctx.errors;
  const int vec = choose_vec<T>(p.hidden_size, {p.in_stride, p.out_stride}, {p.out, p.hidden});
  const dim3 grid = copy_grid(p.n, p.hidden_size / vec);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const bool ok = dispatch_value<1, 2, 4, 8>(vec, [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if constexpr (VEC * sizeof(T) <= 16) gather_kernel<T, VEC><<<grid, kCopyThreads, 0, stream>>>(q);
  });
  if (!ok) return Status::Error(1, "moe gather: no kernel for vec=" + std::to_string(vec));
  return cuda_status(cudaGetLastError(), "moe gather kernel launch");
}

__global__ void inv_fill_kernel(int32_t* inv, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    inv[i] = -1;
}

__global__ void inv_scatter_kernel(const UnpermuteParams p) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < p.n; r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t s = p.src_idx[r];
    if (s >= 0 && s < p.n) {
      p.inv[s] = static_cast<int32_t>(r);
    } else if (s != -1) {
      record_error(p.errors, ErrorCode::kSourceIndex, r, s, p.n);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kCopyThreads) unpermute_kernel(const UnpermuteParams p) {
  using V = Vec<T, VEC>;
  const int64_t nvec = p.hidden_size / VEC;
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    T* out = static_cast<T*>(p.out) + t * p.out_stride;
    for (int64_t j = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; j < nvec;
         j += int64_t(gridDim.x) * kCopyThreads) {
      float acc[VEC];
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
      for (int64_t k = 0; k < p.top_k; ++k) {
        const int32_t r = p.inv[t * p.top_k + k];
        if (r < 0) continue;
        const float w = p.weights[t * p.weight_stride + k];
        const V v = V::load(static_cast<const T*>(p.rows) + r * p.rows_stride + j * VEC);
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] += w * v.get(q);
      }
      V o;
#pragma unroll
      for (int q = 0; q < VEC; ++q) o.set(q, acc[q]);
      o.store(out + j * VEC);
    }
  }
}

template <typename T>
Status launch_unpermute(const UnpermuteParams& p, LaunchContext ctx) {
  if (p.tokens == 0 || p.hidden_size == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  UnpermuteParams q = p;
  q.errors = ctx.errors;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if (p.n > 0) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(p.n, kCopyThreads), 1024));
    inv_fill_kernel<<<blocks, kCopyThreads, 0, stream>>>(p.inv, p.n);
    inv_scatter_kernel<<<blocks, kCopyThreads, 0, stream>>>(q);
    Status s = cuda_status(cudaGetLastError(), "moe unpermute index kernels launch");
    if (!s.ok()) return s;
  }
  const int vec = choose_vec<T>(p.hidden_size, {p.rows_stride, p.out_stride}, {p.out, p.rows});
  const dim3 grid = copy_grid(p.tokens, p.hidden_size / vec);
  const bool ok = dispatch_value<1, 2, 4, 8>(vec, [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if constexpr (VEC * sizeof(T) <= 16) unpermute_kernel<T, VEC><<<grid, kCopyThreads, 0, stream>>>(q);
  });
  if (!ok) return Status::Error(1, "moe unpermute: no kernel for vec=" + std::to_string(vec));
  return cuda_status(cudaGetLastError(), "moe unpermute kernel launch");
}

// Small-batch expert GEMM: one warp per output column of one expert, the expert's rows in passes
// of kExpertRowsPerPass. Each warp streams its weight row(s) once per pass with 16-byte read-only
// loads and keeps the rows' partial dot products in registers; lane 0 writes the column. A CTA
// whose expert has no rows exits at once, so the grid is every expert x column tile and only the
// selected experts' weights are read: the weight-bandwidth path of decode (docs/perf/moe.md).
constexpr int kExpertWarps = 8;

// The scale of the weight element (row, col) of expert e (1 without scales: 16-bit weights).
template <int SCALE>
__device__ __forceinline__ float weight_scale(const ExpertsParams& p, int64_t e, int64_t row, int64_t col) {
  if constexpr (SCALE == 1) return p.w_scale[e];
  if constexpr (SCALE == 2) {
    return p.w_scale[(e * p.scale_rows + row / kScaleBlock) * p.scale_cols + col / kScaleBlock];
  }
  return 1.f;
}

// Expert e's rows [start, end) of x from offs; false when it has none. offs that do not fit x give
// no row (recorded once per expert by its first CTA), so nothing outside x or out is touched.
__device__ __forceinline__ bool expert_rows(const ExpertsParams& p, int64_t e, int64_t& start, int64_t& end) {
  start = e > 0 ? p.offs[e - 1] : 0;
  end = p.offs[e];
  if (start < 0 || end > p.rows || start > end) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (end > p.rows) {
        record_error(p.errors, ErrorCode::kSegmentEnd, e, end, p.rows);
      } else {
        record_error(p.errors, ErrorCode::kSegmentStart, e, start, end);
      }
    }
    return false;
  }
  return start < end;
}

// The generic epilogue's per-CTA state (one expert a CTA): the expert's parameters and bias row.
template <typename T>
struct GenericEpilogue {
  float q[kExpertActParams];
  const T* bias;  // the expert's bias row, or null

  __device__ __forceinline__ GenericEpilogue(const ExpertsParams& p, int64_t e) {
    act_params_of(p.epi, e, q);
    bias = p.epi.bias != nullptr ? static_cast<const T*>(p.epi.bias) + e * p.epi.bias_stride : nullptr;
  }
  // The output of column c from its float32 dot products g (gate or plain) and u (up).
  template <bool GATED>
  __device__ __forceinline__ float operator()(const ExpertsParams& p, int64_t c, float g, float u) const {
    if (bias != nullptr) {
      g += Convert<T>::to_float(bias[p.gate_row0 + c]);
      if constexpr (GATED) u += Convert<T>::to_float(bias[p.up_row0 + c]);
    }
    return apply_expert_act(p.epi.act, g, GATED ? u : 0.f, q[0], q[1], q[2]);
  }
};

// GENERIC: the epilogue is ExpertsParams::epi's activation (A unused); otherwise A (GATED) or none.
template <typename T, typename W, int VEC, bool GATED, activation::Act A, int SCALE, bool GENERIC = false>
__global__ void __launch_bounds__(kExpertWarps * 32) experts_kernel(const ExpertsParams p) {
  using V = Vec<T, VEC>;
  using VW = Vec<W, VEC>;
  constexpr int R = kExpertRowsPerPass;
  const int64_t e = blockIdx.y;
  int64_t start, end;
  if (!expert_rows(p, e, start, end)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.x) * kExpertWarps + warp;
  if (c >= p.cols) return;
  const W* w = static_cast<const W*>(p.w) + e * p.w_expert_stride;
  const int64_t gate_row = p.gate_row0 + c, up_row = p.up_row0 + c;
  const W* wg = w + gate_row * p.w_row_stride;
  const W* wu = w + up_row * p.w_row_stride;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  for (int64_t r0 = start; r0 < end; r0 += R) {
    const int m = static_cast<int>(std::min<int64_t>(R, end - r0));
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; ++r) ag[r] = au[r] = 0.f;
#pragma unroll 2
    for (int64_t kk = int64_t(lane) * VEC; kk < p.depth; kk += 32 * VEC) {
      const VW g = VW::load_ro(wg + kk);
      VW u;
      if constexpr (GATED) u = VW::load_ro(wu + kk);
      // A vector lies in one 128-column block (VEC divides 128), so a block scale is per vector.
      const float sg = SCALE == 2 ? weight_scale<SCALE>(p, e, gate_row, kk) : 1.f;
      const float su = SCALE == 2 && GATED ? weight_scale<SCALE>(p, e, up_row, kk) : 1.f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < m) {
          const V xv = V::load(x + (r0 + r) * p.x_stride + kk);
          float pg = 0.f, pu = 0.f;
#pragma unroll
          for (int q = 0; q < VEC; ++q) {
            pg += Convert<W>::to_float(g.v[q]) * xv.get(q);
            if constexpr (GATED) pu += Convert<W>::to_float(u.v[q]) * xv.get(q);
          }
          ag[r] += sg * pg;
          if constexpr (GATED) au[r] += su * pu;
        }
      }
    }
    const float tg = SCALE == 1 ? weight_scale<SCALE>(p, e, 0, 0) : 1.f;  // per-expert scale, once
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ag[r] = tg * warp_sum(ag[r]);
      if constexpr (GATED) au[r] = tg * warp_sum(au[r]);
    }
    if constexpr (GENERIC) {
      // Every lane holds every row's sums (warp_sum is a butterfly): lane r finishes row r, one
      // copy of the epilogue's activation switch.
      static_assert(R <= 32, "a lane per row");
      float gr = 0.f, ur = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (lane == r) gr = ag[r], ur = au[r];
      }
      if (lane < m) {
        const GenericEpilogue<T> epi(p, e);
        out[(r0 + lane) * p.out_stride + c] = Convert<T>::from_float(epi.template operator()<GATED>(p, c, gr, ur));
      }
    } else if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < m) {
          const float v = GATED ? activation::apply<A>(ag[r]) * au[r] : ag[r];
          out[(r0 + r) * p.out_stride + c] = Convert<T>::from_float(v);
        }
      }
    }
  }
}

template <typename T, typename W, int VEC, int SCALE>
bool launch_experts_with(const ExpertsParams& q, dim3 grid, cudaStream_t stream) {
  using activation::Act;
  if (q.generic) {
    if (q.gated) {
      experts_kernel<T, W, VEC, true, Act::kSilu, SCALE, true><<<grid, kExpertWarps * 32, 0, stream>>>(q);
    } else {
      experts_kernel<T, W, VEC, false, Act::kSilu, SCALE, true><<<grid, kExpertWarps * 32, 0, stream>>>(q);
    }
  } else if (!q.gated) {
    experts_kernel<T, W, VEC, false, Act::kSilu, SCALE><<<grid, kExpertWarps * 32, 0, stream>>>(q);
  } else if (q.act == Act::kSilu) {
    experts_kernel<T, W, VEC, true, Act::kSilu, SCALE><<<grid, kExpertWarps * 32, 0, stream>>>(q);
  } else if (q.act == Act::kGeluTanh) {
    experts_kernel<T, W, VEC, true, Act::kGeluTanh, SCALE><<<grid, kExpertWarps * 32, 0, stream>>>(q);
  } else {
    return false;
  }
  return true;
}

// The tensor-core form of the small-batch expert GEMM (16-bit activations, depth a multiple of 32,
// 16-byte aligned rows): out^T = W x^T with mma.sync m16n8k16, the weight rows as A (16 output
// columns per CTA) and up to kMmaRows of the expert's rows of x as B (kMmaTiles tiles of 8). The
// CTA's kMmaWarps warps split the depth in chunks of 32 (warp w takes chunks w, w + 4, ...) and
// add their partial sums in shared memory, so even one expert's 16 columns keep 4 warps streaming.
// Lane (g = lane / 4, q = lane % 4) loads 8 contiguous elements of a chunk, [8q, 8q + 8), of
// weight rows g and g + 8 and of x row g: one 16-byte load each (8 bytes for fp8). The k order
// inside a chunk is permuted consistently for A and B (the fragment's k pairs 2q, 2q + 1,
// 2q + 8, 2q + 9 of the two 16-deep steps are this lane's elements 0-3 and 4-7), which leaves the
// dot products unchanged. fp8 weights are dequantised in registers: block scales per element
// (one per 128-column block and row), a per-expert scale once on the sums.
constexpr int kMmaWarps = 4;
constexpr int kMmaTiles = 4;
constexpr int kMmaRows = 8 * kMmaTiles;
constexpr int kMmaCols = 16;
constexpr int kMmaChunk = 32;

// A lane's 8 weights of one row in a chunk, as loaded: 16 bytes of 16-bit weights, 8 of fp8.
template <typename W>
using WeightRaw = std::conditional_t<sizeof(W) == 1, uint2, uint4>;

template <typename W>
__device__ __forceinline__ WeightRaw<W> load_weights(const W* row, int64_t k) {
  return __ldg(reinterpret_cast<const WeightRaw<W>*>(row + k));
}

// Loaded weights as four A registers of T (two elements each, the lower k in the low half); fp8
// ones times `s` (the row's block scale; 1 with a per-expert scale, which goes on the sums).
template <typename T, typename W>
__device__ __forceinline__ void weight_regs(uint32_t (&r)[4], const WeightRaw<W>& raw, float s) {
  if constexpr (sizeof(W) != 1) {
    r[0] = raw.x, r[1] = raw.y, r[2] = raw.z, r[3] = raw.w;
  } else {
    W v[8];
    memcpy(v, &raw, sizeof v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[i] = pack2<T>(s * Convert<W>::to_float(v[2 * i]), s * Convert<W>::to_float(v[2 * i + 1]));
    }
  }
}

// One pass's depth loop over NT tiles of 8 rows (rows r0 .. r0 + m of the expert): each step
// issues all its loads (U chunks of NG x 2 weight rows and NT x rows) before its MMAs. A tile's
// rows past m read row r0 + m - 1 again; their sums land in columns of C that are never stored.
template <typename T, typename W, int NG, int NT, int SCALE, int UMUL>
__device__ __forceinline__ void mma_pass(float (&acc)[NG][kMmaTiles][4], const ExpertsParams& p, const W* w,
                                         const int64_t (&rows_of)[2][2], const T* x, int64_t e, int64_t r0, int m,
                                         int warp, int g) {
  // Chunks in flight per warp: fewer with more tiles (registers), UMUL times more in the one-tile
  // form with fp8 weights (8-byte loads: the same bytes in flight as 16-bit weights).
  constexpr int U = std::max(1, (NG == 2 ? 2 : 4) * UMUL / (NT > 2 ? 4 : NT));
  constexpr int64_t kStep = int64_t(kMmaWarps) * kMmaChunk;
  const T* xr[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xr[t] = x + (r0 + std::min(t * 8 + g, m - 1)) * p.x_stride;
#pragma unroll 1
  for (int64_t kb = int64_t(warp) * kMmaChunk; kb < p.depth; kb += U * kStep) {
    WeightRaw<W> a[U][NG][2];  // [chunk][gate/up][row g / g + 8], converted at the MMAs
    float sc[U][NG][2];        // their block scales (block-scaled fp8 only)
    uint4 xb[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = kb + u * kStep;
      if (k < p.depth) {
#pragma unroll
        for (int h = 0; h < NG; ++h)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            a[u][h][j] = load_weights(w + rows_of[h][j] * p.w_row_stride, k);
            // k is the chunk's start: a chunk of 32 lies in one 128-column scale block.
            sc[u][h][j] = SCALE == 2 ? weight_scale<2>(p, e, rows_of[h][j], k) : 1.f;
          }
#pragma unroll
        for (int t = 0; t < NT; ++t) xb[u][t] = *reinterpret_cast<const uint4*>(xr[t] + k);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kb + u * kStep >= p.depth) break;
#pragma unroll
      for (int h = 0; h < NG; ++h) {
        uint32_t r[2][4];
        weight_regs<T, W>(r[0], a[u][h][0], sc[u][h][0]);
        weight_regs<T, W>(r[1], a[u][h][1], sc[u][h][1]);
        const uint32_t lo[4] = {r[0][0], r[1][0], r[0][1], r[1][1]};
        const uint32_t hi[4] = {r[0][2], r[1][2], r[0][3], r[1][3]};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          mma_16x8x16<T>(acc[h][t], lo, xb[u][t].x, xb[u][t].y);
          mma_16x8x16<T>(acc[h][t], hi, xb[u][t].z, xb[u][t].w);
        }
      }
    }
  }
}

// MAX_TILES: the most 8-row tiles a pass can have, from the rows of x (1 when there are at most 8
// rows in all: decode of one token, where occupancy, not the tiles' loads, hides the latency).
// The 4-tile forms take at most 168 registers (3 CTAs an SM) without spills; the block-scaled fp8
// ones ~200 (2).
template <typename T, typename W, bool GATED, activation::Act A, int SCALE, int MAX_TILES, bool GENERIC = false>
__global__ void __launch_bounds__(kMmaWarps * 32, MAX_TILES == 1 ? 4
                                                  : SCALE == 2   ? 2
                                                                 : 3) experts_mma_kernel(const ExpertsParams p) {
  constexpr int NG = GATED ? 2 : 1;  // gate (and up) weight tiles
  constexpr int UMUL = sizeof(W) == 1 && MAX_TILES == 1 ? 2 : 1;
  __shared__ float red[kMmaWarps - 1][NG][kMmaTiles][4][32];
  const int64_t e = blockIdx.y;
  int64_t start, end;
  if (!expert_rows(p, e, start, end)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t c0 = int64_t(blockIdx.x) * kMmaCols;
  if (c0 >= p.cols) return;
  // The lane's two output columns, clamped into the matrix (a tail tile computes and drops them).
  const int64_t ca = std::min<int64_t>(c0 + g, p.cols - 1), cb = std::min<int64_t>(c0 + g + 8, p.cols - 1);
  const W* w = static_cast<const W*>(p.w) + e * p.w_expert_stride + q * 8;
  const int64_t rows_of[2][2] = {{p.gate_row0 + ca, p.gate_row0 + cb}, {p.up_row0 + ca, p.up_row0 + cb}};
  const T* x = static_cast<const T*>(p.x) + q * 8;
  T* out = static_cast<T*>(p.out);
  for (int64_t r0 = start; r0 < end; r0 += kMmaRows) {
    const int m = static_cast<int>(std::min<int64_t>(kMmaRows, end - r0));
    const int tiles = (m + 7) / 8;
    float acc[NG][kMmaTiles][4];
#pragma unroll
    for (int h = 0; h < NG; ++h)
#pragma unroll
      for (int t = 0; t < kMmaTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][t][i] = 0.f;
    if constexpr (MAX_TILES == 1) {
      mma_pass<T, W, NG, 1, SCALE, UMUL>(acc, p, w, rows_of, x, e, r0, m, warp, g);
    } else {
      switch (tiles) {  // the tile count as a constant, so each step's loads all go out before its MMAs
        case 1:
          mma_pass<T, W, NG, 1, SCALE, UMUL>(acc, p, w, rows_of, x, e, r0, m, warp, g);
          break;
        case 2:
          mma_pass<T, W, NG, 2, SCALE, 1>(acc, p, w, rows_of, x, e, r0, m, warp, g);
          break;
        case 3:
          mma_pass<T, W, NG, 3, SCALE, 1>(acc, p, w, rows_of, x, e, r0, m, warp, g);
          break;
        default:
          mma_pass<T, W, NG, 4, SCALE, 1>(acc, p, w, rows_of, x, e, r0, m, warp, g);
      }
    }
    // Split-k sum: warps 1.. hand their partial tiles to warp 0, which finishes the columns.
    if (warp > 0) {
#pragma unroll
      for (int h = 0; h < NG; ++h)
#pragma unroll
        for (int t = 0; t < kMmaTiles; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[warp - 1][h][t][i][lane] = acc[h][t][i];
    }
    __syncthreads();
    if (warp == 0) {
      const float ts = SCALE == 1 ? p.w_scale[e] : 1.f;
#pragma unroll
      for (int t = 0; t < kMmaTiles; ++t) {
        if (t >= tiles) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v[NG];
#pragma unroll
          for (int h = 0; h < NG; ++h) {
            v[h] = acc[h][t][i];
#pragma unroll
            for (int o = 0; o < kMmaWarps - 1; ++o) v[h] += red[o][h][t][i][lane];
            v[h] *= ts;
          }
          const int row = t * 8 + 2 * q + (i & 1);
          const int64_t col = c0 + g + (i >= 2 ? 8 : 0);
          if constexpr (GENERIC) {
            // Staged in the lane's own slots of red (read above): one copy of the epilogue's
            // activation switch below instead of one per element.
#pragma unroll
            for (int h = 0; h < NG; ++h) red[0][h][t][i][lane] = v[h];
          } else if (row < m && col < p.cols) {
            float y = v[0];
            if constexpr (GATED) y = activation::apply<A>(v[0]) * v[NG - 1];
            out[(r0 + row) * p.out_stride + col] = Convert<T>::from_float(y);
          }
        }
      }
      if constexpr (GENERIC) {
        const GenericEpilogue<T> epi(p, e);
#pragma unroll 1
        for (int k = 0; k < tiles * 4; ++k) {
          const int t = k / 4, i = k % 4;
          const int row = t * 8 + 2 * q + (i & 1);
          const int64_t col = c0 + g + (i >= 2 ? 8 : 0);
          if (row < m && col < p.cols) {
            const float y = epi.template operator()<GATED>(p, col, red[0][0][t][i][lane], red[0][NG - 1][t][i][lane]);
            out[(r0 + row) * p.out_stride + col] = Convert<T>::from_float(y);
          }
        }
      }
    }
    __syncthreads();  // red is reused by the next pass
  }
}

template <typename T, typename W, int SCALE, int MAX_TILES>
void launch_experts_mma_tiles(const ExpertsParams& q, dim3 grid, cudaStream_t stream, bool& launched) {
  using activation::Act;
  launched = true;
  if (q.generic) {
    if (q.gated) {
      experts_mma_kernel<T, W, true, Act::kSilu, SCALE, MAX_TILES, true><<<grid, kMmaWarps * 32, 0, stream>>>(q);
    } else {
      experts_mma_kernel<T, W, false, Act::kSilu, SCALE, MAX_TILES, true><<<grid, kMmaWarps * 32, 0, stream>>>(q);
    }
  } else if (!q.gated) {
    experts_mma_kernel<T, W, false, Act::kSilu, SCALE, MAX_TILES><<<grid, kMmaWarps * 32, 0, stream>>>(q);
  } else if (q.act == Act::kSilu) {
    experts_mma_kernel<T, W, true, Act::kSilu, SCALE, MAX_TILES><<<grid, kMmaWarps * 32, 0, stream>>>(q);
  } else if (q.act == Act::kGeluTanh) {
    experts_mma_kernel<T, W, true, Act::kGeluTanh, SCALE, MAX_TILES><<<grid, kMmaWarps * 32, 0, stream>>>(q);
  } else {
    launched = false;
  }
}

template <typename T, typename W, int SCALE>
void launch_experts_mma_with(const ExpertsParams& q, dim3 grid, cudaStream_t stream, bool& launched) {
  if (q.rows <= 8) {
    launch_experts_mma_tiles<T, W, SCALE, 1>(q, grid, stream, launched);
  } else {
    launch_experts_mma_tiles<T, W, SCALE, kMmaTiles>(q, grid, stream, launched);
  }
}

// Whether the tensor-core kernel takes these operands: 16-bit activations, whole 32-element chunks,
// and 16-byte rows of x and w (8-byte for fp8 weights).
template <typename T>
bool mma_experts_fit(const ExpertsParams& p) {
  if constexpr (!std::is_same_v<T, bf16_t> && !std::is_same_v<T, f16_t>) {
    return false;
  } else {
    const int64_t wbytes = 8 * (p.w_fp8 ? 1 : int64_t(sizeof(T)));  // a lane's 8 weights of a row
    return p.depth % kMmaChunk == 0 && p.x_stride % 8 == 0 && aligned(p.x, 16) && p.w_row_stride % 8 == 0 &&
           p.w_expert_stride % 8 == 0 && aligned(p.w, wbytes);
  }
}

template <typename T>
Status launch_experts(const ExpertsParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.cols == 0 || p.experts == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  ExpertsParams q = p;
  q.errors = ctx.errors;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
    if (mma_experts_fit<T>(p)) {
      const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(p.cols, kMmaCols)), static_cast<unsigned>(p.experts));
      bool launched = false;
      if (!p.w_fp8) {
        launch_experts_mma_with<T, T, 0>(q, grid, stream, launched);
      } else if (p.scale_mode == 1) {
        launch_experts_mma_with<T, e4m3_t, 1>(q, grid, stream, launched);
      } else if (p.scale_mode == 2) {
        launch_experts_mma_with<T, e4m3_t, 2>(q, grid, stream, launched);
      }
      if (!launched) {
        return Status::Error(
            1, "moe experts (tensor cores): no kernel for act=" + std::to_string(static_cast<int>(p.act)) +
                   " scale_mode=" + std::to_string(p.scale_mode));
      }
      return cuda_status(cudaGetLastError(), "moe experts kernel launch");
    }
  }
  // The widest vector x allows (<= 16 bytes of T) that the weights' alignment allows too.
  int vec = choose_vec<T>(p.depth, {p.x_stride, p.w_row_stride, p.w_expert_stride}, {p.x});
  const int64_t wbytes = p.w_fp8 ? 1 : int64_t(sizeof(T));
  while (vec > 1 && !aligned(p.w, vec * wbytes)) vec /= 2;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(p.cols, kExpertWarps)), static_cast<unsigned>(p.experts));
  bool launched = false;
  const bool ok = dispatch_value<1, 2, 4, 8>(vec, [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if constexpr (VEC * sizeof(T) <= 16) {
      if (!p.w_fp8) {
        launched = launch_experts_with<T, T, VEC, 0>(q, grid, stream);
      } else if (p.scale_mode == 1) {
        launched = launch_experts_with<T, e4m3_t, VEC, 1>(q, grid, stream);
      } else if (p.scale_mode == 2) {
        launched = launch_experts_with<T, e4m3_t, VEC, 2>(q, grid, stream);
      }
    }
  });
  if (!ok || !launched) {
    return Status::Error(1, "moe experts: no kernel for vec=" + std::to_string(vec) +
                                " act=" + std::to_string(static_cast<int>(p.act)) +
                                " scale_mode=" + std::to_string(p.scale_mode));
  }
  return cuda_status(cudaGetLastError(), "moe experts kernel launch");
}

// fp8 weights to the module's dtype: 8 elements a thread (one 8-byte load, one 16-byte store of
// 16-bit elements) where the columns allow, one otherwise; a vector of 8 lies in one scale block.
template <typename T, int VEC>
__global__ void __launch_bounds__(kCopyThreads) dequant_kernel(const DequantParams p) {
  const int64_t per = p.rows * p.cols, n = p.experts * per / VEC;
  const auto* w = static_cast<const e4m3_t*>(p.w);
  T* out = static_cast<T*>(p.out);
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = v * VEC, e = i / per, rem = i - e * per, r = rem / p.cols, c = rem - r * p.cols;
    const float s =
        p.scale_mode == 1 ? p.scale[e] : p.scale[(e * p.scale_rows + r / kScaleBlock) * p.scale_cols + c / kScaleBlock];
    const Vec<e4m3_t, VEC> in = Vec<e4m3_t, VEC>::load_ro(w + i);
    Vec<T, VEC> o;
#pragma unroll
    for (int q = 0; q < VEC; ++q) o.set(q, s * Convert<e4m3_t>::to_float(in.v[q]));
    o.store(out + i);
  }
}

template <typename T>
Status launch_dequant(const DequantParams& p, LaunchContext ctx) {
  const int64_t total = p.experts * p.rows * p.cols;
  if (total == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const bool wide = p.cols % 8 == 0 && aligned(p.w, 8) && aligned(p.out, 8 * int64_t(sizeof(T)));
  const int64_t vectors = wide ? total / 8 : total;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(vectors, kCopyThreads), 1 << 16));
  if (wide) {
    dequant_kernel<T, 8><<<blocks, kCopyThreads, 0, stream>>>(p);
  } else {
    dequant_kernel<T, 1><<<blocks, kCopyThreads, 0, stream>>>(p);
  }
  return cuda_status(cudaGetLastError(), "moe dequant kernel launch");
}

// --- expert_act: the activation between the projections, per expert (moe.h) ------------------------

template <typename T, int VEC>
__global__ void __launch_bounds__(kCopyThreads) expert_act_kernel(const ExpertActParams p) {
  using V = Vec<T, VEC>;
  const int64_t nvec = p.cols / VEC;
  const bool gated = is_gated(p.act);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const int64_t e = expert_of_row(p.offs, p.experts, r);
    const bool routed = e < p.experts;
    float q[kExpertActParams];
#pragma unroll
    for (int i = 0; i < kExpertActParams; ++i) {
      q[i] = routed && p.param[i] != nullptr ? p.param[i][e * p.param_stride[i]] : p.param_default[i];
    }
    const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
    const T* bias = routed && p.bias != nullptr ? static_cast<const T*>(p.bias) + e * p.bias_stride : nullptr;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t j = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; j < nvec;
         j += int64_t(gridDim.x) * kCopyThreads) {
      const int64_t c = j * VEC;
      V o;
      if (!routed) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.set(k, 0.f);
      } else {
        const V g = V::load(in + p.gate_col0 + c);
        const V u = gated ? V::load(in + p.up_col0 + c) : g;
        V bg, bu;
        if (bias != nullptr) {
          bg = V::load(bias + p.gate_col0 + c);
          bu = gated ? V::load(bias + p.up_col0 + c) : bg;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float gv = g.get(k) + (bias != nullptr ? bg.get(k) : 0.f);
          const float uv = gated ? u.get(k) + (bias != nullptr ? bu.get(k) : 0.f) : 0.f;
          o.set(k, apply_expert_act(p.act, gv, uv, q[0], q[1], q[2]));
        }
      }
      o.store(out + c);
    }
  }
}

template <typename T>
Status launch_expert_act(const ExpertActParams& p, LaunchContext ctx) {
  if (p.rows == 0 || p.cols == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const int vec = choose_vec<T>(p.cols, {p.in_stride, p.out_stride, p.gate_col0, p.up_col0, p.bias_stride},
                                {p.out, p.in, p.bias != nullptr ? p.bias : p.in});
  const dim3 grid = copy_grid(p.rows, p.cols / vec);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const bool ok = dispatch_value<1, 2, 4, 8>(vec, [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    if constexpr (VEC * sizeof(T) <= 16) expert_act_kernel<T, VEC><<<grid, kCopyThreads, 0, stream>>>(p);
  });
  if (!ok) return Status::Error(1, "moe expert_act: no kernel for vec=" + std::to_string(vec));
  return cuda_status(cudaGetLastError(), "moe expert_act kernel launch");
}

}  // namespace kiln::moe
