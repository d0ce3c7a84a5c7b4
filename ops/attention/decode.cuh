// Paged decode attention on CUDA cores (sm80+): kernel and launcher. See attention.h for the
// contract.
//
// One CTA = one work item (request, token range) x one kv head x GROUP of its query heads, so
// each K/V byte is read once for GROUP heads. 128 threads; a token's head_dim is split over
// LANES = head_dim / 8 threads (16-byte vectors), ROWS = 128 / LANES tokens side by side, and
// UNROLL tokens per thread per stage. K and V tiles stream through a kStages-deep cp.async
// pipeline in shared memory; each thread reads back only what it copied, so stages need no
// barrier. Per stage: q.k partial dots, a butterfly sum over the LANES lanes, one online-softmax
// rescale per head for the stage's UNROLL tokens, then p.v accumulation in float32. At the end the
// ROWS partial states of the CTA are merged through shared memory and written to out/lse, or to a
// float32 partial slot that merge_decode_partials combines (split-KV).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/attention/attention.h"
#include "ops/attention/merge.cuh"
#include "ops/attention/state.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/math.h"
#include "ops/common/vec.cuh"

namespace kiln::attention {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeStages = 3;

template <typename T, int HEAD_DIM, int GROUP>
struct DecodeShape {
  static constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte vector
  static constexpr int LANES = HEAD_DIM / VEC;
  static constexpr int ROWS = kDecodeThreads / LANES;
  static constexpr int UNROLL = GROUP >= 8 ? 2 : 4;  // fewer tokens per stage when q/o take registers
  static constexpr int TILE = ROWS * UNROLL;         // tokens per stage
  static constexpr size_t kStagingBytes = size_t(2) * kDecodeStages * TILE * HEAD_DIM * sizeof(T);
  static constexpr size_t kCombineBytes = size_t(ROWS) * GROUP * (HEAD_DIM + 2) * sizeof(float);
  static constexpr size_t kSmemBytes = kStagingBytes > kCombineBytes ? kStagingBytes : kCombineBytes;
  static_assert(LANES >= 1 && LANES <= 32 && (32 % LANES) == 0, "head_dim must be 8..256 elements");
  static_assert(kSmemBytes <= 48 * 1024, "decode tile exceeds the default shared-memory limit");
};

// Sum over the LANES consecutive lanes that share a token.
template <int LANES>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T, int HEAD_DIM, int GROUP, bool SOFTCAP>
__global__ void __launch_bounds__(kDecodeThreads) decode_paged_kernel(const DecodeParams p) {
  using S = DecodeShape<T, HEAD_DIM, GROUP>;
  using V = Vec<T, S::VEC>;
  constexpr int VEC = S::VEC, LANES = S::LANES, ROWS = S::ROWS, UNROLL = S::UNROLL, TILE = S::TILE;
  extern __shared__ __align__(16) unsigned char smem[];
  T* kbuf = reinterpret_cast<T*>(smem);  // [stage][token][head_dim]
  T* vbuf = kbuf + kDecodeStages * TILE * HEAD_DIM;

  const int work = blockIdx.x;
  const int request = p.work_request[work];
  if (request < 0) return;  // padding entry (CUDA-graph capacity)
  const int64_t tok_begin = p.work_token_begin[work];
  const int64_t tok_end = p.work_token_end[work];
  const int out_index = p.work_out_index[work];
  const int group_size = int(p.num_qo_heads / p.num_kv_heads);
  const int head_chunks = group_size / GROUP;
  const int kv_head = blockIdx.y / head_chunks;
  const int qo_head0 = kv_head * group_size + (blockIdx.y % head_chunks) * GROUP;
  const int lane = threadIdx.x % LANES;
  const int row = threadIdx.x / LANES;

  // q for GROUP heads (this lane's VEC dims), pre-scaled so logits come out in log2 units (or,
  // with soft-cap, in the units tanh takes).
  const float q_scale = SOFTCAP ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e;
  float q[GROUP][VEC];
#pragma unroll
  for (int j = 0; j < GROUP; ++j) {
    const V qv =
        V::load(static_cast<const T*>(p.q) + request * p.q_stride_b + (qo_head0 + j) * p.q_stride_h + lane * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) q[j][k] = qv.get(k) * q_scale;
  }

  float m[GROUP], d[GROUP], o[GROUP][VEC];
#pragma unroll
  for (int j = 0; j < GROUP; ++j) {
    m[j] = neg_inf();
    d[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[j][k] = 0.0f;
  }

  const PagedKV& kv = p.kv;
  const int32_t* pages = kv.page_indices + kv.page_indptr[request];
  const T* k_head = static_cast<const T*>(kv.k) + kv_head * kv.k_head_stride + lane * VEC;
  const T* v_head = static_cast<const T*>(kv.v) + kv_head * kv.v_head_stride + lane * VEC;

  auto issue = [&](int stage, int64_t tile_start) {
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
      const int64_t tok = tile_start + row + r * ROWS;
      const bool valid = tok < tok_end;
      const int64_t page = valid ? pages[tok / kv.page_size] : 0;
      const int64_t slot = valid ? tok % kv.page_size : 0;
      const int smem_off = (stage * TILE + row + r * ROWS) * HEAD_DIM + lane * VEC;
      cp_async_16(kbuf + smem_off, k_head + page * kv.k_page_stride + slot * kv.k_slot_stride, valid);
      cp_async_16(vbuf + smem_off, v_head + page * kv.v_page_stride + slot * kv.v_slot_stride, valid);
    }
    cp_async_commit();
  };

  const int64_t num_tiles = ceil_div<int64_t>(tok_end - tok_begin, TILE);
#pragma unroll
  for (int s = 0; s < kDecodeStages - 1; ++s) {
    if (s < num_tiles) {
      issue(s, tok_begin + s * TILE);
    } else {
      cp_async_commit();  // empty group keeps the wait count uniform
    }
  }

  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    const int64_t next = tile + kDecodeStages - 1;
    if (next < num_tiles) {
      issue(int(next % kDecodeStages), tok_begin + next * TILE);
    } else {
      cp_async_commit();
    }
    cp_async_wait<kDecodeStages - 1>();  // this thread's copies of `tile` have landed
    const int stage = int(tile % kDecodeStages);
    const int64_t tile_start = tok_begin + tile * TILE;

    float s[UNROLL][GROUP];
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
      const V kv_vec = *reinterpret_cast<const V*>(kbuf + (stage * TILE + row + r * ROWS) * HEAD_DIM + lane * VEC);
      float kf[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) kf[k] = kv_vec.get(k);
#pragma unroll
      for (int j = 0; j < GROUP; ++j) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc = fmaf(q[j][k], kf[k], acc);
        s[r][j] = acc;
      }
    }
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
      const bool valid = tile_start + row + r * ROWS < tok_end;
#pragma unroll
      for (int j = 0; j < GROUP; ++j) {
        float logit = lanes_sum<LANES>(s[r][j]);
        if constexpr (SOFTCAP) logit = tanhf(logit) * (p.soft_cap * kLog2e);
        s[r][j] = valid ? logit : neg_inf();
      }
    }
    // One rescale per head per stage, then p.v.
    float pr[UNROLL][GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      float tile_max = s[0][j];
#pragma unroll
      for (int r = 1; r < UNROLL; ++r) tile_max = fmaxf(tile_max, s[r][j]);
      const float m_new = fmaxf(m[j], tile_max);
      const float rescale = scale_from(m[j], m_new);
      d[j] *= rescale;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[j][k] *= rescale;
#pragma unroll
      for (int r = 0; r < UNROLL; ++r) {
        pr[r][j] = scale_from(s[r][j], m_new);
        d[j] += pr[r][j];
      }
      m[j] = m_new;
    }
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
      const V v_vec = *reinterpret_cast<const V*>(vbuf + (stage * TILE + row + r * ROWS) * HEAD_DIM + lane * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float vk = v_vec.get(k);
#pragma unroll
        for (int j = 0; j < GROUP; ++j) o[j][k] = fmaf(pr[r][j], vk, o[j][k]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the staging buffers become the combine buffer

  // Merge the ROWS partial states of this CTA: [row][head] (m, d) and [row][head][dim] o.
  float* c_md = reinterpret_cast<float*>(smem);  // [ROWS][GROUP][2]
  float* c_o = c_md + ROWS * GROUP * 2;          // [ROWS][GROUP][HEAD_DIM]
#pragma unroll
  for (int j = 0; j < GROUP; ++j) {
    if (lane == 0) {
      c_md[(row * GROUP + j) * 2] = m[j];
      c_md[(row * GROUP + j) * 2 + 1] = d[j];
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) c_o[(row * GROUP + j) * HEAD_DIM + lane * VEC + k] = o[j][k];
  }
  __syncthreads();
  for (int j = row; j < GROUP; j += ROWS) {
    float m_all = neg_inf();
    for (int r = 0; r < ROWS; ++r) m_all = fmaxf(m_all, c_md[(r * GROUP + j) * 2]);
    float d_all = 0.0f, acc[VEC] = {};
    for (int r = 0; r < ROWS; ++r) {
      const float w = scale_from(c_md[(r * GROUP + j) * 2], m_all);
      d_all += w * c_md[(r * GROUP + j) * 2 + 1];
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += w * c_o[(r * GROUP + j) * HEAD_DIM + lane * VEC + k];
    }
    const float inv = d_all > 0.0f ? 1.0f / d_all : 0.0f;
    const float lse = merged_lse(m_all, d_all);
    const int head = qo_head0 + j;
    if (out_index < 0) {
      V ov;
#pragma unroll
      for (int k = 0; k < VEC; ++k) ov.set(k, acc[k] * inv);
      ov.store(static_cast<T*>(p.out) + request * p.out_stride_b + head * p.out_stride_h + lane * VEC);
      if (p.lse != nullptr && lane == 0) p.lse[request * p.lse_stride_b + head] = lse;
    } else {
      float* dst = p.partial_out + (int64_t(out_index) * p.num_qo_heads + head) * HEAD_DIM + lane * VEC;
#pragma unroll
      for (int k = 0; k < VEC; ++k) dst[k] = acc[k] * inv;
      if (lane == 0) p.partial_lse[int64_t(out_index) * p.num_qo_heads + head] = lse;
    }
  }
}

// Query heads per CTA: the largest of 8, 4, 2, 1 that divides the GQA group size (one table).
inline int heads_per_cta(int64_t group_size) {
  for (int g : {8, 4, 2, 1}) {
    if (group_size % g == 0) return g;
  }
  return 1;
}

template <typename T, int HEAD_DIM, bool SOFTCAP>
Status launch_decode(const DecodeParams& p, LaunchContext ctx) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return Status::Error(1, "decode: num_qo_heads (" + std::to_string(p.num_qo_heads) +
                                ") must be a multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) + ")");
  }
  if (p.work_capacity == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t group_size = p.num_qo_heads / p.num_kv_heads;
  const int g = heads_per_cta(group_size);
  const dim3 grid(static_cast<unsigned>(p.work_capacity), static_cast<unsigned>(p.num_kv_heads * (group_size / g)));
  if (grid.y > 65535) return Status::Error(1, "decode: too many kv heads x head chunks for one launch");
  const bool launched = dispatch_value<1, 2, 4, 8>(g, [&](auto kGroup) {
    constexpr int GROUP = decltype(kGroup)::value;
    using S = DecodeShape<T, HEAD_DIM, GROUP>;
    decode_paged_kernel<T, HEAD_DIM, GROUP, SOFTCAP><<<grid, kDecodeThreads, S::kSmemBytes, stream>>>(p);
  });
  if (!launched) return Status::Error(1, "decode: no kernel for " + std::to_string(g) + " heads per CTA");
  Status st = cuda_status(cudaGetLastError(), "decode kernel launch");
  if (!st.ok() || p.merge_capacity == 0) return st;
  return launch_merge_decode_partials<T, HEAD_DIM>(p, stream);
}

}  // namespace kiln::attention
