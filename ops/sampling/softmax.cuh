// softmax's own CUDA kernel: one row per thread-block cluster, read from memory once.
//
// The row kernel (sampling.cuh) gives a row one CTA and reads it three times (max, sum, write): a
// single CTA is latency-bound on a 128256-entry row, and a batch of many rows re-reads them from
// memory once they no longer fit in L2. Here a cluster of C CTAs (C = 1..8, sm90+) splits the row
// into C chunks; each CTA copies its chunk into shared memory in one streaming pass (its max taken
// on the way), the CTAs exchange their maxima and then their sums through distributed shared
// memory, and each writes its chunk's probabilities from shared memory. One read and one write of
// the row reach memory, and a small batch still spreads over the SMs (C grows as the batch shrinks).
//
// The arithmetic is the row kernel's softmax_numerator and `e / z`, so the special cases (NaN and
// -inf weigh 0, +inf rows, temperature <= 0 picks the maxima) are the same. Rows whose chunk does
// not fit in shared memory at C = 8, devices or binaries below sm90, and a cluster the device cannot
// schedule go to the row kernel.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/cuda_utils.cuh"
#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/common/reduce.cuh"
#include "ops/common/vec.cuh"
#include "ops/sampling/sampling.h"

namespace kiln::sampling {

constexpr int kSoftmaxThreads = 512;
constexpr int kSoftmaxMaxCluster = 8;          // the portable cluster size
constexpr int kSoftmaxSmemMax = 192 * 1024;    // a chunk's bytes, at most (one CTA per SM)
constexpr int kSoftmaxSmemShared = 96 * 1024;  // a chunk this small leaves room for two CTAs
constexpr int kSoftmaxWarps = kSoftmaxThreads / 32;
constexpr int kSoftmaxUnroll = 4;  // 16-byte loads in flight per thread

struct SoftmaxShared {
  float warp[kSoftmaxWarps];
  float part[2];  // this CTA's max and sum, read by the cluster's other CTAs
  float total;
};

// The cluster's max (slot 0) or sum (slot 1) of each CTA's `v`, in every thread. The CTAs are
// combined in rank order, so every CTA computes the same bits.
template <int Slot>
__device__ __forceinline__ float softmax_cluster_reduce(float v, SoftmaxShared& s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  v = kiln::block_reduce<Slot == 0>(v, s.warp);
  if (threadIdx.x == 0) s.part[Slot] = v;
  cluster.sync();  // every CTA's part is written
  if (threadIdx.x == 0) {
    float r = Slot == 0 ? -INFINITY : 0.0f;
    for (unsigned c = 0; c < cluster.num_blocks(); ++c) {
      const float w = *cluster.map_shared_rank(&s.part[Slot], c);
      r = Slot == 0 ? fmaxf(r, w) : r + w;
    }
    s.total = r;
  }
  __syncthreads();
  return s.total;
#else
  return v;
#endif
}

// One row per cluster of gridDim.x / rows CTAs; CTA `rank` holds entries [rank * chunk, ...).
template <typename T>
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_cluster_kernel(const RowParams p, int64_t chunk, bool out_vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int V = 16 / int(sizeof(T));
  using Vt = Vec<T, V>;
  extern __shared__ __align__(16) unsigned char softmax_smem[];
  T* held = reinterpret_cast<T*>(softmax_smem);
  __shared__ SoftmaxShared s;

  cg::cluster_group cluster = cg::this_cluster();
  const int64_t r = int64_t(blockIdx.x) / cluster.num_blocks();
  const int64_t lo = int64_t(cluster.block_rank()) * chunk;
  const int64_t left = p.vocab - lo;
  const int64_t n = left < 0 ? 0 : (left < chunk ? left : chunk);
  const int64_t src = row_index(p, r);
  if (src < 0 || src >= p.rows_in) {  // the whole cluster takes the same branch
    if (threadIdx.x == 0 && cluster.block_rank() == 0)
      record_error(p.errors, ErrorCode::kSamplingIndex, r, src, p.rows_in);
    return;
  }
  const T* x = static_cast<const T*>(p.input) + src * p.in_stride + lo;
  float* out = static_cast<float*>(p.out) + r * p.out_stride + lo;
  const float temperature = row_temperature(p, r);

  // The chunk into shared memory, its max on the way: 16-byte vectors where the row is aligned
  // (lo is a multiple of V), single elements for the rest.
  float local = -INFINITY;
  const int64_t nv = p.vec16 ? n / V : 0;
  for (int64_t j0 = threadIdx.x; j0 < nv; j0 += int64_t(kSoftmaxThreads) * kSoftmaxUnroll) {
    Vt a[kSoftmaxUnroll];
#pragma unroll
    for (int u = 0; u < kSoftmaxUnroll; ++u) {
      const int64_t j = j0 + int64_t(u) * kSoftmaxThreads;
      if (j < nv) a[u] = Vt::load_ro(x + j * V);
    }
#pragma unroll
    for (int u = 0; u < kSoftmaxUnroll; ++u) {
      const int64_t j = j0 + int64_t(u) * kSoftmaxThreads;
      if (j >= nv) continue;
      reinterpret_cast<Vt*>(held)[j] = a[u];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float v = a[u].get(e);
        if (valid_value(v, true)) local = fmaxf(local, v);
      }
    }
  }
  for (int64_t i = nv * V + threadIdx.x; i < n; i += kSoftmaxThreads) {
    held[i] = x[i];
    const float v = Convert<T>::to_float(x[i]);
    if (valid_value(v, true)) local = fmaxf(local, v);
  }
  __syncthreads();
  const float vmax = softmax_cluster_reduce<0>(local, s);

  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kSoftmaxThreads) {
    sum += softmax_numerator(Convert<T>::to_float(held[i]), vmax, temperature);
  }
  const float z = softmax_cluster_reduce<1>(sum, s);

  if (out_vec) {  // 16-byte stores of four probabilities (the chunk starts at a multiple of 4)
    const int64_t nq = n / 4;
    for (int64_t j = threadIdx.x; j < nq; j += kSoftmaxThreads) {
      const Vec<T, 4> h = *reinterpret_cast<const Vec<T, 4>*>(held + j * 4);
      Vec<float, 4> q;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float num = softmax_numerator(h.get(e), vmax, temperature);
        q.v[e] = z > 0.0f ? num / z : 0.0f;
      }
      q.store(out + j * 4);
    }
    for (int64_t i = nq * 4 + threadIdx.x; i < n; i += kSoftmaxThreads) {
      const float num = softmax_numerator(Convert<T>::to_float(held[i]), vmax, temperature);
      out[i] = z > 0.0f ? num / z : 0.0f;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kSoftmaxThreads) {
      const float num = softmax_numerator(Convert<T>::to_float(held[i]), vmax, temperature);
      out[i] = z > 0.0f ? num / z : 0.0f;
    }
  }
  cluster.sync();  // no CTA leaves while another may still read its part
#endif
}

// The cluster shape for a softmax over `rows` rows of `vocab` entries of T: C CTAs of `chunk`
// entries each (a multiple of the vector width), or C = 0 when no C <= 8 fits shared memory.
struct SoftmaxShape {
  int cluster = 0;
  int64_t chunk = 0;
};

inline SoftmaxShape softmax_shape(int64_t rows, int64_t vocab, int elem_bytes, int sms) {
  const int64_t v = 16 / elem_bytes;
  auto chunk_of = [&](int c) { return (vocab + c * v - 1) / (c * v) * v; };
  int c = 1;
  // the fewest CTAs whose chunk leaves room for two per SM, else for one
  while (c < kSoftmaxMaxCluster && chunk_of(c) * elem_bytes > kSoftmaxSmemShared) c *= 2;
  if (chunk_of(c) * elem_bytes > kSoftmaxSmemMax) return {};
  // then more, while the batch leaves SMs idle (two CTAs per SM)
  while (c < kSoftmaxMaxCluster && rows * c < 2 * int64_t(sms) && chunk_of(2 * c) >= kSoftmaxThreads * v) c *= 2;
  return {c, chunk_of(c)};
}

// Whether this device, and the module's binary for it, run the cluster kernel (asked once per device).
template <typename T>
bool softmax_clusters_supported(int device) {
  constexpr int kMaxDevices = 64;
  static int known[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= kMaxDevices) return false;
  if (known[device] == 0) {
    int major = 0;
    cudaFuncAttributes attrs{};
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 &&
        cudaFuncGetAttributes(&attrs, softmax_cluster_kernel<T>) == cudaSuccess && attrs.binaryVersion >= 90 &&
        cudaFuncSetAttribute(softmax_cluster_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSmemMax) ==
            cudaSuccess;
    (void)cudaGetLastError();  // a refusal above is an answer, not the caller's error
    known[device] = ok ? 1 : 2;
  }
  return known[device] == 1;
}

// Launches the cluster kernel for `q` (vec16 set) when it applies; false: the caller runs the row
// kernel instead (nothing was launched).
template <typename T>
bool launch_softmax_clusters(const RowParams& q, cudaStream_t stream) {
  int device = 0;
  cudaGetDevice(&device);
  if (q.output != Output::kSoftmax || !q.logits || !softmax_clusters_supported<T>(device)) return false;
  const SoftmaxShape shape = softmax_shape(q.rows, q.vocab, int(sizeof(T)), sm_count());
  if (shape.cluster == 0 || q.rows > int64_t(INT32_MAX) / shape.cluster) return false;
  const bool out_vec = reinterpret_cast<uintptr_t>(q.out) % 16 == 0 && (q.out_stride * 4) % 16 == 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(q.rows * shape.cluster));
  cfg.blockDim = dim3(kSoftmaxThreads);
  cfg.dynamicSmemBytes = size_t(shape.chunk) * sizeof(T);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(shape.cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, softmax_cluster_kernel<T>, q, shape.chunk, out_vec) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. a cluster this device cannot schedule: the row kernel runs
    return false;
  }
  return true;
}

}  // namespace kiln::sampling
