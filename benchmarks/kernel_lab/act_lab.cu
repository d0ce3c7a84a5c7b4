// Gated-activation variants side by side on one GPU: what limits act_and_mul at prefill sizes.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. benchmarks/kernel_lab/act_lab.cu \
//        -o /tmp/act_lab && /tmp/act_lab [rows] [d]
//
// Each variant runs on the same bf16 input (rows x 2d, random in [-8, 8)), into an output poisoned
// with NaN first; every element of 64 sampled rows is checked against a float64 reference of the
// activation (silu, gelu tanh form) before it is timed. Timing: CUDA events around 20 back-to-back
// launches, 7 repetitions, median and min; TB/s counts the bytes read (2d) and written (d) per row.
// The variants differ in one thing each from the one before:
//   capacc   the kernel before 2026-12-04: accurate expf / erfcf / IEEE division, the 2-D grid
//            capped at 8 blocks of 256 per SM (rows looped by blockIdx.y), one 16-byte vector of
//            each half per thread and row
//   fast     the same with the fast math of activation.h (__expf, __fdividef, gelu's erfc fit;
//            gelu_tanh as x * sigmoid(2u) in both)
//   unroll2  fast, two vectors of each half loaded before the first is used
//   rowgrid  fast, FlashInfer's shape: one block per row, min(d / 8, 1024) threads
//   wide2d   fast, the 2-D grid uncapped: one vector per thread, a block per 256 vectors of a row
//   wide512  the same with 512 threads a block
//   wideacc  accurate math in the uncapped 2-D grid
//   rowacc   accurate math in FlashInfer's shape (is it the grid or the math?)
//   mul      a * b only (no activation), capped grid: the memory floor of that access pattern
//   kiln     ops/activation/activation.cuh as shipped (since 2026-12-04: wide2d)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops/activation/activation.cuh"

using namespace kiln;
using namespace kiln::activation;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

enum class Math { kAccurate, kFast, kMulOnly };

template <Act A, Math M>
__device__ __forceinline__ float act(float x) {
  if constexpr (M == Math::kMulOnly) {
    return x;
  } else {
    return apply<A, M == Math::kFast>(x);
  }
}

constexpr int kVec = 8;
using V = Vec<bf16_t, kVec>;

template <Act A, Math M, int U, int TPB = 256>
__global__ void __launch_bounds__(TPB)
    capped_kernel(bf16_t* __restrict__ out, const bf16_t* __restrict__ in, int64_t rows, int64_t d) {
  const int64_t nvec = d / kVec;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const bf16_t* x = in + row * 2 * d;
    bf16_t* o = out + row * d;
    const int64_t step = int64_t(gridDim.x) * TPB;
    for (int64_t j = int64_t(blockIdx.x) * TPB + threadIdx.x; j < nvec; j += U * step) {
      V a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (j + u * step < nvec) {
          a[u] = V::load(x + (j + u * step) * kVec);
          b[u] = V::load(x + d + (j + u * step) * kVec);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (j + u * step < nvec) {
          V r;
#pragma unroll
          for (int k = 0; k < kVec; ++k) r.set(k, act<A, M>(a[u].get(k)) * b[u].get(k));
          r.store(o + (j + u * step) * kVec);
        }
      }
    }
  }
}

template <Act A, Math M>
__global__ void __launch_bounds__(1024) row_kernel(bf16_t* __restrict__ out, const bf16_t* __restrict__ in, int64_t d) {
  const bf16_t* x = in + int64_t(blockIdx.x) * 2 * d;
  bf16_t* o = out + int64_t(blockIdx.x) * d;
  for (int64_t j = threadIdx.x; j < d / kVec; j += blockDim.x) {
    const V a = V::load(x + j * kVec);
    const V b = V::load(x + d + j * kVec);
    V r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.set(k, act<A, M>(a.get(k)) * b.get(k));
    r.store(o + j * kVec);
  }
}

__global__ void fill_random(bf16_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = uint64_t(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    x[i] = Convert<bf16_t>::from_float((float(h & 0xFFFFFF) / 16777216.0f) * 16.0f - 8.0f);
  }
}

static double ref_act(Act a, double x) {
  if (a == Act::kSilu) return x / (1.0 + std::exp(-x));
  if (a == Act::kGelu) return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Problem {
  int64_t rows, d;
  bf16_t *in, *out;
  std::vector<uint16_t> host_in;  // the sampled rows only
  std::vector<int64_t> sample;
};

// Every element of the sampled rows within one bf16 rounding (plus the float32 product) of the
// float64 reference; false otherwise (mul: a * b).
static bool check(const Problem& p, Act a, bool mul_only, const char* name) {
  std::vector<uint16_t> row(p.d);
  int64_t bad = 0;
  double worst = 0;
  for (size_t s = 0; s < p.sample.size(); ++s) {
    CK(cudaMemcpy(row.data(), p.out + p.sample[s] * p.d, p.d * 2, cudaMemcpyDeviceToHost));
    const uint16_t* x = p.host_in.data() + s * 2 * p.d;
    for (int64_t j = 0; j < p.d; ++j) {
      const double xa = bf16_to_float(x[j]), xb = bf16_to_float(x[p.d + j]);
      const double ref = (mul_only ? xa : ref_act(a, xa)) * xb;
      const double got = bf16_to_float(row[j]);
      const double err = std::fabs(got - ref);
      const double tol = std::fabs(ref) * (1.0 / 256 + 1e-5) + 1e-6;
      if (!(err <= tol)) ++bad;  // NaN (the poison) fails too
      worst = std::max(worst, err / (std::fabs(ref) + 1e-6));
    }
  }
  if (bad)
    std::printf("  %-8s FAILED: %lld of %lld elements off (worst rel %.3g)\n", name, (long long)bad,
                (long long)(p.sample.size() * p.d), worst);
  return bad == 0;
}

template <typename Launch>
static void time_variant(const Problem& p, const char* act_name, const char* name, Act a, bool mul_only,
                         Launch launch) {
  CK(cudaMemset(p.out, 0xFF, p.rows * p.d * 2));  // NaN
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const bool ok = check(p, a, mul_only, name);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  constexpr int kIters = 20, kReps = 7;
  std::vector<float> us;
  for (int r = 0; r < kReps; ++r) {
    CK(cudaEventRecord(e0));
    for (int i = 0; i < kIters; ++i) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1e3f / kIters);
  }
  CK(cudaGetLastError());
  std::sort(us.begin(), us.end());
  const double bytes = double(p.rows) * p.d * 3 * 2;
  std::printf("%-10s %-8s rows %6lld d %6lld  median %8.2f us  min %8.2f  max %8.2f  %5.2f TB/s  check %s\n", act_name,
              name, (long long)p.rows, (long long)p.d, us[kReps / 2], us[0], us[kReps - 1],
              bytes / (us[kReps / 2] * 1e-6) / 1e12, ok ? "passed" : "FAILED");
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

template <Act A>
static void run_act(const Problem& p, const char* act_name) {
  const int64_t nvec = p.d / kVec;
  const int64_t target = int64_t(sm_count()) * 8;
  const int64_t gx = std::min<int64_t>(ceil_div<int64_t>(nvec, 256), target);
  const int64_t gy = std::min<int64_t>({p.rows, 65535, std::max<int64_t>(1, target / gx)});
  const dim3 grid{unsigned(gx), unsigned(gy)};
  const unsigned row_threads = unsigned(std::min<int64_t>(nvec, 1024));
  ActParams params{p.out, p.in, p.rows, p.d, 2 * p.d, p.d, A};
  time_variant(p, act_name, "capacc", A, false,
               [&] { capped_kernel<A, Math::kAccurate, 1><<<grid, 256>>>(p.out, p.in, p.rows, p.d); });
  time_variant(p, act_name, "fast", A, false,
               [&] { capped_kernel<A, Math::kFast, 1><<<grid, 256>>>(p.out, p.in, p.rows, p.d); });
  time_variant(p, act_name, "unroll2", A, false,
               [&] { capped_kernel<A, Math::kFast, 2><<<grid, 256>>>(p.out, p.in, p.rows, p.d); });
  const dim3 wide{unsigned(ceil_div<int64_t>(nvec, 256)), unsigned(std::min<int64_t>(p.rows, 65535))};
  time_variant(p, act_name, "wide2d", A, false,
               [&] { capped_kernel<A, Math::kFast, 1><<<wide, 256>>>(p.out, p.in, p.rows, p.d); });
  const dim3 wide512{unsigned(ceil_div<int64_t>(nvec, 512)), unsigned(std::min<int64_t>(p.rows, 65535))};
  time_variant(p, act_name, "wide512", A, false,
               [&] { capped_kernel<A, Math::kFast, 1, 512><<<wide512, 512>>>(p.out, p.in, p.rows, p.d); });
  time_variant(p, act_name, "wideacc", A, false,
               [&] { capped_kernel<A, Math::kAccurate, 1><<<wide, 256>>>(p.out, p.in, p.rows, p.d); });
  time_variant(p, act_name, "rowgrid", A, false,
               [&] { row_kernel<A, Math::kFast><<<unsigned(p.rows), row_threads>>>(p.out, p.in, p.d); });
  time_variant(p, act_name, "rowacc", A, false,
               [&] { row_kernel<A, Math::kAccurate><<<unsigned(p.rows), row_threads>>>(p.out, p.in, p.d); });
  time_variant(p, act_name, "mul", A, true,
               [&] { capped_kernel<A, Math::kMulOnly, 1><<<grid, 256>>>(p.out, p.in, p.rows, p.d); });
  time_variant(p, act_name, "kiln", A, false, [&] { (void)launch_act_and_mul<bf16_t>(params, LaunchContext{}); });
}

int main(int argc, char** argv) {
  Problem p;
  p.rows = argc > 1 ? std::atoll(argv[1]) : 8192;
  p.d = argc > 2 ? std::atoll(argv[2]) : 14336;
  CK(cudaMalloc(&p.in, p.rows * 2 * p.d * 2));
  CK(cudaMalloc(&p.out, p.rows * p.d * 2));
  fill_random<<<1024, 256>>>(p.in, p.rows * 2 * p.d);
  CK(cudaDeviceSynchronize());
  for (int s = 0; s < 64; ++s) p.sample.push_back((s * 7919) % p.rows);
  p.host_in.resize(p.sample.size() * 2 * p.d);
  for (size_t s = 0; s < p.sample.size(); ++s)
    CK(cudaMemcpy(p.host_in.data() + s * 2 * p.d, p.in + p.sample[s] * 2 * p.d, p.d * 4, cudaMemcpyDeviceToHost));
  run_act<Act::kSilu>(p, "silu");
  run_act<Act::kGeluTanh>(p, "gelu_tanh");
  run_act<Act::kGelu>(p, "gelu");
  CK(cudaFree(p.in));
  CK(cudaFree(p.out));
  return 0;
}
