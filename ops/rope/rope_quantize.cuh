// rope_quantize CUDA kernel and its launcher (see rope.h for the contract): RoPE of the rotary
// parts of q and k from cos_sin_cache rows, and both parts scaled and rounded to fp8, in one pass.
//
// Memory bound: every input element is read once and one byte written. As rope_kernel, a block
// owns one token at a time (a grid-stride loop): it stages the token's rope_dim / 2 (cos, sin)
// pairs of its cache row in shared memory, then its threads walk the token's units: first the
// rotary rows (q heads, then k heads), then the non-rotary rows. A unit is VEC pairs (NeoX: a
// vector from each half), VEC elements (interleaved: VEC / 2 pairs, at least one pair) or VEC
// non-rotary elements; 16-byte loads and 8-byte stores when every shape, stride and pointer allows.
//
// Programmatic dependent launch (LaunchContext::pdl, sm90+): the kernel waits for the previous
// grid before its first global access and lets the next one launch once its loads are done.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/dispatch.h"
#include "ops/common/dtypes.h"
#include "ops/common/pdl.cuh"
#include "ops/common/vec.cuh"
#include "ops/rope/rope.cuh"

namespace kiln::rope {

constexpr int kQuantBlocksPerSm = 8;  // 2048 resident threads per SM: loads enough in flight for DRAM

// VEC fp8 bytes stored with one access.
template <int VEC>
struct alignas(VEC) Fp8Vec {
  uint8_t b[VEC];
  __device__ __forceinline__ void store(uint8_t* ptr) const { *reinterpret_cast<Fp8Vec*>(ptr) = *this; }
};

// Round to nearest even, saturated to the largest finite value (FlashInfer's and torch's rounding;
// torch's own cast overflows instead, which in-range values never reach). NaN stays NaN.
template <bool E5M2>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3));
}

// One of four pointers by the row's kind, with constant indices (a run-time index into the
// kernel's parameter struct would copy it to local memory).
template <typename P>
__device__ __forceinline__ P pick(const P (&a)[4], bool rope, bool is_q) {
  return rope ? (is_q ? a[kQRope] : a[kKRope]) : (is_q ? a[kQNope] : a[kKNope]);
}
__device__ __forceinline__ int64_t pick_stride(const int64_t (&s)[8], int base, bool rope, bool is_q) {
  return rope ? (is_q ? s[base + kQRope] : s[base + kKRope]) : (is_q ? s[base + kQNope] : s[base + kKNope]);
}

template <typename T, bool E5M2, int VEC, bool INTERLEAVE>
__global__ void __launch_bounds__(kThreads) rope_quantize_kernel(const RopeQuantParams p) {
  using V = Vec<T, VEC>;
  extern __shared__ float staged[];  // cos[rope_dim / 2], then sin[rope_dim / 2]
  const int64_t half = p.rope_dim / 2;
  float* cos_s = staged;
  float* sin_s = staged + half;
  constexpr int W = VEC < 2 ? 2 : VEC;
  const int64_t rope_units = INTERLEAVE ? p.rope_dim / W : half / VEC;
  const int64_t nope_units = p.nope_dim / VEC;
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t rope_work = heads * rope_units;
  const int64_t work = rope_work + heads * nope_units;
  pdl_wait();  // the positions, the cache and q/k may be the previous kernel's outputs

  for (int64_t t = blockIdx.x; t < p.nnz; t += gridDim.x) {
    int64_t pos = 0;
    // Every thread reads the same position, so the branch is uniform across the block.
    if (!token_position(p.at, t, p.nnz, p.errors, &pos)) continue;
    for (int64_t i = threadIdx.x; i < half; i += kThreads) cos_sin(p.at, p.rope_dim, pos, i, &cos_s[i], &sin_s[i]);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < work; idx += kThreads) {
      const bool rope = idx < rope_work;
      const int64_t r = rope ? idx : idx - rope_work;
      const int64_t units = rope ? rope_units : nope_units;
      const int64_t row = r / units, u = r % units;
      const bool is_q = row < p.q_heads;
      const int64_t h = is_q ? row : row - p.q_heads;
      const float scale = is_q ? p.scale_q : p.scale_kv;
      const T* src = static_cast<const T*>(pick(p.in, rope, is_q)) + t * pick_stride(p.stride_n, 0, rope, is_q) +
                     h * pick_stride(p.stride_h, 0, rope, is_q);
      uint8_t* dst = static_cast<uint8_t*>(pick(p.out, rope, is_q)) + t * pick_stride(p.stride_n, 4, rope, is_q) +
                     h * pick_stride(p.stride_h, 4, rope, is_q);
      if (!rope) {
        const int64_t j = u * VEC;
        const V v = V::load(src + j);
        Fp8Vec<VEC> o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.b[e] = to_fp8<E5M2>(v.get(e) * scale);
        o.store(dst + j);
        continue;
      }
      if constexpr (!INTERLEAVE) {
        const int64_t j = u * VEC;
        const V a = V::load(src + j), b = V::load(src + half + j);
        Fp8Vec<VEC> oa, ob;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float x1 = a.get(e), x2 = b.get(e), c = cos_s[j + e], s = sin_s[j + e];
          oa.b[e] = to_fp8<E5M2>((x1 * c - x2 * s) * scale);
          ob.b[e] = to_fp8<E5M2>((x2 * c + x1 * s) * scale);
        }
        oa.store(dst + j);
        ob.store(dst + half + j);
      } else {
        const int64_t j = u * W;
        V v[W / VEC];
#pragma unroll
        for (int e = 0; e < W / VEC; ++e) v[e] = V::load(src + j + e * VEC);
        Fp8Vec<VEC> o[W / VEC];
#pragma unroll
        for (int e = 0; e < W; e += 2) {
          const float x1 = v[e / VEC].get(e % VEC), x2 = v[(e + 1) / VEC].get((e + 1) % VEC);
          const float c = cos_s[(j + e) / 2], s = sin_s[(j + e) / 2];
          o[e / VEC].b[e % VEC] = to_fp8<E5M2>((x1 * c - x2 * s) * scale);
          o[(e + 1) / VEC].b[(e + 1) % VEC] = to_fp8<E5M2>((x2 * c + x1 * s) * scale);
        }
#pragma unroll
        for (int e = 0; e < W / VEC; ++e) o[e].store(dst + j + e * VEC);
      }
    }
    __syncthreads();  // the staged cos/sin are rewritten for the next token
  }
  pdl_launch_dependents();
}

// The widest vector (<= 16 bytes of input) that the rotary split, nope_dim, every stride and
// pointer allow; the fp8 side stores VEC bytes.
template <typename T>
int choose_quant_vec(const RopeQuantParams& p) {
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    const int64_t split = p.interleave ? p.rope_dim : p.rope_dim / 2;
    bool ok = split % vec == 0 && p.nope_dim % vec == 0;
    for (int i = 0; i < 8; ++i) ok = ok && p.stride_n[i] % vec == 0 && p.stride_h[i] % vec == 0;
    for (int i = 0; i < 4; ++i) ok = ok && aligned(p.in[i], vec * int64_t(sizeof(T))) && aligned(p.out[i], vec);
    if (ok) return vec;
  }
  return 1;
}

template <typename T>
Status launch_quantize(const RopeQuantParams& p, LaunchContext ctx) {
  if (p.nnz == 0 || p.q_heads + p.k_heads == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const int vec = choose_quant_vec<T>(p);
  const int64_t blocks = std::min<int64_t>(p.nnz, int64_t(sm_count()) * kQuantBlocksPerSm);
  const size_t smem = size_t(p.rope_dim) * sizeof(float);
  cudaError_t err = cudaSuccess;
  auto with_vec = [&](auto kVec) {
    constexpr int VEC = decltype(kVec)::value;
    void (*kernel)(const RopeQuantParams) = nullptr;
    if (p.interleave) {
      kernel = p.e5m2 ? rope_quantize_kernel<T, true, VEC, true> : rope_quantize_kernel<T, false, VEC, true>;
    } else {
      kernel = p.e5m2 ? rope_quantize_kernel<T, true, VEC, false> : rope_quantize_kernel<T, false, VEC, false>;
    }
    err = kiln::launch(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, ctx, p);
  };
  if (!dispatch_value<1, 2, 4, 8>(vec, with_vec)) {
    return Status::Error(1, "rope_quantize: no kernel for vec=" + std::to_string(vec) +
                                " (allowed: " + allowed_values<1, 2, 4, 8>() + ")");
  }
  return cuda_status(err, "rope_quantize kernel launch");
}

}  // namespace kiln::rope
