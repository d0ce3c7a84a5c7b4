// Framework-free self-test and A/B timer of the paged decode kernel (ops/attention/decode.cuh):
// runs launch_decode on paged caches (bf16 and fp8 E4M3, NHD pages handed out in random order,
// unsplit and split-KV plans with the in-launch merge) against a float64 CPU reference on fresh
// random inputs, outputs poisoned with NaN before every run and every element checked; then times
// the issue's shapes (GQA 32/8, head_dim 128, page 16). The same source builds against an earlier
// tree (its ops/ on the include path first), so one device call times two kernel versions on the
// same inputs:
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -I. \
//        tests/cuda/decode_selftest.cu -o /tmp/decode_selftest
//   /tmp/decode_selftest check     correctness cases (exit 1 on any failure)
//   /tmp/decode_selftest bench     the issue's shapes: median per launch, eager and CUDA graph
//   /tmp/decode_selftest profile   one launch of each large shape (for ncu)
//   /tmp/decode_selftest all       check, then bench
//
// Reference: float64 attention over the values the kernel reads (the fp8 bytes times their scales).
// Tolerance: bf16 output rounding (2^-8 relative) plus the bf16 rounding of P (decode packs P to
// the operand type: 2^-8 of each weight) on |out| <= max |v|, so 2e-2 absolute for values of O(1)
// (the decode trace's tolerance); lse within 2e-3 (float32 sums, log2 of an O(kv_len) sum).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/attention/decode.cuh"
#include "tests/cuda/cuda_check.h"

using namespace kiln;
using namespace kiln::attention;

namespace {

using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

template <typename T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = dev_alloc<T>(h.size());
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Pseudo-normal values on the device (the large benchmark caches; the host's generator would take
// tens of seconds a gigabyte): Box-Muller on a hash of (seed, index).
__device__ uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}
template <typename T>
__global__ void fill_normal(T* out, int64_t n, int64_t half, uint32_t seed, float k_inv, float v_inv) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t a = mix(uint32_t(i) ^ mix(seed + uint32_t(i >> 32))), b = mix(a ^ 0x9e3779b9u);
    const float u1 = (a >> 8) * (1.0f / 16777216.0f) + 1e-7f, u2 = (b >> 8) * (1.0f / 16777216.0f);
    const float x = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    out[i] = T(x * ((i / half) % 2 ? v_inv : k_inv));  // [page][K, V] halves of `half` elements
  }
}

struct Problem {
  int batch, kv_len, hq, hk, d, page;
  int chunk;  // split-KV chunk in tokens (0: one item a request)
  bool fp8_cache;
  bool soft_cap;
};

// A paged cache [pages][2][page][hk][d] (K then V of a page, FlashInfer's NHD), random pages, and
// the plan's work list.
struct Batch {
  Problem pr;
  int64_t num_pages = 0;
  std::vector<float> kv_host;      // the values the kernel reads (fp8: already times the scale)
  std::vector<int64_t> host_page;  // page id -> its page in kv_host (empty: the identity)
  std::vector<float> q_host;
  float k_scale = 1.0f, v_scale = 1.0f;
  void* cache = nullptr;
  bf16* q = nullptr;
  bf16* out = nullptr;
  float* lse = nullptr;
  int32_t *indptr = nullptr, *indices = nullptr;
  std::vector<int32_t> h_indptr, h_indices;
  // plan
  int32_t *w_request, *w_begin, *w_end, *w_out, *w_merge, *m_request, *m_indptr, *m_counter, *kv_lens;
  int64_t items = 0, merges = 0, slots = 0;
  float *partial_out = nullptr, *partial_lse = nullptr;
  DecodeParams params{};
};

Batch make_batch(const Problem& pr, std::mt19937& rng, bool keep_host) {
  Batch b;
  b.pr = pr;
  const int pages_per_req = (pr.kv_len + pr.page - 1) / pr.page;
  b.num_pages = int64_t(pr.batch) * pages_per_req;
  std::vector<int32_t> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.h_indptr.resize(pr.batch + 1);
  for (int r = 0; r <= pr.batch; ++r) b.h_indptr[r] = r * pages_per_req;
  b.h_indices = perm;
  const int64_t elems = b.num_pages * 2 * pr.page * pr.hk * pr.d;
  const int64_t half = int64_t(pr.page) * pr.hk * pr.d;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (!keep_host) {  // benchmark caches: generated on the device (fp8: scales for N(0, 1), absmax ~ 6)
    if (pr.fp8_cache) b.k_scale = b.v_scale = 6.0f / 448.0f;
    const uint32_t seed = rng();
    if (pr.fp8_cache) {
      fp8* c = dev_alloc<fp8>(elems);
      fill_normal<<<1024, 256>>>(c, elems, half, seed, 1.0f / b.k_scale, 1.0f / b.v_scale);
      b.cache = c;
    } else {
      bf16* c = dev_alloc<bf16>(elems);
      fill_normal<<<1024, 256>>>(c, elems, half, seed, 1.0f, 1.0f);
      b.cache = c;
    }
    CK(cudaGetLastError());
  } else {
    std::vector<float> vals(elems);
    for (auto& x : vals) x = nd(rng);
    if (pr.fp8_cache) {
      float kmax = 0, vmax = 0;
      for (int64_t p = 0; p < b.num_pages; ++p) {
        for (int64_t i = 0; i < half; ++i) {
          kmax = std::max(kmax, std::fabs(vals[p * 2 * half + i]));
          vmax = std::max(vmax, std::fabs(vals[p * 2 * half + half + i]));
        }
      }
      b.k_scale = kmax / 448.0f, b.v_scale = vmax / 448.0f;
      std::vector<fp8> h(elems);
      for (int64_t p = 0; p < b.num_pages; ++p) {
        for (int64_t i = 0; i < 2 * half; ++i) {
          const int64_t at = p * 2 * half + i;
          const float sc = i < half ? b.k_scale : b.v_scale;
          h[at] = fp8(vals[at] / sc);
          vals[at] = float(h[at]) * sc;
        }
      }
      b.cache = upload(h);
    } else {
      std::vector<bf16> h(elems);
      for (int64_t i = 0; i < elems; ++i) {
        h[i] = __float2bfloat16(vals[i]);
        vals[i] = __bfloat162float(h[i]);
      }
      b.cache = upload(h);
    }
    b.kv_host = std::move(vals);
  }
  std::vector<bf16> hq(int64_t(pr.batch) * pr.hq * pr.d);
  b.q_host.resize(hq.size());
  for (size_t i = 0; i < hq.size(); ++i) {
    hq[i] = __float2bfloat16(nd(rng));
    b.q_host[i] = __bfloat162float(hq[i]);
  }
  b.q = upload(hq);
  b.out = dev_alloc<bf16>(hq.size());
  b.lse = dev_alloc<float>(int64_t(pr.batch) * pr.hq);
  b.indptr = upload(b.h_indptr);
  b.indices = upload(b.h_indices);

  // The plan: one item a request, or chunks of pr.chunk tokens merged in the launch.
  std::vector<int32_t> req, beg, end, outi, mergei, mreq, mptr{0};
  for (int r = 0; r < pr.batch; ++r) {
    const int pieces = pr.chunk ? (pr.kv_len + pr.chunk - 1) / pr.chunk : 1;
    for (int c = 0; c < pieces; ++c) {
      req.push_back(r);
      beg.push_back(pr.chunk ? c * pr.chunk : 0);
      end.push_back(pr.chunk ? std::min(pr.kv_len, (c + 1) * pr.chunk) : pr.kv_len);
      outi.push_back(pieces > 1 ? int32_t(b.slots++) : -1);
      mergei.push_back(pieces > 1 ? int32_t(mreq.size()) : -1);
    }
    if (pieces > 1) {
      mreq.push_back(r);
      mptr.push_back(mptr.back() + pieces);
    }
  }
  b.items = int64_t(req.size()), b.merges = int64_t(mreq.size());
  b.w_request = upload(req), b.w_begin = upload(beg), b.w_end = upload(end), b.w_out = upload(outi);
  b.w_merge = upload(mergei);
  b.m_request = upload(mreq.empty() ? std::vector<int32_t>{0} : mreq);
  b.m_indptr = upload(mptr);
  b.kv_lens = upload(std::vector<int32_t>(pr.batch, pr.kv_len));
  const int heads = heads_per_cta(pr.hq / pr.hk);
  const int64_t counters = std::max<int64_t>(1, b.merges * pr.hk * (pr.hq / pr.hk / heads));
  b.m_counter = dev_alloc<int32_t>(counters);
  CK(cudaMemset(b.m_counter, 0, counters * sizeof(int32_t)));
  if (b.slots) {
    b.partial_out = dev_alloc<float>(b.slots * pr.hq * pr.d + 4);
    b.partial_lse = dev_alloc<float>(b.slots * pr.hq);
  }

  DecodeParams& p = b.params;
  p.q = b.q;
  p.q_stride_b = int64_t(pr.hq) * pr.d, p.q_stride_h = pr.d;
  const int elt = pr.fp8_cache ? 1 : 2;
  p.kv.k = b.cache;
  p.kv.v = static_cast<const char*>(b.cache) + half * elt;
  p.kv.k_page_stride = p.kv.v_page_stride = 2 * half;
  p.kv.k_slot_stride = p.kv.v_slot_stride = int64_t(pr.hk) * pr.d;
  p.kv.k_head_stride = p.kv.v_head_stride = pr.d;
  p.kv.page_indptr = b.indptr, p.kv.page_indices = b.indices;
  p.kv.page_size = pr.page, p.kv.num_pages = b.num_pages, p.kv.num_indices = b.num_pages;
  p.num_qo_heads = pr.hq, p.num_kv_heads = pr.hk;
  p.kv_len = b.kv_lens, p.q_len = 1, p.window_left = -1;
  p.work_request = b.w_request, p.work_token_begin = b.w_begin, p.work_token_end = b.w_end;
  p.work_out_index = b.w_out, p.work_merge_index = b.w_merge, p.work_capacity = b.items;
  p.merge_request = b.m_request, p.merge_indptr = b.m_indptr, p.merge_capacity = b.merges;
  p.merge_counter = b.m_counter;
  p.out = b.out, p.out_stride_b = int64_t(pr.hq) * pr.d, p.out_stride_h = pr.d;
  p.lse = b.lse, p.lse_stride_b = pr.hq;
  p.partial_out = b.partial_out, p.partial_lse = b.partial_lse;
  p.sm_scale = 1.0f / std::sqrt(float(pr.d));
  p.soft_cap = pr.soft_cap ? 30.0f : 0.0f;
  p.k_scale = b.k_scale, p.v_scale = b.v_scale;
  return b;
}

void free_batch(Batch& b) {
  for (void* x : {static_cast<void*>(b.cache), static_cast<void*>(b.q), static_cast<void*>(b.out),
                  static_cast<void*>(b.lse), static_cast<void*>(b.indptr), static_cast<void*>(b.indices),
                  static_cast<void*>(b.w_request), static_cast<void*>(b.w_begin), static_cast<void*>(b.w_end),
                  static_cast<void*>(b.w_out), static_cast<void*>(b.w_merge), static_cast<void*>(b.m_request),
                  static_cast<void*>(b.m_indptr), static_cast<void*>(b.m_counter), static_cast<void*>(b.partial_out),
                  static_cast<void*>(b.partial_lse), static_cast<void*>(b.kv_lens)}) {
    if (x) CK(cudaFree(x));
  }
}

template <int D>
Status launch_d(const Batch& b, cudaStream_t stream) {
  const LaunchContext ctx{stream, -1, nullptr};
  const bool cap = b.pr.soft_cap;
  if (b.pr.fp8_cache) {
    return cap ? launch_decode<bf16, fp8, D, true>(b.params, ctx) : launch_decode<bf16, fp8, D, false>(b.params, ctx);
  }
  return cap ? launch_decode<bf16, bf16, D, true>(b.params, ctx) : launch_decode<bf16, bf16, D, false>(b.params, ctx);
}

void launch(const Batch& b, cudaStream_t stream = nullptr) {
  const Status st = b.pr.d == 64    ? launch_d<64>(b, stream)
                    : b.pr.d == 128 ? launch_d<128>(b, stream)
                                    : launch_d<256>(b, stream);
  if (!st.ok()) {
    std::fprintf(stderr, "launch failed: %s\n", st.message.c_str());
    std::exit(2);
  }
}

// float64 reference of request r, query head h: (out[d], lse base 2).
void reference(const Batch& b, int r, int h, std::vector<double>& out, double& lse) {
  const Problem& pr = b.pr;
  const int kvh = h / (pr.hq / pr.hk);
  const int64_t half = int64_t(pr.page) * pr.hk * pr.d;
  std::vector<double> logit(pr.kv_len);
  double mx = -INFINITY;
  const double sm = 1.0 / std::sqrt(double(pr.d));
  for (int t = 0; t < pr.kv_len; ++t) {
    const int64_t page = b.h_indices[b.h_indptr[r] + t / pr.page];
    const int64_t hp = b.host_page.empty() ? page : b.host_page[page];
    const float* k = &b.kv_host[hp * 2 * half + int64_t(t % pr.page) * pr.hk * pr.d + int64_t(kvh) * pr.d];
    double dot = 0;
    for (int i = 0; i < pr.d; ++i) dot += double(b.q_host[(int64_t(r) * pr.hq + h) * pr.d + i]) * k[i];
    double x = dot * sm;
    if (pr.soft_cap) x = 30.0 * std::tanh(x / 30.0);
    logit[t] = x;
    mx = std::max(mx, x);
  }
  out.assign(pr.d, 0.0);
  double sum = 0;
  for (int t = 0; t < pr.kv_len; ++t) {
    const double w = std::exp(logit[t] - mx);
    sum += w;
    const int64_t page = b.h_indices[b.h_indptr[r] + t / pr.page];
    const int64_t hp = b.host_page.empty() ? page : b.host_page[page];
    const float* v = &b.kv_host[hp * 2 * half + half + int64_t(t % pr.page) * pr.hk * pr.d + int64_t(kvh) * pr.d];
    for (int i = 0; i < pr.d; ++i) out[i] += w * v[i];
  }
  for (auto& x : out) x /= sum;
  lse = (mx + std::log(sum)) / std::log(2.0);
}

// After a benchmark: requests 0 and batch - 1 of the last launch against the float64 reference,
// their pages copied back from the device (the whole cache would be gigabytes).
bool verify_ends(Batch& b) {
  const Problem& pr = b.pr;
  const int64_t half = int64_t(pr.page) * pr.hk * pr.d, per_req = b.h_indptr[1] - b.h_indptr[0];
  b.host_page.assign(b.num_pages, -1);
  b.kv_host.clear();
  const int ends[2] = {0, pr.batch - 1};
  for (int r : ends) {
    for (int64_t i = 0; i < per_req; ++i) {
      const int64_t page = b.h_indices[b.h_indptr[r] + i];
      if (b.host_page[page] >= 0) continue;
      b.host_page[page] = int64_t(b.kv_host.size()) / (2 * half);
      const size_t at = b.kv_host.size();
      b.kv_host.resize(at + 2 * half);
      if (pr.fp8_cache) {
        std::vector<fp8> h(2 * half);
        CK(cudaMemcpy(h.data(), static_cast<fp8*>(b.cache) + page * 2 * half, h.size(), cudaMemcpyDeviceToHost));
        for (int64_t j = 0; j < 2 * half; ++j) b.kv_host[at + j] = float(h[j]) * (j < half ? b.k_scale : b.v_scale);
      } else {
        std::vector<bf16> h(2 * half);
        CK(cudaMemcpy(h.data(), static_cast<bf16*>(b.cache) + page * 2 * half, h.size() * 2, cudaMemcpyDeviceToHost));
        for (int64_t j = 0; j < 2 * half; ++j) b.kv_host[at + j] = __bfloat162float(h[j]);
      }
    }
  }
  b.q_host.resize(size_t(pr.batch) * pr.hq * pr.d);
  std::vector<bf16> hq(b.q_host.size()), out(b.q_host.size());
  CK(cudaMemcpy(hq.data(), b.q, hq.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.data(), b.out, out.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < hq.size(); ++i) b.q_host[i] = __bfloat162float(hq[i]);
  double worst = 0;
  std::vector<double> ref;
  double lse;
  for (int r : ends) {
    for (int h = 0; h < pr.hq; ++h) {
      reference(b, r, h, ref, lse);
      for (int i = 0; i < pr.d; ++i) {
        const double got = __bfloat162float(out[(size_t(r) * pr.hq + h) * pr.d + i]);
        worst = std::max(worst, std::isfinite(got) ? std::fabs(got - ref[i]) : INFINITY);
      }
    }
  }
  const bool ok = worst <= 2e-2;
  std::printf("    reference check (requests 0 and %d): max|out-ref| %.2e %s", pr.batch - 1, worst, ok ? "ok" : "FAIL");
  return ok;
}

std::string describe(const Problem& pr) {
  char s[160];
  std::snprintf(s, sizeof s, "%s b%d L%d %d/%d d%d p%d%s%s", pr.fp8_cache ? "fp8 " : "bf16", pr.batch, pr.kv_len, pr.hq,
                pr.hk, pr.d, pr.page, pr.chunk ? (" chunk" + std::to_string(pr.chunk)).c_str() : "",
                pr.soft_cap ? " softcap" : "");
  return s;
}

bool check_case(const Problem& pr, std::mt19937& rng) {
  Batch b = make_batch(pr, rng, true);
  const size_t n = size_t(pr.batch) * pr.hq * pr.d;
  CK(cudaMemset(b.out, 0xff, n * sizeof(bf16)));  // NaN bit patterns: every element must be written
  CK(cudaMemset(b.lse, 0xff, size_t(pr.batch) * pr.hq * sizeof(float)));
  bool ok = true;
  double worst = 0, worst_lse = 0;
  int bad_r = -1, bad_h = -1, bad_i = -1;
  for (int rep = 0; rep < 2; ++rep) {  // twice: the split merge's counters must be back at zero
    launch(b);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<bf16> out(n);
    std::vector<float> lse(size_t(pr.batch) * pr.hq);
    CK(cudaMemcpy(out.data(), b.out, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), b.lse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> ref;
    double ref_lse;
    for (int r = 0; r < pr.batch; ++r) {
      for (int h = 0; h < pr.hq; ++h) {
        reference(b, r, h, ref, ref_lse);
        for (int i = 0; i < pr.d; ++i) {
          const double got = __bfloat162float(out[(size_t(r) * pr.hq + h) * pr.d + i]);
          const double err = std::isfinite(got) ? std::fabs(got - ref[i]) : INFINITY;
          if (err > worst) worst = err, bad_r = r, bad_h = h, bad_i = i;
        }
        const double el = std::isfinite(lse[r * pr.hq + h]) ? std::fabs(lse[r * pr.hq + h] - ref_lse) : INFINITY;
        worst_lse = std::max(worst_lse, el);
      }
    }
    CK(cudaMemset(b.out, 0xff, n * sizeof(bf16)));
  }
  const double tol = 2e-2;  // values are N(0, 1) samples (fp8: their E4M3 roundings times the scale)
  ok = worst <= tol && worst_lse <= 2e-3 * std::max(1.0, std::log2(double(pr.kv_len)));
  std::printf("%-6s %-44s max|out-ref| %.3e (tol %.1e) at r%d h%d d%d  max|lse-ref| %.2e\n", ok ? "ok" : "FAIL",
              describe(pr).c_str(), worst, tol, bad_r, bad_h, bad_i, worst_lse);
  free_batch(b);
  return ok;
}

int run_check() {
  std::mt19937 rng(1234);
  std::vector<Problem> cases;
  for (bool f8 : {false, true}) {
    for (int d : {64, 128, 256}) {
      cases.push_back({3, 300, 32, 8, d, 16, 0, f8, false});     // GQA 4, unsplit, a partial last tile
      cases.push_back({2, 1000, 32, 8, d, 16, 256, f8, false});  // split, merged in the launch
    }
    cases.push_back({2, 777, 8, 1, 128, 16, 256, f8, false});    // GQA 8: a full n-tile of heads
    cases.push_back({2, 517, 16, 1, 128, 5, 0, f8, false});      // GQA 16: two n-tiles; odd pages
    cases.push_back({2, 999, 64, 2, 128, 1, 384, f8, false});    // GQA 32: two CTAs of 16 heads; page 1
    cases.push_back({3, 333, 4, 4, 128, 16, 0, f8, false});      // MHA: one live head of 8
    cases.push_back({2, 640, 40, 8, 128, 16, 0, f8, false});     // GQA 5
    cases.push_back({2, 1, 32, 8, 128, 16, 0, f8, false});       // one token
    cases.push_back({2, 2049, 32, 8, 128, 16, 0, f8, true});     // soft-cap
    cases.push_back({2, 1000, 32, 8, 128, 16, 100, f8, false});  // chunks off the 16-token grid: per-token pages
    cases.push_back({2, 1500, 32, 8, 128, 48, 256, f8, false});  // whole pages of 48 (3 m-tiles a page)
    cases.push_back({3, 700, 32, 8, 64, 8, 0, f8, false});       // pages of 8: two a 16-row m-tile
  }
  int failed = 0;
  for (const auto& c : cases) failed += !check_case(c, rng);
  std::printf("check: %zu cases, %d failed%s\n", cases.size(), failed, failed ? "" : " (all ok)");
  return failed ? 1 : 0;
}

// Median per-launch time (µs) over `samples` samples of `reps` launches, rotating over the input
// sets; with `graph`, each sample replays a CUDA graph of `reps` launches.
double time_us(std::vector<Batch>& sets, bool graph, int samples = 30, int reps = 20) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i) launch(sets[i % sets.size()], stream);
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
  }
  auto once = [&] {
    if (graph) {
      CK(cudaGraphLaunch(exec, stream));
    } else {
      for (int i = 0; i < reps; ++i) launch(sets[i % sets.size()], stream);
    }
  };
  for (int w = 0; w < 3; ++w) once();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    CK(cudaEventRecord(e0, stream));
    once();
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.0 / reps);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  if (exec) CK(cudaGraphExecDestroy(exec));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(stream));
  std::printf("    (p10 %.1f, p90 %.1f)", t[samples / 10], t[samples * 9 / 10]);
  return t[samples / 2];
}

// The issue's shapes, bf16 and fp8 side by side; `profile` runs the first four once each.
std::vector<Problem> bench_problems() {
  std::vector<Problem> v;
  for (bool f8 : {false, true}) v.push_back({64, 4096, 32, 8, 128, 16, 0, f8, false});
  for (bool f8 : {false, true}) v.push_back({1, 4096, 32, 8, 128, 16, 256, f8, false});  // the plan's split
  for (bool f8 : {false, true}) v.push_back({256, 2048, 32, 8, 128, 16, 0, f8, false});
  for (bool f8 : {false, true}) v.push_back({1, 32768, 32, 8, 128, 16, 1024, f8, false});
  return v;
}

int run_bench(bool profile) {
  std::mt19937 rng(99);
  int failed = 0;
  std::printf("%-44s %12s %12s %8s\n", "shape", "eager us", "graph us", "TB/s");
  const auto problems = bench_problems();
  for (size_t k = 0; k < (profile ? 4 : problems.size()); ++k) {
    const Problem& pr = problems[k];
    const double bytes = double(pr.batch) * pr.kv_len * pr.hk * pr.d * 2 * (pr.fp8_cache ? 1 : 2);
    // Enough input sets that the rotation touches more than the 50 MB L2 between launches.
    const int nsets = profile ? 1 : std::max(1, std::min(8, int(std::ceil(200e6 / bytes))));
    std::vector<Batch> sets;
    for (int i = 0; i < nsets; ++i) sets.push_back(make_batch(pr, rng, false));
    if (profile) {
      launch(sets[0]);
      CK(cudaDeviceSynchronize());
      std::printf("%-44s profiled\n", describe(pr).c_str());
    } else {
      std::printf("%-44s", describe(pr).c_str());
      const double eager = time_us(sets, false);
      const double graph = time_us(sets, true);
      CK(cudaMemset(sets.back().out, 0xff, size_t(pr.batch) * pr.hq * pr.d * sizeof(bf16)));
      launch(sets.back());
      CK(cudaDeviceSynchronize());
      failed += !verify_ends(sets.back());
      std::printf("\n%-44s %12.1f %12.1f %8.2f\n", describe(pr).c_str(), eager, graph, bytes / graph * 1e-6);
    }
    for (auto& s : sets) free_batch(s);
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  int rc = 0;
  if (mode == "check" || mode == "all") rc |= run_check();
  if (mode == "bench" || mode == "all") rc |= run_bench(false);
  if (mode == "profile") rc |= run_bench(true);
  return rc;
}
