// All-reduce kernels over CUDA IPC buffers (contract and synchronisation in comm.h).
//
//   one_shot_kernel   each rank reads every rank's whole buffer and sums in rank order: one
//                     barrier round trip before (inputs in place) and one after (peers done
//                     reading); the small-message algorithm ((W - 1) * S bytes read over NVLink).
//   two_shot_kernel   reduce-scatter then all-gather: rank r sums slice r of every buffer (rank
//                     order) into slice r of its own buffer, a barrier, then every rank copies
//                     slice p from rank p's buffer; 2 (W - 1) / W * S bytes a rank.
//   fused_kernel      one-shot sum of a row, + residual, RMSNorm: one block a row (grid-stride).
//
// Grids are at most kMaxBlocks blocks of kThreads threads (every block must be resident at once,
// comm.h). Vectorised paths take 16-byte vectors when every pointer is 16-byte aligned and the
// count a multiple of the vector (the launcher checks); the scalar path takes anything. Peer data
// is read with ld.global.cg (L2, not L1): it was written by another GPU during this kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/comm/comm.h"
#include "ops/common/dtypes.h"
#include "ops/common/reduce.cuh"
#include "ops/common/vec.cuh"

namespace kiln::comm {

__device__ __forceinline__ void store_release_sys(uint32_t* ptr, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(ptr), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* ptr) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

__device__ __forceinline__ uint32_t* flag(const AllReduceParams& p, int owner, int stage, int block, int from) {
  return static_cast<uint32_t*>(p.signals.ptrs[owner]) + (stage * kMaxBlocks + block) * kMaxRanks + from;
}

// This block's count of calls so far, in this rank's own signal block (comm.h).
__device__ __forceinline__ uint32_t* call_counter(const AllReduceParams& p) {
  return static_cast<uint32_t*>(p.signals.ptrs[p.rank]) + kFlagWords + blockIdx.x;
}

// This call's epoch for this block: one more than the calls it made before. Read by every thread
// before the first barrier; end_call stores it after the last one.
__device__ __forceinline__ uint32_t begin_call(const AllReduceParams& p) {
  return *call_counter(p) + 1;
}

__device__ __forceinline__ void end_call(const AllReduceParams& p, uint32_t epoch) {
  __syncthreads();  // every thread has read the old count
  if (threadIdx.x == 0) *call_counter(p) = epoch;
}

// Block-wide barrier with the same block of every rank at `stage`: every thread of the block
// calls it after its writes of the previous phase. Returns false on every thread when a wait gave
// up (after writing kBarrierTimeout to *error).
__device__ bool barrier(const AllReduceParams& p, int stage, uint32_t epoch) {
  __syncthreads();  // this block's writes of the phase before are done
  bool timed_out = false;
  const int peer = threadIdx.x;
  if (peer < p.world_size) {
    store_release_sys(flag(p, peer, stage, blockIdx.x, p.rank), epoch);
    const uint32_t* mine = flag(p, p.rank, stage, blockIdx.x, peer);
    int64_t spins = 0;
    // Epochs only grow; the signed difference survives the 2^32 wrap.
    while (static_cast<int32_t>(load_acquire_sys(mine) - epoch) < 0) {
      if (++spins > p.spin_limit) {
        timed_out = true;
        atomicExch(p.error, kBarrierTimeout);
        break;
      }
    }
  }
  return !__syncthreads_or(timed_out);
}

template <typename T>
__device__ __forceinline__ T load_cg(const T* ptr) {
  if constexpr (sizeof(T) == 16) {
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(ptr));
    T out;
    memcpy(&out, &raw, sizeof out);
    return out;
  } else if constexpr (sizeof(T) == 4) {
    const unsigned raw = __ldcg(reinterpret_cast<const unsigned*>(ptr));
    T out;
    memcpy(&out, &raw, sizeof out);
    return out;
  } else {
    const unsigned short raw = __ldcg(reinterpret_cast<const unsigned short*>(ptr));
    T out;
    memcpy(&out, &raw, sizeof out);
    return out;
  }
}

// out[i0 .. i1) = sum over ranks of data[r][i0 .. i1), in vectors of N elements (N = 1: scalar).
template <typename T, int N>
__device__ __forceinline__ void sum_range(const AllReduceParams& p, T* out, int64_t i0, int64_t i1) {
  using V = Vec<T, N>;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = i0 / N + int64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < i1 / N; v += step) {
    float acc[N];
    const V first = load_cg(reinterpret_cast<const V*>(p.data.ptrs[0]) + v);
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = first.get(k);
    for (int r = 1; r < p.world_size; ++r) {
      const V x = load_cg(reinterpret_cast<const V*>(p.data.ptrs[r]) + v);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += x.get(k);
    }
    V res;
#pragma unroll
    for (int k = 0; k < N; ++k) res.set(k, acc[k]);
    res.store(out + v * N);
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(AllReduceParams p) {
  const uint32_t epoch = begin_call(p);
  if (!barrier(p, 0, epoch)) return;
  sum_range<T, N>(p, static_cast<T*>(p.out), 0, p.count);
  if (barrier(p, 2, epoch)) end_call(p, epoch);
}

// Slice r covers [r * part, min((r + 1) * part, count)), part a multiple of N.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(AllReduceParams p) {
  const int64_t part = (p.count / N + p.world_size - 1) / p.world_size * N;
  const int64_t lo = p.rank * part < p.count ? p.rank * part : p.count;
  const int64_t hi = lo + part < p.count ? lo + part : p.count;
  const uint32_t epoch = begin_call(p);
  if (!barrier(p, 0, epoch)) return;
  sum_range<T, N>(p, static_cast<T*>(p.data.ptrs[p.rank]), lo, hi);  // into this rank's slice
  if (!barrier(p, 1, epoch)) return;
  using V = Vec<T, N>;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int r = 0; r < p.world_size; ++r) {
    const int64_t s0 = r * part < p.count ? r * part : p.count;
    const int64_t s1 = s0 + part < p.count ? s0 + part : p.count;
    for (int64_t v = s0 / N + int64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < s1 / N; v += step) {
      load_cg(reinterpret_cast<const V*>(p.data.ptrs[r]) + v).store(static_cast<T*>(p.out) + v * N);
    }
  }
  if (barrier(p, 2, epoch)) end_call(p, epoch);
}

// One block a row: s = round(sum_r data[r][row]); residual = round(residual + s) (written back);
// the sum of squares over the row; out = round(residual * rsqrt(mean + eps) * weight).
template <typename T>
__global__ void __launch_bounds__(kThreads) fused_kernel(FusedParams f) {
  const AllReduceParams& p = f.reduce;
  __shared__ float scratch[32];
  const uint32_t epoch = begin_call(p);
  if (!barrier(p, 0, epoch)) return;
  T* residual = static_cast<T*>(f.residual);
  const T* weight = static_cast<const T*>(f.weight);
  T* out = static_cast<T*>(p.out);
  using C = Convert<T>;
  for (int64_t row = blockIdx.x; row < f.rows; row += gridDim.x) {
    const int64_t base = row * f.hidden;
    float squares = 0.0f;
    for (int64_t j = threadIdx.x; j < f.hidden; j += blockDim.x) {
      float acc = C::to_float(load_cg(static_cast<const T*>(p.data.ptrs[0]) + base + j));
      for (int r = 1; r < p.world_size; ++r)
        acc += C::to_float(load_cg(static_cast<const T*>(p.data.ptrs[r]) + base + j));
      const float sum = C::to_float(C::from_float(acc));  // the all-reduce's result, in T
      const T res = C::from_float(C::to_float(residual[base + j]) + sum);
      residual[base + j] = res;
      const float r = C::to_float(res);
      squares += r * r;
    }
    const float total = block_sum(squares, scratch);
    const float inv = rsqrtf(total / static_cast<float>(f.hidden) + f.eps);
    for (int64_t j = threadIdx.x; j < f.hidden; j += blockDim.x) {
      out[base + j] = C::from_float(C::to_float(residual[base + j]) * inv * C::to_float(weight[j]));
    }
  }
  if (barrier(p, 2, epoch)) end_call(p, epoch);
}

}  // namespace kiln::comm
