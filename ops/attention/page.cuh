// Appending keys and values to a paged KV cache on CUDA (see attention.h, AppendParams).
// One block per appended token; its threads copy the token's num_kv_heads x head_dim keys and
// values as 16-byte vectors into the page slot that (batch index, position) maps to, after
// append_target has checked every index on the way there (a bad one is recorded, not written).
// An fp8 E4M3 cache (KV = e4m3_t) receives e4m3(x / scale), saturated: 8 elements a thread, read
// as 16 bytes and written as 8 (x / scale rounded once, as torch's division and cast would).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/attention.h"
#include "ops/common/cuda_utils.cuh"
#include "ops/common/vec.cuh"

namespace kiln::attention {

constexpr int kAppendThreads = 128;

template <typename T, typename KV, int HEAD_DIM>
__global__ void __launch_bounds__(kAppendThreads) append_paged_kv_kernel(const AppendParams p, int64_t* errors) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int LANES = HEAD_DIM / VEC;
  using V = Vec<T, VEC>;
  using W = Vec<KV, VEC>;
  const int64_t i = blockIdx.x;
  int64_t page = 0, slot = 0;  // every thread checks (the same answer); one records
  if (!append_target(p, i, threadIdx.x == 0 ? errors : nullptr, &page, &slot)) return;
  KV* k = static_cast<KV*>(const_cast<void*>(p.kv.k)) + page * p.kv.k_page_stride + slot * p.kv.k_slot_stride;
  KV* v = static_cast<KV*>(const_cast<void*>(p.kv.v)) + page * p.kv.v_page_stride + slot * p.kv.v_slot_stride;
  const T* key = static_cast<const T*>(p.key) + i * p.key_stride_n;
  const T* value = static_cast<const T*>(p.value) + i * p.value_stride_n;
  for (int64_t t = threadIdx.x; t < p.num_kv_heads * LANES; t += kAppendThreads) {
    const int64_t h = t / LANES, dim = (t % LANES) * VEC;
    if constexpr (sizeof(KV) == sizeof(T)) {
      V::load(key + h * p.key_stride_h + dim).store(k + h * p.kv.k_head_stride + dim);
      V::load(value + h * p.value_stride_h + dim).store(v + h * p.kv.v_head_stride + dim);
    } else {
      const V kx = V::load(key + h * p.key_stride_h + dim), vx = V::load(value + h * p.value_stride_h + dim);
      W kq, vq;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        kq.set(e, __fdiv_rn(kx.get(e), p.k_scale));
        vq.set(e, __fdiv_rn(vx.get(e), p.v_scale));
      }
      kq.store(k + h * p.kv.k_head_stride + dim);
      vq.store(v + h * p.kv.v_head_stride + dim);
    }
  }
}

template <typename T, typename KV, int HEAD_DIM>
Status launch_append_paged_kv(const AppendParams& p, LaunchContext ctx) {
  if (p.nnz == 0) return Status::Ok();
  if (p.nnz > 0x7fffffffLL) return Status::Error(1, "append_paged_kv_cache: too many tokens for one launch");
  DeviceGuard guard(ctx.device);
  append_paged_kv_kernel<T, KV, HEAD_DIM>
      <<<static_cast<unsigned>(p.nnz), kAppendThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(p, ctx.errors);
  return cuda_status(cudaGetLastError(), "append_paged_kv_cache kernel launch");
}

}  // namespace kiln::attention
