// Framework-free self-test and benchmark of //ops/gemm (ops/gemm/gemm.h): every kernel and tactic
// on a grid of shapes (odd m/n/k 1, 7, 127, 1000, 4097, both B layouts, padded and tight strides,
// batched, fp8 per-tensor and groupwise, grouped with empty and one-row segments) against a
// reference with float32 (double for the final sum) accumulation on fresh random inputs, outputs
// poisoned (NaN bit patterns) before every run and checked element by element, padding columns and
// rows outside every segment checked to stay poisoned; then the issue's shapes timed against
// cuBLAS / cuBLASLt (CUDA events, median of 20 after warm-up, L2 flushed before every run).
//
// Build (repository root; the cuBLAS headers from the nvidia-cublas wheel or the toolkit; cuBLAS
// itself is loaded at run time with dlopen, so the binary needs no libcublas to start):
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -I$CUBLAS_INC \
//        tests/cuda/gemm_selftest.cu tests/cuda/gemm_selftest_kernels.cu ops/gemm/gemm_device.cu \
//        ops/gemm/gemm_tactics.cc -o gemm_selftest -ldl
//
// (gemm_selftest_kernels.cu holds every dtype's kernels, where a kiln module holds one.)
//
// (-gencode=arch=compute_80,code=sm_80 instead builds the sm80 kernels alone.) Run:
//   gemm_selftest check            correctness grid (exit 1 on any failure)
//   gemm_selftest quick            a few small shapes of it (for compute-sanitizer)
//   gemm_selftest bench [csv]      issue shapes, kiln vs cuBLAS, a table on stdout (and csv rows)
//   gemm_selftest all [csv]
//   gemm_selftest profile          a few launches for ncu
// cuBLAS: libcublas.so.13 / libcublasLt.so.13 on LD_LIBRARY_PATH (skipped with a note if absent).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/gemm/gemm.h"
#include "tests/cuda/cuda_check.h"

// A CUTLASS 3.x sm90 GEMM (tests/cuda/gemm_cutlass_probe.cu built with -DCUTLASS_PROBE_LIB), timed
// as a peer when linked in; null otherwise.
extern "C" int cutlass_probe_gemm(int m, int n, int k, const void* a, const void* b, void* d, cudaStream_t stream)
    __attribute__((weak));

using namespace kiln;
using namespace kiln::gemm;

namespace {

// ---- plumbing ----------------------------------------------------------------------------------

// A hang (a barrier protocol bug) must not eat the device budget: the watchdog ends the process
// when a phase runs past its deadline, naming the case.
std::atomic<int64_t> g_deadline{0};
char g_case[256] = "start";
int64_t now_ns();
void watchdog() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int64_t d = g_deadline.load();
    if (d > 0 && now_ns() > d) {
      std::fprintf(stdout, "\nTIMEOUT (hang?) in case: %s\n", g_case);
      std::fflush(stdout);
      std::_Exit(3);
    }
  }
}
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
void arm(double seconds, const std::string& what) {
  std::snprintf(g_case, sizeof g_case, "%s", what.c_str());
  g_deadline = now_ns() + int64_t(seconds * 1e9);
}

int64_t elem_bytes(DType t) {
  return dtype_bytes(t);
}

struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t b) {
    if (b <= bytes) return;
    if (p) CK(cudaFree(p));
    CK(cudaMalloc(&p, b));
    bytes = b;
  }
  ~Buf() {
    if (p) cudaFree(p);
  }
};

// ---- device helpers: random fill, poison, reference, compare -----------------------------------

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Uniform in [-scale, scale), stored in dtype t; fp8 values drawn on the e4m3/e5m2 grid.
__global__ void fill_kernel(void* p, int64_t n, DType t, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = (hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 16777216.0f);
    const float v = (2.0f * u - 1.0f) * scale;
    switch (t) {
      case DType::kBF16:
        static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
        break;
      case DType::kF16:
        static_cast<__half*>(p)[i] = __float2half(v);
        break;
      case DType::kF32:
        static_cast<float*>(p)[i] = v;
        break;
      case DType::kE4M3:
        static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(v);
        break;
      case DType::kE5M2:
        static_cast<__nv_fp8_e5m2*>(p)[i] = __nv_fp8_e5m2(v);
        break;
    }
  }
}

// Positive scales: lo * (hi / lo)^u (realistic per-block quantisation scales).
__global__ void fill_scale_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = (hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 16777216.0f);
    p[i] = lo * powf(hi / lo, u);
  }
}

void fill(void* p, int64_t n, DType t, uint64_t seed, float scale = 1.0f) {
  if (n <= 0) return;
  fill_kernel<<<1024, 256>>>(p, n, t, seed, scale);
  CK(cudaGetLastError());
}

__device__ __forceinline__ float load_f(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kE4M3:
      return float(static_cast<const __nv_fp8_e4m3*>(p)[i]);
    case DType::kE5M2:
      return float(static_cast<const __nv_fp8_e5m2*>(p)[i]);
  }
  return 0.0f;
}

// Reference: one thread per output, float sums over each 128-wide k block, added in double (with
// the groupwise scales of the block). Grouped problems give seg_lo/seg_hi/seg_w per segment;
// rows in no segment get NaN ("must stay poisoned").
struct RefArgs {
  GemmParams p;
  int64_t num_seg;
  const int64_t *seg_lo, *seg_hi, *seg_w;
  int64_t b_weight_stride;
};

__global__ void ref_kernel(RefArgs r, float* ref) {
  const GemmParams& p = r.p;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t i = blockIdx.y * int64_t(blockDim.y) + threadIdx.y;
  const int64_t z = blockIdx.z;
  if (i >= p.m || j >= p.n) return;
  int64_t a_off = z * p.a_batch_stride, b_off = z * p.b_batch_stride;
  if (r.num_seg > 0) {
    int64_t w = -1;
    for (int64_t s = 0; s < r.num_seg; ++s)
      if (i >= r.seg_lo[s] && i < r.seg_hi[s]) w = r.seg_w[s];
    if (w < 0) {
      ref[i * p.n + j] = __int_as_float(0x7fc00000);
      return;
    }
    b_off = w * r.b_weight_stride;
  }
  double total = 0.0;
  for (int64_t k0 = 0; k0 < p.k; k0 += 128) {
    float part = 0.0f;
    const int64_t k1 = k0 + 128 < p.k ? k0 + 128 : p.k;
    for (int64_t k = k0; k < k1; ++k) {
      const float av = load_f(p.a, p.a_dtype, a_off + i * p.lda + k);
      const float bv = load_f(p.b, p.b_dtype, b_off + (p.b_layout == BLayout::kKMajor ? j * p.ldb + k : k * p.ldb + j));
      part = fmaf(av, bv, part);
    }
    double s = 1.0;
    if (p.scale_mode == ScaleMode::kGroupwise) {
      s = double(p.a_scale[i * p.a_scale_stride_m + (k0 / 128) * p.a_scale_stride_k]) *
          p.b_scale[(j / 128) * p.b_scale_stride_n + (k0 / 128) * p.b_scale_stride_k];
    }
    total += double(part) * s;
  }
  if (p.scale_mode == ScaleMode::kPerTensor) total *= double(p.a_scale[0]) * p.b_scale[0];
  ref[(z * p.m + i) * p.n + j] = float(total);
}

struct Stats {
  unsigned long long bad, nan, poison_broken, count;
  unsigned int max_err_bits;
  long long worst;
  double sq_err, sq_ref;
};

__global__ void sumsq_kernel(const float* ref, int64_t n, double* out) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = ref[i];
    if (!isnan(v)) s += double(v) * v;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) atomicAdd(out, s);
}

// Every element of out's rows (ldo columns, batch strides o_bs = m * ldo) against ref
// [batch][m][n]: columns >= n and rows whose ref is NaN must still hold the poison bit pattern
// (all ones). Per-thread sums, one atomic per warp.
__global__ void compare_kernel(const void* out, DType t, int64_t ldo, const float* ref, int64_t m, int64_t n,
                               int64_t batch, float atol, float rtol, Stats* st) {
  const int64_t total = batch * m * ldo;
  const int64_t eb = t == DType::kF32 ? 4 : 2;
  unsigned long long bad = 0, nan = 0, broken = 0, count = 0;
  double sq_err = 0, sq_ref = 0;
  float max_err = 0;
  long long worst = -1;
  for (int64_t at = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; at < total; at += int64_t(gridDim.x) * blockDim.x) {
    const int64_t z = at / (m * ldo), rem = at % (m * ldo), i = rem / ldo, j = rem % ldo;
    const uint8_t* raw = static_cast<const uint8_t*>(out) + at * eb;
    bool poisoned = true;
    for (int b = 0; b < eb; ++b) poisoned = poisoned && raw[b] == 0xff;
    const float r = j < n ? ref[(z * m + i) * n + j] : __int_as_float(0x7fc00000);
    if (isnan(r)) {
      broken += poisoned ? 0 : 1;
      continue;
    }
    const float g = load_f(out, t, at);
    ++count;
    if (isnan(g)) {
      ++nan, ++bad;
      continue;
    }
    const float e = fabsf(g - r);
    if (e > atol + rtol * fabsf(r)) ++bad;
    if (e > max_err) max_err = e, worst = (long long)((z * m + i) * n + j);
    sq_err += double(e) * e;
    sq_ref += double(r) * r;
  }
  for (int o = 16; o > 0; o >>= 1) {
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    nan += __shfl_xor_sync(0xffffffffu, nan, o);
    broken += __shfl_xor_sync(0xffffffffu, broken, o);
    count += __shfl_xor_sync(0xffffffffu, count, o);
    sq_err += __shfl_xor_sync(0xffffffffu, sq_err, o);
    sq_ref += __shfl_xor_sync(0xffffffffu, sq_ref, o);
    const float me = __shfl_xor_sync(0xffffffffu, max_err, o);
    const long long wi = __shfl_xor_sync(0xffffffffu, worst, o);
    if (me > max_err) max_err = me, worst = wi;
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&st->bad, bad), atomicAdd(&st->nan, nan), atomicAdd(&st->poison_broken, broken);
    atomicAdd(&st->count, count), atomicAdd(&st->sq_err, sq_err), atomicAdd(&st->sq_ref, sq_ref);
    const unsigned bits = __float_as_uint(max_err);
    if (atomicMax(&st->max_err_bits, bits) < bits) st->worst = worst;
  }
}

struct Check {
  bool ok;
  double max_err, rel_fro, rms;
  unsigned long long bad, nan, poison;
  long long worst;
  std::string text() const {
    char b[256];
    std::snprintf(b, sizeof b, "max|d| %.2e (rms %.2e) rel %.1e bad %llu NaN %llu poison %llu worst %lld", max_err, rms,
                  rel_fro, bad, nan, poison, worst);
    return b;
  }
};

struct Tolerance {
  float atol_rms, rtol;
  double rel_fro;  // bound on ||out - ref|| / ||ref||
};
// Per element |out - ref| <= atol_rms * rms(ref) + rtol * |ref|, and the relative Frobenius error.
// Output rounding: bf16 2^-8 relative, f16 2^-11, f32 none; float32 accumulation adds ~1e-6 rms.
// fp8 per-tensor on sm90 accumulates in the tensor core's fp8 adder with no promotion to float32
// (as cuBLASLt's and CUTLASS's "fast accumulation"): measured on the H200 against the exact sum,
// max |d| up to 5.6 % of rms and ||d|| / ||ref|| 2.0e-3 (k 4096) to 3.1e-3 (k 14336); the bound is
// twice that. Groupwise promotes every 128-wide k block (measured max |d| under 1 % of rms).
Tolerance tolerance_for(DType out, bool fp8, bool fast_accum = false) {
  Tolerance t{1e-3f,
              out == DType::kBF16  ? 1.0f / 128
              : out == DType::kF16 ? 1.0f / 512
                                   : 1e-4f,
              out == DType::kBF16  ? 8e-3
              : out == DType::kF16 ? 2e-3
                                   : 1e-4};
  if (fp8) t.atol_rms = 1e-2f;
  if (fast_accum) t.atol_rms = 0.12f, t.rel_fro = 6e-3;
  return t;
}

Check compare(const void* out, DType t, int64_t ldo, int64_t o_bs, const float* ref, int64_t m, int64_t n,
              int64_t batch, Tolerance tol) {
  if (batch > 1 && o_bs != m * ldo) std::printf("compare: batch stride must be m * ldo\n"), std::exit(2);
  static double* d_sq = nullptr;
  static Stats* d_st = nullptr;
  if (!d_sq) {
    CK(cudaMalloc(&d_sq, sizeof(double)));
    CK(cudaMalloc(&d_st, sizeof(Stats)));
  }
  CK(cudaMemset(d_sq, 0, sizeof(double)));
  CK(cudaMemset(d_st, 0, sizeof(Stats)));
  const int64_t cnt = batch * m * n;
  sumsq_kernel<<<1024, 256>>>(ref, cnt, d_sq);
  double sq = 0;
  CK(cudaMemcpy(&sq, d_sq, sizeof sq, cudaMemcpyDeviceToHost));
  const double rms = cnt > 0 ? std::sqrt(sq / double(cnt)) : 0.0;
  compare_kernel<<<2048, 256>>>(out, t, ldo, ref, m, n, batch, float(tol.atol_rms * rms + 1e-30), tol.rtol, d_st);
  CK(cudaGetLastError());
  Stats s{};
  CK(cudaMemcpy(&s, d_st, sizeof s, cudaMemcpyDeviceToHost));
  Check c{};
  float me;
  std::memcpy(&me, &s.max_err_bits, 4);
  c.max_err = me, c.rms = rms, c.bad = s.bad, c.nan = s.nan, c.poison = s.poison_broken, c.worst = s.worst;
  c.rel_fro = s.sq_ref > 0 ? std::sqrt(s.sq_err / s.sq_ref) : 0.0;
  c.ok = s.bad == 0 && s.nan == 0 && s.poison_broken == 0 && c.rel_fro <= tol.rel_fro;
  return c;
}

// ---- cuBLAS through dlopen ---------------------------------------------------------------------

struct Blas {
  bool ok = false, lt_ok = false;
  cublasHandle_t h = nullptr;
  cublasLtHandle_t lt = nullptr;
  decltype(&cublasCreate_v2) create = nullptr;
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                                      void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmBatchedFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, long long, const void*,
                                           cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                           long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm_ex = nullptr;
  GemmBatchedFn gemm_batched = nullptr;
  decltype(&cublasLtCreate) lt_create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  void* workspace = nullptr;
  static constexpr size_t kWorkspace = 64 << 20;

  void load() {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
    void* ltlib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!lib || !ltlib) {
      std::printf("cuBLAS not found (%s): comparisons skipped\n", dlerror());
      return;
    }
#define SYM(var, lib_, name) var = reinterpret_cast<decltype(var)>(dlsym(lib_, name))
    SYM(create, lib, "cublasCreate_v2");
    SYM(gemm_ex, lib, "cublasGemmEx");
    SYM(gemm_batched, lib, "cublasGemmStridedBatchedEx");
    SYM(lt_create, ltlib, "cublasLtCreate");
    SYM(desc_create, ltlib, "cublasLtMatmulDescCreate");
    SYM(desc_set, ltlib, "cublasLtMatmulDescSetAttribute");
    SYM(desc_destroy, ltlib, "cublasLtMatmulDescDestroy");
    SYM(layout_create, ltlib, "cublasLtMatrixLayoutCreate");
    SYM(layout_destroy, ltlib, "cublasLtMatrixLayoutDestroy");
    SYM(pref_create, ltlib, "cublasLtMatmulPreferenceCreate");
    SYM(pref_set, ltlib, "cublasLtMatmulPreferenceSetAttribute");
    SYM(pref_destroy, ltlib, "cublasLtMatmulPreferenceDestroy");
    SYM(heuristic, ltlib, "cublasLtMatmulAlgoGetHeuristic");
    SYM(matmul, ltlib, "cublasLtMatmul");
#undef SYM
    ok = create && gemm_ex && gemm_batched && create(&h) == CUBLAS_STATUS_SUCCESS;
    lt_ok = lt_create && matmul && heuristic && lt_create(&lt) == CUBLAS_STATUS_SUCCESS;
    if (lt_ok) CK(cudaMalloc(&workspace, kWorkspace));
  }

  static cudaDataType dt(DType t) {
    switch (t) {
      case DType::kBF16:
        return CUDA_R_16BF;
      case DType::kF16:
        return CUDA_R_16F;
      case DType::kF32:
        return CUDA_R_32F;
      case DType::kE4M3:
        return CUDA_R_8F_E4M3;
      case DType::kE5M2:
        return CUDA_R_8F_E5M2;
    }
    return CUDA_R_32F;
  }

  // Row-major out = A B as cuBLAS's column-major out^T = B^T A^T (what torch.matmul calls).
  bool gemm(const GemmParams& p, void* out, DType out_dtype, int64_t ldo) {
    const float alpha = 1.0f, beta = 0.0f;
    const cublasOperation_t ta = p.b_layout == BLayout::kKMajor ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (p.batch == 1) {
      s = gemm_ex(h, ta, CUBLAS_OP_N, int(p.n), int(p.m), int(p.k), &alpha, p.b, dt(p.b_dtype), int(p.ldb), p.a,
                  dt(p.a_dtype), int(p.lda), &beta, out, dt(out_dtype), int(ldo), CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT);
    } else {
      s = gemm_batched(h, ta, CUBLAS_OP_N, int(p.n), int(p.m), int(p.k), &alpha, p.b, dt(p.b_dtype), int(p.ldb),
                       p.b_batch_stride, p.a, dt(p.a_dtype), int(p.lda), p.a_batch_stride, &beta, out, dt(out_dtype),
                       int(ldo), int64_t(ldo) * p.m, int(p.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    return s == CUBLAS_STATUS_SUCCESS;
  }

  // fp8 per-tensor through cuBLASLt (torch._scaled_mm's path): TN, scales as device pointers.
  struct LtPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulHeuristicResult_t algo{};
    bool ok = false;
  };
  LtPlan lt_plan(const GemmParams& p, DType out_dtype, int64_t ldo, bool fast_accum) {
    LtPlan pl;
    if (!lt_ok) return pl;
    if (desc_create(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return pl;
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    const int8_t fa = fast_accum ? 1 : 0;
    desc_set(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    desc_set(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n);
    desc_set(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.b_scale, sizeof(void*));
    desc_set(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.a_scale, sizeof(void*));
    desc_set(pl.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
    layout_create(&pl.la, dt(p.b_dtype), uint64_t(p.k), uint64_t(p.n), p.ldb);
    layout_create(&pl.lb, dt(p.a_dtype), uint64_t(p.k), uint64_t(p.m), p.lda);
    layout_create(&pl.lc, dt(out_dtype), uint64_t(p.n), uint64_t(p.m), ldo);
    cublasLtMatmulPreference_t pref;
    pref_create(&pref);
    const size_t ws = kWorkspace;
    pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    int found = 0;
    pl.ok = heuristic(lt, pl.desc, pl.la, pl.lb, pl.lc, pl.lc, pref, 1, &pl.algo, &found) == CUBLAS_STATUS_SUCCESS &&
            found > 0;
    pref_destroy(pref);
    return pl;
  }
  bool lt_run(const LtPlan& pl, const GemmParams& p, void* out) {
    const float alpha = 1.0f, beta = 0.0f;
    return matmul(lt, pl.desc, &alpha, p.b, pl.la, p.a, pl.lb, &beta, out, pl.lc, out, pl.lc, &pl.algo.algo, workspace,
                  kWorkspace, nullptr) == CUBLAS_STATUS_SUCCESS;
  }
  void lt_free(LtPlan& pl) {
    if (pl.desc) desc_destroy(pl.desc);
    for (auto l : {pl.la, pl.lb, pl.lc})
      if (l) layout_destroy(l);
  }
};

Blas g_blas;
int g_arch = 0;

// ---- problems ----------------------------------------------------------------------------------

struct Problem {
  GemmParams p;
  Buf a, b, out, ref, sa, sb;
  int64_t out_elems = 0;
};

// Allocates and fills a dense problem; `pad` widens every row stride (tests strides and, with the
// poison check, that padding is never written).
void make_problem(Problem& pr, int64_t m, int64_t n, int64_t k, int64_t batch, DType in, DType out_dtype,
                  BLayout layout, int64_t pad, ScaleMode scale, uint64_t seed, int64_t a_offset = 0) {
  GemmParams& p = pr.p;
  p = GemmParams{};
  p.m = m, p.n = n, p.k = k, p.batch = batch;
  p.a_dtype = in;
  p.b_dtype = in;
  p.out_dtype = out_dtype;
  p.b_layout = layout;
  p.lda = k + pad;
  p.ldb = (layout == BLayout::kKMajor ? k : n) + pad;
  p.ldo = n + pad;
  p.a_batch_stride = p.lda * m;
  p.b_batch_stride = p.ldb * (layout == BLayout::kKMajor ? n : k);
  p.out_batch_stride = p.ldo * m;
  const int64_t e = elem_bytes(in), eo = elem_bytes(out_dtype);
  const int64_t a_n = batch * p.a_batch_stride + a_offset, b_n = batch * p.b_batch_stride;
  pr.a.alloc(size_t(std::max<int64_t>(a_n, 1) * e + 64));
  pr.b.alloc(size_t(std::max<int64_t>(b_n, 1) * e + 64));
  pr.out_elems = batch * p.out_batch_stride;
  pr.out.alloc(size_t(std::max<int64_t>(pr.out_elems, 1) * eo + 64));
  pr.ref.alloc(size_t(std::max<int64_t>(batch * m * n, 1) * 4));
  const float range = is_fp8(in) ? 4.0f : 1.0f;
  fill(pr.a.p, a_n, in, seed * 3 + 1, range);
  fill(pr.b.p, b_n, in, seed * 3 + 2, range);
  p.a = static_cast<uint8_t*>(pr.a.p) + a_offset * e;
  p.b = pr.b.p;
  p.out = pr.out.p;
  p.scale_mode = scale;
  if (scale == ScaleMode::kPerTensor) {
    pr.sa.alloc(16), pr.sb.alloc(16);
    fill_scale_kernel<<<1, 32>>>(static_cast<float*>(pr.sa.p), 1, seed + 11, 0.01f, 0.05f);
    fill_scale_kernel<<<1, 32>>>(static_cast<float*>(pr.sb.p), 1, seed + 12, 0.01f, 0.05f);
    p.a_scale = static_cast<float*>(pr.sa.p), p.b_scale = static_cast<float*>(pr.sb.p);
  } else if (scale == ScaleMode::kGroupwise) {
    const int64_t kb = k / 128, nb = (n + 127) / 128;
    pr.sa.alloc(size_t(std::max<int64_t>(m * kb, 1) * 4)), pr.sb.alloc(size_t(std::max<int64_t>(nb * kb, 1) * 4));
    fill_scale_kernel<<<64, 256>>>(static_cast<float*>(pr.sa.p), m * kb, seed + 11, 0.002f, 0.05f);
    fill_scale_kernel<<<64, 256>>>(static_cast<float*>(pr.sb.p), nb * kb, seed + 12, 0.002f, 0.05f);
    p.a_scale = static_cast<float*>(pr.sa.p), p.b_scale = static_cast<float*>(pr.sb.p);
    // "K" major by default: a_scale [m, k/128], b_scale [n/128, k/128]
    p.a_scale_stride_m = kb, p.a_scale_stride_k = 1, p.b_scale_stride_n = kb, p.b_scale_stride_k = 1;
  }
  CK(cudaGetLastError());
}

void run_reference(Problem& pr) {
  RefArgs r{};
  r.p = pr.p;
  dim3 block(32, 8);
  dim3 grid(unsigned((pr.p.n + 31) / 32), unsigned((pr.p.m + 7) / 8), unsigned(pr.p.batch));
  ref_kernel<<<grid, block>>>(r, static_cast<float*>(pr.ref.p));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

void poison(Problem& pr) {
  CK(cudaMemset(pr.out.p, 0xff, size_t(pr.out_elems * elem_bytes(pr.p.out_dtype))));
}

// ---- the correctness grid ------------------------------------------------------------------------

int g_fail = 0, g_pass = 0;
bool g_quick = false;  // `quick`: a few small shapes (for compute-sanitizer)
std::map<std::string, int> g_kernel_runs;

bool run_and_check(Problem& pr, const Tactic& t, const std::string& label, bool print_ok) {
  poison(pr);
  arm(20, label + " " + tactic_name(t));
  Status st = kiln::gemm::gemm(pr.p, t, LaunchContext{nullptr, 0});
  cudaError_t err = cudaDeviceSynchronize();
  if (!st.ok() || err != cudaSuccess) {
    std::printf("  FAIL %-44s %-28s launch: %s %s\n", label.c_str(), tactic_name(t).c_str(), st.message.c_str(),
                cudaGetErrorString(err));
    ++g_fail;
    if (err != cudaSuccess) std::exit(2);  // a sticky error poisons every later case
    return false;
  }
  const Check c = compare(pr.p.out, pr.p.out_dtype, pr.p.ldo, pr.p.out_batch_stride, static_cast<float*>(pr.ref.p),
                          pr.p.m, pr.p.n, pr.p.batch,
                          tolerance_for(pr.p.out_dtype, is_fp8(pr.p.a_dtype),
                                        pr.p.scale_mode == ScaleMode::kPerTensor && t.kernel == Kernel::kSm90));
  ++g_kernel_runs[kernel_name(t.kernel)];
  if (!c.ok) {
    ++g_fail;
    std::printf("  FAIL %-44s %-28s %s\n", label.c_str(), tactic_name(t).c_str(), c.text().c_str());
  } else {
    ++g_pass;
    if (print_ok) std::printf("  ok   %-44s %-28s %s\n", label.c_str(), tactic_name(t).c_str(), c.text().c_str());
  }
  return c.ok;
}

std::string shape_label(const GemmParams& p, int64_t pad) {
  char b[160];
  std::snprintf(b, sizeof b, "%s%s->%s %s m%lld n%lld k%lld b%lld pad%lld", dtype_name(p.a_dtype),
                p.b_dtype != p.a_dtype ? (std::string("x") + dtype_name(p.b_dtype)).c_str() : "",
                dtype_name(p.out_dtype), p.b_layout == BLayout::kKMajor ? "Kmaj" : "Nmaj", (long long)p.m,
                (long long)p.n, (long long)p.k, (long long)p.batch, (long long)pad);
  return b;
}

void check_dense() {
  std::printf("== dense / batched, every supported tactic ==\n");
  struct S {
    int64_t m, n, k, batch;
  };
  const std::vector<S> full = {
      {1, 1, 1, 1},          {1, 7, 7, 1},         {7, 7, 7, 1},          {1, 4097, 1000, 1},  {7, 127, 4096, 1},
      {16, 1000, 4097, 1},   {64, 4097, 1016, 1},  {65, 129, 136, 1},     {127, 127, 127, 1},  {127, 1000, 1000, 1},
      {1000, 1000, 1000, 1}, {1000, 4097, 136, 1}, {4097, 1000, 1000, 1}, {256, 512, 4096, 1}, {300, 260, 520, 3},
      {1, 200, 264, 4},      {1000, 7, 4097, 1},   {513, 2048, 8, 1},
  };
  const std::vector<S> quick = {{7, 127, 136, 1}, {65, 129, 136, 1}, {130, 264, 520, 2}};
  const std::vector<S>& shapes = g_quick ? quick : full;
  Problem pr;
  uint64_t seed = 1;
  int cases = 0;
  for (const S& s : shapes)
    for (BLayout layout : {BLayout::kKMajor, BLayout::kNMajor})
      for (DType in : {DType::kBF16, DType::kF16})
        for (DType out : {in, DType::kF32})
          for (int64_t pad : {int64_t(0), int64_t(8)}) {
            if (in == DType::kF16 && out == DType::kF32 && pad == 0) continue;  // keep the grid small
            make_problem(pr, s.m, s.n, s.k, s.batch, in, out, layout, pad, ScaleMode::kNone, ++seed);
            run_reference(pr);
            const std::string label = shape_label(pr.p, pad);
            for (const Tactic& t : gemm_tactics(pr.p, g_arch)) run_and_check(pr, t, label, false);
            ++cases;
          }
  // A misaligned a (offset by one element): only the fallback can take it.
  make_problem(pr, 100, 136, 264, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, ++seed, 1);
  run_reference(pr);
  const std::vector<Tactic> ts = gemm_tactics(pr.p, g_arch);
  std::printf("  misaligned a: %zu tactic(s) support it (%s)\n", ts.size(), tactic_name(ts[0]).c_str());
  for (const Tactic& t : ts) run_and_check(pr, t, "misaligned a " + shape_label(pr.p, 0), true);
  // k = 0 writes zeros (any tactic).
  make_problem(pr, 33, 65, 0, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, ++seed);
  run_reference(pr);
  run_and_check(pr, default_tactic(pr.p, g_arch), "k=0 " + shape_label(pr.p, 0), true);
  std::printf("  %d dense cases\n", cases);
}

void check_fp8() {
  std::printf("== fp8 per-tensor and groupwise ==\n");
  struct S {
    int64_t m, n, k;
  };
  const std::vector<S> full = {{1, 128, 128},      {7, 136, 256},    {127, 1000, 512},
                               {1000, 4097, 1024}, {256, 256, 4096}, {4097, 520, 384}};
  const std::vector<S> quick = {{7, 136, 256}, {130, 256, 384}};
  const std::vector<S>& shapes = g_quick ? quick : full;
  Problem pr;
  uint64_t seed = 1000;
  for (const S& s : shapes)
    for (ScaleMode sm : {ScaleMode::kPerTensor, ScaleMode::kGroupwise})
      for (DType a : {DType::kE4M3, DType::kE5M2})
        for (DType out : {DType::kBF16, DType::kF16})
          for (int64_t pad : {int64_t(0), int64_t(16)}) {
            make_problem(pr, s.m, s.n, s.k, 1, DType::kE4M3, out, BLayout::kKMajor, pad, sm, ++seed);
            if (a == DType::kE5M2) {  // A e5m2, B e4m3
              pr.p.a_dtype = DType::kE5M2;
              fill(pr.a.p, pr.p.m * pr.p.lda, DType::kE5M2, seed * 7, 4.0f);
            }
            if (sm == ScaleMode::kGroupwise && (seed % 2)) {
              // "MN" major scales: a_scale [k/128, m], b_scale [k/128, n/128]
              pr.p.a_scale_stride_m = 1, pr.p.a_scale_stride_k = pr.p.m;
              pr.p.b_scale_stride_n = 1, pr.p.b_scale_stride_k = (pr.p.n + 127) / 128;
            }
            run_reference(pr);
            const std::string label = shape_label(pr.p, pad) + (sm == ScaleMode::kGroupwise ? " gw" : " pt") +
                                      (pr.p.a_scale_stride_m == 1 && sm == ScaleMode::kGroupwise ? "MN" : "");
            for (const Tactic& t : gemm_tactics(pr.p, g_arch)) run_and_check(pr, t, label, false);
          }
}

// Grouped: segments with lengths (0 and 1 included), weights by index (shuffled), both bound
// formats, against the reference (rows in no segment must stay poisoned).
struct Grouped {
  GroupedGemmParams g;
  Buf x, w, out, ref, bounds, widx, lo, hi, wv, err;
  std::vector<int64_t> lens;
};

void make_grouped(Grouped& G, const std::vector<int64_t>& lens, int64_t n, int64_t k, int64_t num_weights,
                  BLayout layout, bool offs, DType out_dtype, uint64_t seed, int64_t extra_rows) {
  G.lens = lens;
  const int64_t groups = int64_t(lens.size());
  std::vector<int64_t> lo(groups), hi(groups), w(groups);
  int64_t total = 0;
  std::mt19937 rng{uint32_t(seed)};
  for (int64_t s = 0; s < groups; ++s) lo[s] = total, total += lens[s], hi[s] = total, w[s] = rng() % num_weights;
  const int64_t rows = total + extra_rows;  // extra rows belong to no segment
  GroupedGemmParams& g = G.g;
  g = GroupedGemmParams{};
  g.num_groups = groups, g.n = n, g.k = k, g.total_rows = rows;
  g.a_dtype = DType::kBF16, g.lda = k, g.b_layout = layout;
  g.ldb = layout == BLayout::kKMajor ? k : n;
  g.b_weight_stride = n * k, g.num_weights = num_weights;
  g.out_dtype = out_dtype, g.ldo = n;
  G.x.alloc(size_t(std::max<int64_t>(rows * k, 1) * 2)), G.w.alloc(size_t(num_weights * n * k * 2));
  G.out.alloc(size_t(std::max<int64_t>(rows * n, 1) * elem_bytes(out_dtype))),
      G.ref.alloc(size_t(std::max<int64_t>(rows * n, 1) * 4));
  fill(G.x.p, rows * k, DType::kBF16, seed * 5 + 1);
  fill(G.w.p, num_weights * n * k, DType::kBF16, seed * 5 + 2);
  g.a = G.x.p, g.b = G.w.p, g.out = G.out.p;
  if (offs) {
    std::vector<int32_t> o(groups);
    for (int64_t s = 0; s < groups; ++s) o[s] = int32_t(hi[s]);
    G.bounds.alloc(size_t(groups * 4 + 4));
    CK(cudaMemcpy(G.bounds.p, o.data(), size_t(groups * 4), cudaMemcpyHostToDevice));
    g.bounds_type = IndexType::kInt32, g.bounds_are_ends = true;
  } else {
    std::vector<int64_t> ip(groups + 1, 0);
    for (int64_t s = 0; s < groups; ++s) ip[s + 1] = hi[s];
    G.bounds.alloc(size_t((groups + 1) * 8));
    CK(cudaMemcpy(G.bounds.p, ip.data(), size_t((groups + 1) * 8), cudaMemcpyHostToDevice));
    g.bounds_type = IndexType::kInt64, g.bounds_are_ends = false;
  }
  g.bounds = G.bounds.p;
  G.widx.alloc(size_t(groups * 8 + 8));
  CK(cudaMemcpy(G.widx.p, w.data(), size_t(groups * 8), cudaMemcpyHostToDevice));
  g.weight_indices = G.widx.p, g.weight_indices_type = IndexType::kInt64;
  G.err.alloc(32);  // the device's index-error record: four int64 (ops/common/device_error.h)
  CK(cudaMemset(G.err.p, 0, 32));
  // reference segment arrays
  G.lo.alloc(size_t(groups * 8 + 8)), G.hi.alloc(size_t(groups * 8 + 8)), G.wv.alloc(size_t(groups * 8 + 8));
  CK(cudaMemcpy(G.lo.p, lo.data(), size_t(groups * 8), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(G.hi.p, hi.data(), size_t(groups * 8), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(G.wv.p, w.data(), size_t(groups * 8), cudaMemcpyHostToDevice));
}

void grouped_reference(Grouped& G) {
  RefArgs r{};
  GemmParams& p = r.p;
  p.m = G.g.total_rows, p.n = G.g.n, p.k = G.g.k, p.batch = 1;
  p.a = G.g.a, p.a_dtype = p.b_dtype = G.g.a_dtype, p.lda = G.g.lda;
  p.b = G.g.b, p.b_layout = G.g.b_layout, p.ldb = G.g.ldb;
  r.num_seg = G.g.num_groups;
  r.seg_lo = static_cast<int64_t*>(G.lo.p), r.seg_hi = static_cast<int64_t*>(G.hi.p);
  r.seg_w = static_cast<int64_t*>(G.wv.p);
  r.b_weight_stride = G.g.b_weight_stride;
  dim3 block(32, 8), grid(unsigned((p.n + 31) / 32), unsigned((p.m + 7) / 8), 1);
  ref_kernel<<<grid, block>>>(r, static_cast<float*>(G.ref.p));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

bool run_grouped(Grouped& G, const Tactic& t, const std::string& label, bool print_ok) {
  CK(cudaMemset(G.out.p, 0xff, size_t(G.g.total_rows * G.g.n * elem_bytes(G.g.out_dtype))));
  arm(20, label + " " + tactic_name(t));
  Status st = grouped_gemm(G.g, t, LaunchContext{nullptr, 0, static_cast<int64_t*>(G.err.p)});
  cudaError_t err = cudaDeviceSynchronize();
  if (!st.ok() || err != cudaSuccess) {
    std::printf("  FAIL %-44s %-28s launch: %s %s\n", label.c_str(), tactic_name(t).c_str(), st.message.c_str(),
                cudaGetErrorString(err));
    ++g_fail;
    if (err != cudaSuccess) std::exit(2);
    return false;
  }
  const Check c = compare(G.g.out, G.g.out_dtype, G.g.ldo, 0, static_cast<float*>(G.ref.p), G.g.total_rows, G.g.n, 1,
                          tolerance_for(G.g.out_dtype, false));
  int64_t flag = 0;  // the error code recorded, 0 for none
  CK(cudaMemcpy(&flag, G.err.p, 8, cudaMemcpyDeviceToHost));
  ++g_kernel_runs[std::string("grouped_") + kernel_name(t.kernel)];
  const bool ok = c.ok && flag == 0;
  (ok ? g_pass : g_fail)++;
  if (!ok || print_ok) {
    std::printf("  %s %-44s %-28s %s error %lld\n", ok ? "ok  " : "FAIL", label.c_str(), tactic_name(t).c_str(),
                c.text().c_str(), (long long)flag);
  }
  return ok;
}

void check_grouped() {
  std::printf("== grouped (segment) GEMM ==\n");
  Grouped G;
  std::vector<std::vector<int64_t>> cases = {
      {0, 1, 300, 128, 0, 77, 513, 1},
      {1},
      {0, 0, 0},
      {129, 0, 0, 255, 1, 1, 1, 64, 2000},
  };
  if (g_quick) cases.resize(1);
  uint64_t seed = 77;
  for (const auto& lens : cases)
    for (BLayout layout : {BLayout::kKMajor, BLayout::kNMajor})
      for (bool offs : {false, true})
        for (DType out : {DType::kBF16, DType::kF32}) {
          make_grouped(G, lens, 264, 136, 5, layout, offs, out, ++seed, 37);
          grouped_reference(G);
          char label[160];
          std::snprintf(label, sizeof label, "grouped %zu segs rows %lld %s %s ->%s", lens.size(),
                        (long long)G.g.total_rows, layout == BLayout::kKMajor ? "Kmaj" : "Nmaj",
                        offs ? "offs" : "indptr", dtype_name(out));
          for (const Tactic& t : grouped_gemm_tactics(G.g, g_arch)) run_grouped(G, t, label, false);
        }
  // A weight index out of range: the segment is skipped (rows stay poisoned) and recorded.
  make_grouped(G, {100, 50}, 128, 64, 2, BLayout::kKMajor, false, DType::kBF16, 5, 0);
  const int64_t bad[2] = {0, 7};
  CK(cudaMemcpy(G.widx.p, bad, 16, cudaMemcpyHostToDevice));
  const int64_t none[2] = {0, -1};
  CK(cudaMemcpy(G.wv.p, none, 16, cudaMemcpyHostToDevice));  // reference: segment 1 has no weight
  grouped_reference(G);
  for (const Tactic& t : grouped_gemm_tactics(G.g, g_arch)) {
    CK(cudaMemset(G.err.p, 0, 32));
    CK(cudaMemset(G.out.p, 0xff, size_t(G.g.total_rows * G.g.n * 2)));
    Status st = grouped_gemm(G.g, t, LaunchContext{nullptr, 0, static_cast<int64_t*>(G.err.p)});
    CK(cudaDeviceSynchronize());
    int64_t record[4] = {};
    CK(cudaMemcpy(record, G.err.p, 32, cudaMemcpyDeviceToHost));
    // Rows of segment 1 must be untouched: compare against a reference where they are NaN.
    const Check c = compare(G.g.out, G.g.out_dtype, G.g.ldo, 0, static_cast<float*>(G.ref.p), G.g.total_rows, G.g.n, 1,
                            tolerance_for(G.g.out_dtype, false));
    const bool recorded =
        record[0] == int64_t(ErrorCode::kWeightIndex) && record[1] == 1 && record[2] == 7 && record[3] == 2;
    const bool ok = st.ok() && recorded && c.ok;
    (ok ? g_pass : g_fail)++;
    std::printf("  %s bad weight index -> %s, segment skipped (%s) %s\n", ok ? "ok  " : "FAIL",
                index_error(ErrorCode(record[0]), record[1], record[2], record[3]).c_str(), c.text().c_str(),
                tactic_name(t).c_str());
  }
}

// Bad inputs are errors before any launch.
void check_errors() {
  std::printf("== errors before launch ==\n");
  Problem pr;
  make_problem(pr, 64, 64, 64, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, 9);
  auto expect = [&](GemmParams p, Tactic t, const char* what) {
    Status st = kiln::gemm::gemm(p, t, LaunchContext{nullptr, 0});
    const bool ok = !st.ok() && cudaDeviceSynchronize() == cudaSuccess;
    (ok ? g_pass : g_fail)++;
    std::printf("  %s %-40s -> %s\n", ok ? "ok  " : "FAIL", what, st.message.c_str());
  };
  const Tactic sm90{Kernel::kSm90, 128, 128, 64, 6, 1, 1};
  GemmParams p = pr.p;
  p.a = static_cast<const uint8_t*>(p.a) + 2;
  expect(p, sm90, "sm90 with a misaligned a");
  p = pr.p;
  p.lda = 60;
  expect(p, Tactic{}, "lda < k");
  p = pr.p;
  p.out_dtype = DType::kF16;
  expect(p, Tactic{}, "bf16 -> f16");
  p = pr.p;
  expect(p, Tactic{Kernel::kSm90, 128, 256, 64, 6, 1, 1}, "an unlisted sm90 shape");
  p = pr.p;
  p.m = 65;
  expect(p, Tactic{Kernel::kSmallM, 64, 32, 32, 0, 1, 4}, "small-m tile_m < m");
  p = pr.p;
  p.a_dtype = p.b_dtype = DType::kE4M3;
  expect(p, Tactic{}, "fp8 without scales");
}

// ---- benchmark ---------------------------------------------------------------------------------

Buf g_flush;
void flush_l2() {
  CK(cudaMemsetAsync(g_flush.p, 0, g_flush.bytes));
}

// Median times (us) of `reps` runs of each f, each run after an L2 flush with events around f
// only; the variants take turns (run r of every variant, then run r + 1), so clock or thermal
// drift during the measurement falls on all of them alike.
std::vector<double> time_many(const std::vector<std::function<bool()>>& fs, int reps = 20) {
  static std::vector<cudaEvent_t> pool;
  const size_t need = 2 * fs.size() * size_t(reps);
  while (pool.size() < need) {
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    pool.push_back(e);
  }
  std::vector<double> out(fs.size(), -1.0);
  std::vector<bool> ok(fs.size(), true);
  for (size_t i = 0; i < fs.size(); ++i)
    for (int w = 0; w < 3 && ok[i]; ++w) ok[i] = fs[i]();
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fs.size(); ++i) {
      if (!ok[i]) continue;
      flush_l2();
      CK(cudaEventRecord(pool[2 * (r * fs.size() + i)]));
      fs[i]();
      CK(cudaEventRecord(pool[2 * (r * fs.size() + i) + 1]));
    }
  CK(cudaDeviceSynchronize());
  for (size_t i = 0; i < fs.size(); ++i) {
    if (!ok[i]) continue;
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; ++r)
      CK(cudaEventElapsedTime(&ms[r], pool[2 * (r * fs.size() + i)], pool[2 * (r * fs.size() + i) + 1]));
    std::sort(ms.begin(), ms.end());
    out[i] = 1e3 * ms[reps / 2];
  }
  return out;
}

struct Row {
  std::string what, tactic, best_tactic, check;
  int64_t m, n, k;
  double kiln_us, best_us, ref_us, ref2_us;
  double flops, weight_bytes;
};
std::vector<Row> g_rows;
FILE* g_csv = nullptr;

void emit(const Row& r) {
  g_rows.push_back(r);
  if (g_csv) {
    std::fprintf(g_csv, "%s,%lld,%lld,%lld,%s,%.2f,%s,%.2f,%.2f,%.2f,%s\n", r.what.c_str(), (long long)r.m,
                 (long long)r.n, (long long)r.k, r.tactic.c_str(), r.kiln_us, r.best_tactic.c_str(), r.best_us,
                 r.ref_us, r.ref2_us, r.check.c_str());
    std::fflush(g_csv);
  }
}

void print_row(const Row& r) {
  const bool small = r.m <= 64;
  char perf[64], ratio[32];
  if (small) {
    std::snprintf(perf, sizeof perf, "%6.2f TB/s", r.weight_bytes / (r.kiln_us * 1e-6) / 1e12);
  } else {
    std::snprintf(perf, sizeof perf, "%6.1f TF/s", r.flops / (r.kiln_us * 1e-6) / 1e12);
  }
  std::snprintf(ratio, sizeof ratio, "%.3f", r.ref_us > 0 ? r.ref_us / r.kiln_us : 0.0);
  std::printf("%-7s %5lld %5lld %5lld | %-22s %8.1f %s | best %-22s %8.1f | ref %8.1f %s | ref2 %8.1f | %s\n",
              r.what.c_str(), (long long)r.m, (long long)r.n, (long long)r.k, r.tactic.c_str(), r.kiln_us, perf,
              r.best_tactic.c_str(), r.best_us < 1e29 ? r.best_us : -1.0, r.ref_us, ratio, r.ref2_us, r.check.c_str());
  std::fflush(stdout);
}

const int64_t kNK[][2] = {{4096, 4096}, {6144, 4096},  {28672, 4096}, {4096, 14336},
                          {8192, 8192}, {57344, 8192}, {8192, 28672}};
const int64_t kM[] = {1, 16, 64, 256, 1024, 4096, 16384};

// bf16 dense, K-major B (the linear layer): default tactic, every other tactic of the kernel the
// default picked (the autotuner's space there), cuBLAS with bf16 out (timed) and f32 out (ref).
void bench_bf16(const std::vector<int64_t>& ms) {
  std::printf("== bench bf16 dense (K-major B), us; ref = cuBLAS (cublasGemmEx, bf16 out) ==\n");
  Problem pr;
  Buf ref_out;
  uint64_t seed = 5000;
  for (const auto& nk : kNK)
    for (int64_t m : ms) {
      const int64_t n = nk[0], k = nk[1];
      make_problem(pr, m, n, k, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, ++seed);
      Row r{};
      r.what = "bf16", r.m = m, r.n = n, r.k = k;
      r.flops = 2.0 * m * n * k, r.weight_bytes = 2.0 * n * k;
      char label[96];
      std::snprintf(label, sizeof label, "bench bf16 m%lld n%lld k%lld", (long long)m, (long long)n, (long long)k);
      arm(120, label);
      // reference: cuBLAS f32 out (else the naive kernel for the small ones)
      bool have_ref = false;
      if (g_blas.ok) {
        have_ref = g_blas.gemm(pr.p, pr.ref.p, DType::kF32, n);
        CK(cudaDeviceSynchronize());
      }
      if (!have_ref) run_reference(pr);
      const Tactic def = default_tactic(pr.p, g_arch);
      r.tactic = tactic_name(def);
      // The autotuner's space here: the small-M tactics and the sm90 ones without clusters for
      // m <= 64, every sm90 tactic above.
      std::vector<Tactic> ts;
      for (const Tactic& t : gemm_tactics(pr.p, g_arch)) {
        const bool take = m <= 64 ? (t.kernel == Kernel::kSmallM || (t.kernel == Kernel::kSm90 && t.cluster_m == 1))
                                  : t.kernel == Kernel::kSm90;
        if (take || t == def) ts.push_back(t);
      }
      bool all_ok = true;
      std::vector<std::function<bool()>> fs;
      std::vector<bool> passed;
      for (const Tactic& t : ts) {
        const bool ok = run_and_check(pr, t, label, false);
        all_ok = all_ok && ok;
        passed.push_back(ok);
        fs.push_back([&pr, t] { return kiln::gemm::gemm(pr.p, t, LaunchContext{nullptr, 0}).ok(); });
      }
      if (g_blas.ok) {
        ref_out.alloc(size_t(m * n * 2));
        fs.push_back([&] { return g_blas.gemm(pr.p, ref_out.p, DType::kBF16, n); });
      }
      const bool cutlass = cutlass_probe_gemm != nullptr && m >= 256;
      if (cutlass) {
        ref_out.alloc(size_t(m * n * 2));
        fs.push_back(
            [&] { return cutlass_probe_gemm(int(m), int(n), int(k), pr.p.a, pr.p.b, ref_out.p, nullptr) == 0; });
      }
      arm(120, std::string(label) + " timing");
      const std::vector<double> us = time_many(fs);
      if (cutlass) r.ref2_us = us.back();
      r.best_us = 1e30;
      for (size_t i = 0; i < ts.size(); ++i) {
        if (ts[i] == def) r.kiln_us = us[i];
        if (passed[i] && us[i] > 0 && us[i] < r.best_us) r.best_us = us[i], r.best_tactic = tactic_name(ts[i]);
        if (g_csv) {
          std::fprintf(g_csv, "tactic,bf16,%lld,%lld,%lld,%s,%.2f,%d\n", (long long)m, (long long)n, (long long)k,
                       tactic_name(ts[i]).c_str(), us[i], passed[i] ? 1 : 0);
        }
      }
      if (g_blas.ok) r.ref_us = us[ts.size()];
      r.check = all_ok ? (have_ref && g_blas.ok ? "ok(cublas f32)" : "ok(naive)") : "FAIL";
      emit(r);
      print_row(r);
    }
}

// fp8 e4m3 per-tensor (bf16 out): kiln default + the sm90 fp8 tactics vs cuBLASLt (fast accum
// off = torch._scaled_mm's default, and on); then groupwise (its tactics) on the same shapes.
void bench_fp8(const std::vector<int64_t>& ms) {
  std::printf("== bench fp8 e4m3 -> bf16; ref = cuBLASLt (fast accum off; ref2 on) ==\n");
  Problem pr;
  Buf lt_out;
  uint64_t seed = 6000;
  for (const auto& nk : kNK)
    for (int64_t m : ms) {
      const int64_t n = nk[0], k = nk[1];
      for (ScaleMode sm : {ScaleMode::kPerTensor, ScaleMode::kGroupwise}) {
        make_problem(pr, m, n, k, 1, DType::kE4M3, DType::kBF16, BLayout::kKMajor, 0, sm, ++seed);
        Row r{};
        r.what = sm == ScaleMode::kPerTensor ? "fp8" : "fp8gw";
        r.m = m, r.n = n, r.k = k, r.flops = 2.0 * m * n * k, r.weight_bytes = double(n) * k;
        char label[96];
        std::snprintf(label, sizeof label, "bench %s m%lld n%lld k%lld", r.what.c_str(), (long long)m, (long long)n,
                      (long long)k);
        arm(180, label);
        // reference: cuBLASLt f32 out for per-tensor; the fallback kernel (checked against the
        // naive reference in `check`) for groupwise
        bool have_ref = false;
        Blas::LtPlan ref_plan;
        if (sm == ScaleMode::kPerTensor && g_blas.lt_ok) {
          ref_plan = g_blas.lt_plan(pr.p, DType::kF32, n, false);
          have_ref = ref_plan.ok && g_blas.lt_run(ref_plan, pr.p, pr.ref.p);
          g_blas.lt_free(ref_plan);
          CK(cudaDeviceSynchronize());
        }
        if (!have_ref) {
          GemmParams q = pr.p;
          q.out = pr.ref.p, q.out_dtype = DType::kF32, q.ldo = n;
          have_ref = kiln::gemm::gemm(q, Tactic{}, LaunchContext{nullptr, 0}).ok();
          CK(cudaDeviceSynchronize());
        }
        const Tactic def = default_tactic(pr.p, g_arch);
        r.tactic = tactic_name(def);
        bool all_ok = have_ref;
        std::vector<Tactic> ts;
        std::vector<bool> passed;
        std::vector<std::function<bool()>> fs;
        for (const Tactic& t : gemm_tactics(pr.p, g_arch)) {
          if (t.kernel != def.kernel) continue;
          const bool ok = run_and_check(pr, t, label, false);
          all_ok = all_ok && ok;
          ts.push_back(t), passed.push_back(ok);
          fs.push_back([&pr, t] { return kiln::gemm::gemm(pr.p, t, LaunchContext{nullptr, 0}).ok(); });
        }
        Blas::LtPlan plans[2];
        if (sm == ScaleMode::kPerTensor && g_blas.lt_ok) {
          lt_out.alloc(size_t(m * n * 2));
          for (int fast = 0; fast < 2; ++fast) {
            plans[fast] = g_blas.lt_plan(pr.p, DType::kBF16, n, fast == 1);
            if (plans[fast].ok) fs.push_back([&, fast] { return g_blas.lt_run(plans[fast], pr.p, lt_out.p); });
          }
        }
        arm(120, std::string(label) + " timing");
        const std::vector<double> us = time_many(fs);
        r.best_us = 1e30;
        for (size_t i = 0; i < ts.size(); ++i) {
          if (ts[i] == def) r.kiln_us = us[i];
          if (passed[i] && us[i] > 0 && us[i] < r.best_us) r.best_us = us[i], r.best_tactic = tactic_name(ts[i]);
          if (g_csv) {
            std::fprintf(g_csv, "tactic,%s,%lld,%lld,%lld,%s,%.2f,%d\n", r.what.c_str(), (long long)m, (long long)n,
                         (long long)k, tactic_name(ts[i]).c_str(), us[i], passed[i] ? 1 : 0);
          }
        }
        if (plans[0].ok) r.ref_us = us[ts.size()];
        if (plans[1].ok) r.ref2_us = us[ts.size() + (plans[0].ok ? 1 : 0)];
        for (auto& pl : plans) g_blas.lt_free(pl);
        r.check = all_ok ? (sm == ScaleMode::kPerTensor ? "ok(cublasLt f32)" : "ok(fallback f32)") : "FAIL";
        emit(r);
        print_row(r);
      }
    }
}

// The issue's MoE shape: E = 128 experts, hidden 2048 (k), 2 x 1536 = 3072 (n), 8192 tokens x
// top-8 = 65536 routed rows, segment lengths from a multinomial draw; kiln grouped (K-major
// weights [E, n, k], what torch._grouped_mm takes as b = w.transpose(-2, -1)) vs a loop of
// cuBLAS GEMMs (torch.matmul per expert).
void bench_grouped() {
  std::printf("== bench grouped: E=128, k=2048, n=3072, 65536 routed rows ==\n");
  const int64_t E = 128, K = 2048, N = 3072, rows = 8192 * 8;
  std::mt19937 rng(42);
  std::vector<int64_t> lens(E, 0);
  for (int64_t i = 0; i < rows; ++i) lens[rng() % E]++;
  Grouped G;
  make_grouped(G, lens, N, K, E, BLayout::kKMajor, true, DType::kBF16, 99, 0);
  // identity weight indices (expert e = segment e), as torch._grouped_mm
  std::vector<int64_t> id(E);
  std::iota(id.begin(), id.end(), 0);
  CK(cudaMemcpy(G.widx.p, id.data(), size_t(E * 8), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(G.wv.p, id.data(), size_t(E * 8), cudaMemcpyHostToDevice));
  arm(120, "bench grouped");
  grouped_reference(G);
  const double flops = 2.0 * rows * N * K;
  Row r{};
  r.what = "grouped", r.m = rows, r.n = N, r.k = K, r.flops = flops;
  const Tactic def = default_grouped_tactic(G.g, g_arch);
  r.tactic = tactic_name(def);
  r.best_us = 1e30;
  bool all_ok = true;
  std::vector<Tactic> ts;
  std::vector<bool> passed;
  std::vector<std::function<bool()>> fs;
  for (const Tactic& t : grouped_gemm_tactics(G.g, g_arch)) {
    if (t.kernel != def.kernel) continue;
    const bool ok = run_grouped(G, t, "bench grouped", true);
    all_ok = all_ok && ok;
    ts.push_back(t), passed.push_back(ok);
    fs.push_back([&G, t] { return grouped_gemm(G.g, t, LaunchContext{nullptr, 0}).ok(); });
  }
  std::vector<int64_t> lo(E);
  int64_t acc = 0;
  for (int64_t e = 0; e < E; ++e) lo[e] = acc, acc += lens[e];
  Buf o;
  if (g_blas.ok) {
    o.alloc(size_t(rows * N * 2));
    fs.push_back([&] {
      bool ok = true;
      for (int64_t e = 0; e < E; ++e) {
        if (lens[e] == 0) continue;
        GemmParams p{};
        p.m = lens[e], p.n = N, p.k = K, p.batch = 1;
        p.a = static_cast<const __nv_bfloat16*>(G.g.a) + lo[e] * K, p.lda = K;
        p.b = static_cast<const __nv_bfloat16*>(G.g.b) + e * N * K, p.ldb = K, p.b_layout = BLayout::kKMajor;
        ok = ok && g_blas.gemm(p, static_cast<__nv_bfloat16*>(o.p) + lo[e] * N, DType::kBF16, N);
      }
      return ok;
    });
  }
  arm(120, "bench grouped timing");
  const std::vector<double> us = time_many(fs);
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i] == def) r.kiln_us = us[i];
    if (passed[i] && us[i] > 0 && us[i] < r.best_us) r.best_us = us[i], r.best_tactic = tactic_name(ts[i]);
  }
  if (g_blas.ok) r.ref_us = us.back();
  r.check = all_ok ? "ok(naive)" : "FAIL";
  emit(r);
  print_row(r);
}

// `profile`: one launch each of the kernels docs/perf/gemm.md analyses, for ncu: the small-M
// default at m=1, 28672 x 4096, and sm90 128 x 256 / 128 x 128 at 16384 x 4096 x 4096.
void profile() {
  Problem pr;
  make_problem(pr, 1, 28672, 4096, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, 31);
  const Tactic d = default_tactic(pr.p, g_arch);
  for (int i = 0; i < 2; ++i) kiln::gemm::gemm(pr.p, d, LaunchContext{nullptr, 0});
  make_problem(pr, 16384, 4096, 4096, 1, DType::kBF16, DType::kBF16, BLayout::kKMajor, 0, ScaleMode::kNone, 32);
  for (int bn : {256, 128}) {
    const Tactic t{Kernel::kSm90, 128, bn, 64, bn == 256 ? 4 : 6, 1, 1};
    for (int i = 0; i < 2; ++i) kiln::gemm::gemm(pr.p, t, LaunchContext{nullptr, 0});
  }
  CK(cudaDeviceSynchronize());
  std::printf("profile launches done (%s)\n", tactic_name(d).c_str());
}

void print_table() {
  std::printf("\n==== summary: shape | kiln default tactic, us, rate | best tactic | ref us, ref/kiln | check ====\n");
  for (const Row& r : g_rows) print_row(r);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (argc > 2) g_csv = std::fopen(argv[2], "w");
  std::thread(watchdog).detach();
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_arch = device_arch(0);
  std::printf("device: %s (cc %d.%d, %d SMs), gemm arch code %d\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, g_arch);
  g_blas.load();
  g_flush.alloc(size_t(256) << 20);
  g_quick = mode == "quick";
  if (mode == "check" || mode == "all" || mode == "quick") {
    check_errors();
    check_dense();
    check_fp8();
    check_grouped();
    std::printf("check: %d passed, %d failed; runs per kernel:", g_pass, g_fail);
    for (const auto& [k, v] : g_kernel_runs) std::printf(" %s %d", k.c_str(), v);
    std::printf("\n");
  }
  if (mode == "bench" || mode == "all" || mode == "bench-bf16") {
    bench_bf16(std::vector<int64_t>(std::begin(kM), std::end(kM)));
  }
  if (mode == "bench" || mode == "all" || mode == "bench-fp8") bench_fp8({1024, 4096, 16384});
  if (mode == "bench" || mode == "all" || mode == "bench-grouped") bench_grouped();
  if (mode == "profile") profile();
  if (!g_rows.empty()) print_table();
  g_deadline = 0;
  if (g_csv) std::fclose(g_csv);
  std::printf("%s (%d failing)\n", g_fail ? "FAIL" : "all ok", g_fail);
  return g_fail ? 1 : 0;
}
