// Framework-free self-test of the sm90a prefill kernel (ops/attention/prefill_sm90.cuh): runs its
// two grids (one CTA a work unit, persistent) and the FA2 kernel on small single / paged / ragged
// problems against a float64 CPU reference and prints the max error of each, plus where the worst
// element is (row, column), so a layout bug shows its pattern. On an H100/H200, from the
// repository root:
//
//   nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a
//   -gencode=arch=compute_80,code=sm_80 \
//        -I. tests/cuda/prefill_sm90_selftest.cu -o /tmp/sm90_selftest && /tmp/sm90_selftest
//
// Also times the issue's shape (single prefill, causal, 8192 tokens, 32 heads, head_dim 128) for
// fa2 and fa3 (the harness, `python -m benchmarks run single_prefill`, is the reference timing),
// the two KV producers on one cache, and the two grids on one input (A/B, outputs compared bit
// for bit). Exit status 0 when every case of every kernel is within tolerance and every A/B pair
// is bit-identical.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/attention/prefill.cuh"
#include "ops/attention/prefill_sm90.cuh"

using namespace kiln;
using namespace kiln::attention;

namespace {

const char* kNames[] = {"fa2", "fa3"};
// The kernels every correctness case runs: FA2, and the sm90a kernel on each grid (forced; the
// automatic choice is one of them, see launch_prefill_sm90).
struct Kernel {
  int kernel;
  Sm90Grid grid;
  const char* name;
};
const Kernel kKernels[] = {{kPrefillKernelFA2, Sm90Grid::kAuto, "fa2"},
                           {kPrefillKernelFA3, Sm90Grid::kPerUnit, "fa3/unit"},
                           {kPrefillKernelFA3, Sm90Grid::kPersistent, "fa3/pers"}};

template <int D>
Status launch_d(const PrefillParams& p, int kernel, Sm90Load load, Sm90Grid grid) {
  const LaunchContext ctx{nullptr, 0};
  if (kernel == kPrefillKernelFA2) return launch_prefill<__nv_bfloat16, D, false>(p, ctx);
  return launch_prefill_sm90<__nv_bfloat16, D, false>(p, ctx, load, grid);
}

Status launch(const PrefillParams& p, int kernel, int d, Sm90Load load = Sm90Load::kAuto,
              Sm90Grid grid = Sm90Grid::kAuto) {
  return d == 64    ? launch_d<64>(p, kernel, load, grid)
         : d == 128 ? launch_d<128>(p, kernel, load, grid)
                    : launch_d<256>(p, kernel, load, grid);
}

struct Case {
  const char* name;
  int head_dim;
  std::vector<int> qo, kv;
  int page;  // page size of a paged cache; 0: contiguous (single when one request, else ragged)
  bool hnd;  // paged layout
  bool causal;
  int window_left;
  // Diagnostics that isolate one GEMM: q = 0 makes S = 0 whatever K's layout, so the output is
  // the mean of V's rows (tests only the P V path); v = identity (kv_len = head_dim, one kv head
  // pattern per head) makes the output P itself (tests only the Q K^T path and the softmax).
  int diag = 0;  // 0 none, 1 q = 0, 2 v = identity
};

template <int D>
int run_case(const Case& c, const Kernel& k) {
  const int kernel = k.kernel;
  const int hq = 4, hk = 2, batch = static_cast<int>(c.qo.size());
  std::mt19937 rng(1234 + D);
  std::normal_distribution<float> nd;
  std::vector<int> qo_indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) qo_indptr[b + 1] = qo_indptr[b] + c.qo[b];
  const int total_q = qo_indptr[batch];
  std::vector<__nv_bfloat16> q(size_t(total_q) * hq * D);
  // (x3 for v = identity: peaky probabilities, so a misplaced one shows as an O(1) error)
  for (auto& x : q) x = __float2bfloat16(c.diag == 1 ? 0.0f : c.diag == 2 ? 3.0f * nd(rng) : nd(rng));
  // Keys per request (token-major, [kv, hk, D]) and the cache built from them.
  std::vector<std::vector<float>> keys(batch), vals(batch);
  for (int b = 0; b < batch; ++b) {
    keys[b].resize(size_t(c.kv[b]) * hk * D);
    vals[b].resize(keys[b].size());
    for (auto& x : keys[b]) x = __bfloat162float(__float2bfloat16(nd(rng)));
    for (auto& x : vals[b]) x = __bfloat162float(__float2bfloat16(nd(rng)));
    if (c.diag == 2) {  // v[t][h][d] = (t == d)
      for (size_t at = 0; at < vals[b].size(); ++at) vals[b][at] = (at / (hk * D)) == (at % D) ? 1.0f : 0.0f;
    }
  }
  const bool paged = c.page > 0, single = !paged && batch == 1;
  const int page = paged ? c.page : (single ? std::max(c.kv[0], 1) : 1);
  std::vector<int> page_indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) page_indptr[b + 1] = page_indptr[b] + (c.kv[b] + page - 1) / page;
  const int num_pages = std::max(page_indptr[batch], 1);
  std::vector<int> indices(num_pages);
  std::iota(indices.begin(), indices.end(), 0);
  if (paged) std::shuffle(indices.begin(), indices.end(), rng);
  // Cache [pages, page, hk, D] (NHD) or [pages, hk, page, D] (HND); unused slots hold NaN so a
  // kernel that lets stale rows into P V fails.
  std::vector<__nv_bfloat16> kc(size_t(num_pages) * page * hk * D, __float2bfloat16(NAN)), vc(kc.size(), kc[0]);
  const int64_t ss = c.hnd ? D : int64_t(hk) * D, hs = c.hnd ? int64_t(page) * D : D, ps = int64_t(page) * hk * D;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < c.kv[b]; ++t)
      for (int h = 0; h < hk; ++h)
        for (int d = 0; d < D; ++d) {
          const int64_t at = indices[page_indptr[b] + t / page] * ps + (t % page) * ss + h * hs + d;
          kc[at] = __float2bfloat16(keys[b][(size_t(t) * hk + h) * D + d]);
          vc[at] = __float2bfloat16(vals[b][(size_t(t) * hk + h) * D + d]);
        }
  if (!paged && !single) {  // ragged: no stale rows; fill the unused tail with zeros
    for (auto* v : {&kc, &vc})
      for (auto& x : *v)
        if (std::isnan(__bfloat162float(x))) x = __float2bfloat16(0.0f);
  }
  // Work list: items of kPrefillQueriesPerItem queries (the plan's tile).
  std::vector<int> wr, wq;
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < c.qo[b]; s += kPrefillQueriesPerItem) wr.push_back(b), wq.push_back(s);
  auto up = [](const void* h, size_t bytes) {
    void* d = nullptr;
    cudaMalloc(&d, std::max<size_t>(bytes, 16));
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
  };
  std::vector<int> kv_len(c.kv);
  PrefillParams p{};
  p.q = up(q.data(), q.size() * 2);
  p.q_stride_n = hq * D;
  p.q_stride_h = D;
  p.qo_indptr = static_cast<int*>(up(qo_indptr.data(), qo_indptr.size() * 4));
  p.kv_len = static_cast<int*>(up(kv_len.data(), kv_len.size() * 4));
  p.kv.k = up(kc.data(), kc.size() * 2);
  p.kv.v = up(vc.data(), vc.size() * 2);
  p.kv.k_page_stride = p.kv.v_page_stride = ps;
  p.kv.k_slot_stride = p.kv.v_slot_stride = ss;
  p.kv.k_head_stride = p.kv.v_head_stride = hs;
  p.kv.page_indptr = static_cast<int*>(up(page_indptr.data(), page_indptr.size() * 4));
  p.kv.page_indices = static_cast<int*>(up(indices.data(), indices.size() * 4));
  p.kv.page_size = page;
  p.num_qo_heads = hq;
  p.num_kv_heads = hk;
  p.work_request = static_cast<int*>(up(wr.data(), wr.size() * 4));
  p.work_q_start = static_cast<int*>(up(wq.data(), wq.size() * 4));
  p.work_capacity = static_cast<int64_t>(wr.size());
  std::vector<__nv_bfloat16> out(q.size(), __float2bfloat16(NAN));
  std::vector<float> lse(size_t(total_q) * hq, NAN);
  p.out = up(out.data(), out.size() * 2);
  p.out_stride_n = hq * D;
  p.out_stride_h = D;
  p.lse = static_cast<float*>(up(lse.data(), lse.size() * 4));
  p.lse_stride_n = hq;
  p.sm_scale = 1.0f / std::sqrt(float(D));
  p.soft_cap = 0.0f;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.kv_contiguous = !paged;
  p.kv_num_pages = num_pages;
  p.kv.num_pages = num_pages;  // the page checks' bounds (attention.h, load_page)
  p.kv.num_indices = static_cast<int64_t>(indices.size());
  p.q_rows = total_q;
  p.kernel = kernel;
  Status st = launch(p, kernel, D, Sm90Load::kAuto, k.grid);
  cudaError_t err = cudaDeviceSynchronize();
  if (!st.ok() || err != cudaSuccess) {
    std::printf("  %-34s %s: FAILED to run: %s %s\n", c.name, k.name, st.message.c_str(), cudaGetErrorString(err));
    return 1;
  }
  cudaMemcpy(out.data(), p.out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), p.lse, lse.size() * 4, cudaMemcpyDeviceToHost);
  double worst = 0, worst_lse = 0;
  int wrow = -1, wcol = -1, bad_nan = 0;
  for (int b = 0; b < batch; ++b) {
    const int off = c.kv[b] - c.qo[b];
    for (int i = 0; i < c.qo[b]; ++i)
      for (int h = 0; h < hq; ++h) {
        const int kh = h / (hq / hk);
        const size_t row = size_t(qo_indptr[b] + i) * hq + h;
        std::vector<double> logit(c.kv[b], -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < c.kv[b]; ++j) {
          const int pos = i + off;
          if (c.causal && j > pos) continue;
          if (c.window_left >= 0 && j < pos - c.window_left) continue;
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(__bfloat162float(q[row * D + d])) * keys[b][(size_t(j) * hk + kh) * D + d];
          logit[j] = s * p.sm_scale;
          mx = std::max(mx, logit[j]);
        }
        double sum = 0;
        std::vector<double> o(D, 0.0);
        for (int j = 0; j < c.kv[b]; ++j) {
          if (logit[j] == -INFINITY) continue;
          const double e = std::exp(logit[j] - mx);
          sum += e;
          for (int d = 0; d < D; ++d) o[d] += e * vals[b][(size_t(j) * hk + kh) * D + d];
        }
        for (int d = 0; d < D; ++d) {
          const double ref = sum > 0 ? o[d] / sum : 0.0;
          const double got = __bfloat162float(out[row * D + d]);
          if (std::isnan(got)) ++bad_nan;
          const double e = std::fabs(got - ref);
          if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e, wrow = static_cast<int>(row / hq), wcol = d;
        }
        const double ref_lse = sum > 0 ? (mx + std::log(sum)) / std::log(2.0) : -INFINITY;
        const double got_lse = lse[row];
        if (std::isinf(ref_lse) ? !(std::isinf(got_lse) && got_lse < 0) : !(std::fabs(got_lse - ref_lse) <= worst_lse))
          worst_lse = std::isinf(ref_lse) ? INFINITY : std::fabs(got_lse - ref_lse);
      }
  }
  const bool ok = worst <= 3e-2 && worst_lse <= 1e-2 && bad_nan == 0;
  std::printf("  %-34s %-8s: max|out-ref| %.2e at (q %d, d %d), max|lse-ref| %.2e, NaN %d  %s\n", c.name, k.name, worst,
              wrow, wcol, worst_lse, bad_nan, ok ? "ok" : "FAIL");
  for (const void* ptr : {p.q, (const void*)p.qo_indptr, (const void*)p.kv_len, p.kv.k, p.kv.v,
                          (const void*)p.kv.page_indptr, (const void*)p.kv.page_indices, (const void*)p.work_request,
                          (const void*)p.work_q_start, (const void*)p.out, (const void*)p.lse})
    cudaFree(const_cast<void*>(ptr));
  return ok ? 0 : 1;
}

int run(const Case& c) {
  int fails = 0;
  for (const Kernel& k : kKernels) {
    if (c.head_dim == 64) fails += run_case<64>(c, k);
    if (c.head_dim == 128) fails += run_case<128>(c, k);
    if (c.head_dim == 256) fails += run_case<256>(c, k);
  }
  return fails;
}

// The issue's shape: single prefill, causal, L = 8192, 32 heads, head_dim 128, bf16. TFLOP/s with
// FLOPs = 4 L^2 H d / 2, best of 20 launches after a warm-up (CUDA events).
void time_issue_shape() {
  constexpr int L = 8192, H = 32, D = 128;
  const size_t n = size_t(L) * H * D;
  void *q, *k, *v, *out;
  cudaMalloc(&q, n * 2), cudaMalloc(&k, n * 2), cudaMalloc(&v, n * 2), cudaMalloc(&out, n * 2);
  std::vector<__nv_bfloat16> h(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (auto& x : h) x = __float2bfloat16(nd(rng));
  cudaMemcpy(q, h.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(k, h.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v, h.data(), n * 2, cudaMemcpyHostToDevice);
  std::vector<int> wr, wq;  // longest first, as the plan orders causal items
  for (int s = L - kPrefillQueriesPerItem; s >= 0; s -= kPrefillQueriesPerItem) wr.push_back(0), wq.push_back(s);
  const int qo_indptr[2] = {0, L}, kv_len[1] = {L}, page_indptr[2] = {0, 1}, indices[1] = {0};
  int *d_qo, *d_kv, *d_pi, *d_idx, *d_wr, *d_wq;
  cudaMalloc(&d_qo, 8), cudaMalloc(&d_kv, 4), cudaMalloc(&d_pi, 8), cudaMalloc(&d_idx, 4);
  cudaMalloc(&d_wr, wr.size() * 4), cudaMalloc(&d_wq, wq.size() * 4);
  cudaMemcpy(d_qo, qo_indptr, 8, cudaMemcpyHostToDevice);
  cudaMemcpy(d_kv, kv_len, 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_pi, page_indptr, 8, cudaMemcpyHostToDevice);
  cudaMemcpy(d_idx, indices, 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_wr, wr.data(), wr.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_wq, wq.data(), wq.size() * 4, cudaMemcpyHostToDevice);
  PrefillParams p{};
  p.q = q, p.q_stride_n = H * D, p.q_stride_h = D, p.qo_indptr = d_qo, p.kv_len = d_kv;
  p.kv.k = k, p.kv.v = v, p.kv.page_size = L;
  p.kv.k_page_stride = p.kv.v_page_stride = int64_t(L) * H * D;
  p.kv.k_slot_stride = p.kv.v_slot_stride = H * D;
  p.kv.k_head_stride = p.kv.v_head_stride = D;
  p.kv.page_indptr = d_pi, p.kv.page_indices = d_idx;
  p.num_qo_heads = p.num_kv_heads = H;
  p.work_request = d_wr, p.work_q_start = d_wq, p.work_capacity = static_cast<int64_t>(wr.size());
  p.out = out, p.out_stride_n = H * D, p.out_stride_h = D;
  p.sm_scale = 1.0f / std::sqrt(float(D)), p.causal = true, p.window_left = -1;
  p.kv_contiguous = true, p.kv_num_pages = 1, p.q_rows = L;
  p.kv.num_pages = 1, p.kv.num_indices = 1;
  const double flops = 4.0 * L * double(L) * H * D / 2;
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::printf("timing: single prefill causal L=%d H=%d d=%d bf16\n", L, H, D);
  for (int kernel : {kPrefillKernelFA2, kPrefillKernelFA3}) {
    Status st = launch(p, kernel, D);
    float best = 1e30f;
    for (int rep = 0; rep < 20 && st.ok(); ++rep) {
      cudaEventRecord(a);
      st = launch(p, kernel, D);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      best = std::min(best, ms);
    }
    if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("  %-12s failed: %s\n", kNames[kernel], st.message.c_str());
      continue;
    }
    std::printf("  %-12s %.3f ms  %.1f TFLOP/s\n", kNames[kernel], best, flops / (best * 1e-3) / 1e12);
  }
  for (void* ptr : {q, k, v, out, (void*)d_qo, (void*)d_kv, (void*)d_pi, (void*)d_idx, (void*)d_wr, (void*)d_wq})
    cudaFree(ptr);
}

// The two KV producers of the sm90a kernel on the same paged cache (batch B x L, default 16 x
// 2048, causal, GQA 32/8, bf16, NHD, pages shuffled): TMA boxes and the cp.async gather, forced;
// or, with `grids`, the two grids (one CTA a work unit, persistent) with the automatic producer.
// The two outputs must be bit-identical (the same tiles reach the same consumers in the same
// order); prints the median and best of 20 launches of each (CUDA events) and returns the number
// of mismatches.
int time_producers(int D, int page, bool grids = false, int B = 16, int L = 2048) {
  constexpr int HQ = 32, HK = 8;
  const int pages_per = (L + page - 1) / page, pages = B * pages_per;
  const size_t nq = size_t(B) * L * HQ * D, nkv = size_t(pages) * page * HK * D;
  std::mt19937 rng(11 + page);
  std::vector<__nv_bfloat16> h(std::max(nq, nkv));  // a hash in [-2, 2): fast for 10^8 elements
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = __float2bfloat16(float((uint32_t(i) * 2654435761u) >> 22) / 256.0f - 2.0f);
  void *q, *k, *v, *out_a, *out_b;
  cudaMalloc(&q, nq * 2), cudaMalloc(&k, nkv * 2), cudaMalloc(&v, nkv * 2);
  cudaMalloc(&out_a, nq * 2), cudaMalloc(&out_b, nq * 2);
  cudaMemcpy(q, h.data(), nq * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(k, h.data(), nkv * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v, h.data() + 1, nkv * 2, cudaMemcpyHostToDevice);
  std::vector<int> qo(B + 1), kv(B, L), pi(B + 1), idx(pages), wr, wq;
  for (int b = 0; b <= B; ++b) qo[b] = b * L, pi[b] = b * pages_per;
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), rng);
  for (int s = L - kPrefillQueriesPerItem; s >= 0; s -= kPrefillQueriesPerItem)  // longest first
    for (int b = 0; b < B; ++b) wr.push_back(b), wq.push_back(s);
  auto up = [](const void* src, size_t bytes) {
    void* d = nullptr;
    cudaMalloc(&d, bytes);
    cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
    return d;
  };
  PrefillParams p{};
  p.q = q, p.q_stride_n = int64_t(HQ) * D, p.q_stride_h = D;
  p.qo_indptr = static_cast<int*>(up(qo.data(), qo.size() * 4));
  p.kv_len = static_cast<int*>(up(kv.data(), kv.size() * 4));
  p.kv.k = k, p.kv.v = v, p.kv.page_size = page;
  p.kv.k_page_stride = p.kv.v_page_stride = int64_t(page) * HK * D;
  p.kv.k_slot_stride = p.kv.v_slot_stride = int64_t(HK) * D;
  p.kv.k_head_stride = p.kv.v_head_stride = D;
  p.kv.page_indptr = static_cast<int*>(up(pi.data(), pi.size() * 4));
  p.kv.page_indices = static_cast<int*>(up(idx.data(), idx.size() * 4));
  p.kv.num_pages = pages, p.kv.num_indices = pages;
  p.num_qo_heads = HQ, p.num_kv_heads = HK;
  p.work_request = static_cast<int*>(up(wr.data(), wr.size() * 4));
  p.work_q_start = static_cast<int*>(up(wq.data(), wq.size() * 4));
  p.work_capacity = static_cast<int64_t>(wr.size());
  p.out_stride_n = int64_t(HQ) * D, p.out_stride_h = D;
  p.sm_scale = 1.0f / std::sqrt(float(D)), p.causal = true, p.window_left = -1;
  p.kv_contiguous = false, p.kv_num_pages = pages, p.q_rows = int64_t(B) * L;
  p.kernel = kPrefillKernelFA3;
  const double flops = B * 4.0 * L * double(L) * HQ * D / 2;
  cudaEvent_t a, e;
  cudaEventCreate(&a), cudaEventCreate(&e);
  const Sm90Load loads[2] = {Sm90Load::kTma, Sm90Load::kGather};
  const Sm90Grid kinds[2] = {Sm90Grid::kPerUnit, Sm90Grid::kPersistent};
  const char* names[2] = {grids ? "per-unit" : "tma", grids ? "persist" : "gather"};
  // The grid A/B names the producer the automatic choice gives this cache.
  const Sm90KvBoxes boxes = D == 64    ? prefill_sm90_boxes<__nv_bfloat16, 64>(p)
                            : D == 128 ? prefill_sm90_boxes<__nv_bfloat16, 128>(p)
                                       : prefill_sm90_boxes<__nv_bfloat16, 256>(p);
  const char* what = !grids ? "producers" : boxes.gather ? "grids (gather)" : "grids (tma)";
  auto run_one = [&](int which) {
    return grids ? launch(p, kPrefillKernelFA3, D, Sm90Load::kAuto, kinds[which])
                 : launch(p, kPrefillKernelFA3, D, loads[which]);
  };
  for (int which = 0; which < 2; ++which) {
    p.out = which ? out_b : out_a;
    Status st = run_one(which);
    std::vector<float> ms(20, 0.0f);
    for (int rep = 0; rep < 20 && st.ok(); ++rep) {
      cudaEventRecord(a);
      st = run_one(which);
      cudaEventRecord(e);
      cudaEventSynchronize(e);
      cudaEventElapsedTime(&ms[rep], a, e);
    }
    if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("  %s B%d L%d d%d page%d %-8s failed: %s\n", what, B, L, D, page, names[which], st.message.c_str());
      continue;
    }
    std::sort(ms.begin(), ms.end());
    std::printf("  %s B%d L%d d%d page%-4d %-8s median %.1f us best %.1f us  %.0f TFLOP/s (median)\n", what, B, L, D,
                page, names[which], ms[10] * 1e3, ms[0] * 1e3, flops / (ms[10] * 1e-3) / 1e12);
  }
  std::vector<uint16_t> ha(nq), hb(nq);
  cudaMemcpy(ha.data(), out_a, nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), out_b, nq * 2, cudaMemcpyDeviceToHost);
  const bool same = std::memcmp(ha.data(), hb.data(), nq * 2) == 0;
  std::printf("  %s B%d L%d d%d page%d: %s and %s outputs %s\n", what, B, L, D, page, names[0], names[1],
              same ? "bit-identical" : "DIFFER");
  for (const void* ptr : {p.q, (const void*)p.qo_indptr, (const void*)p.kv_len, p.kv.k, p.kv.v,
                          (const void*)p.kv.page_indptr, (const void*)p.kv.page_indices, (const void*)p.work_request,
                          (const void*)p.work_q_start, (const void*)out_a, (const void*)out_b})
    cudaFree(const_cast<void*>(ptr));
  return same ? 0 : 1;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s (cc %d.%d)\n", prop.name, prop.major, prop.minor);
  const Case cases[] = {
      // Diagnostics first: if a later case fails, these say which GEMM's layout is wrong.
      {"diag q=0 (P V only) d64", 64, {64}, {128}, 0, false, false, -1, 1},
      {"diag q=0 (P V only) d128", 128, {64}, {128}, 0, false, false, -1, 1},
      {"diag q=0 (P V only) d256", 256, {64}, {128}, 0, false, false, -1, 1},
      {"diag v=I (Q K^T only) d64", 64, {64}, {64}, 0, false, false, -1, 2},
      {"diag v=I (Q K^T only) d128", 128, {64}, {128}, 0, false, false, -1, 2},
      {"diag v=I (Q K^T only) d256", 256, {64}, {256}, 0, false, false, -1, 2},
      // One tile, no masks: S = Q K^T layout (K-major descriptors) and P V (MN-major V).
      {"single 64x64 d128 (one tile)", 128, {64}, {64}, 0, false, false, -1},
      {"single 64x128 d64 (one tile)", 64, {64}, {128}, 0, false, false, -1},
      {"single 64x64 d256 (one tile)", 256, {64}, {64}, 0, false, false, -1},
      {"single 64x640 d128 (pipeline)", 128, {64}, {640}, 0, false, false, -1},
      {"single 200x300 d128 causal", 128, {200}, {300}, 0, false, true, -1},
      {"single 130x130 d64 causal window 37", 64, {130}, {130}, 0, false, true, 37},
      {"single 7x1023 d256 causal", 256, {7}, {1023}, 0, false, true, -1},
      {"paged NHD page16 d128 causal", 128, {100, 1, 64}, {300, 1, 70}, 16, false, true, -1},
      {"paged HND page16 d64", 64, {33, 90}, {130, 200}, 16, true, false, -1},
      {"paged NHD page128 d128 (tile in page)", 128, {70, 5}, {300, 129}, 128, false, true, -1},
      {"paged HND page32 d256 causal", 256, {65, 3}, {150, 40}, 32, true, true, -1},
      {"ragged d128 causal", 128, {70, 1, 200}, {90, 1, 200}, 0, false, true, -1},
      // Pages the TMA boxes cannot tile: the gather producer (cp.async, 128 threads).
      {"paged NHD page1 d128 causal (gather)", 128, {100, 1, 64}, {300, 1, 70}, 1, false, true, -1},
      {"paged HND page8 d64 (gather)", 64, {33, 90}, {130, 200}, 8, true, false, -1},
      {"paged NHD page5 d256 causal (gather)", 256, {65, 3}, {150, 40}, 5, false, true, -1},
      {"paged HND page24 d128 causal (gather)", 128, {130, 2}, {333, 2}, 24, true, true, -1},
      // More CTAs (items x 4 heads) than SMs, in prefill_cta's order across requests.
      {"paged NHD page16 d128 causal, 288 CTAs", 128, std::vector<int>(24, 300), std::vector<int>(24, 333), 16, false,
       true, -1},
      {"ragged d64, 480 CTAs", 64, std::vector<int>(40, 257), std::vector<int>(40, 257), 0, false, false, -1},
  };
  int fails = 0;
  for (const Case& c : cases) fails += run(c);
  std::printf("%s (%d failing)\n", fails ? "FAIL" : "all ok", fails);
  time_issue_shape();
  // TMA boxes against the gather where both can load the cache (pages dividing or a multiple of
  // the tile: 128 keys at head_dim 128, 64 at 256).
  std::printf("timing: the KV producers, batch 16 x 2048 causal, GQA 32/8, bf16\n");
  for (int page : {16, 32, 64, 128}) fails += time_producers(128, page);
  fails += time_producers(64, 16);
  fails += time_producers(256, 16);
  fails += time_producers(256, 32);
  // One CTA a work unit against the persistent grid (one CTA an SM walking the units), the same
  // inputs, the producer the automatic choice gives: the issue's shapes (the single prompt as one
  // request whose page holds it all: TMA, one box a tile; the batch at page 16: the gather), the
  // gather at page 1 and at head_dim 64, and TMA at page 64 (two boxes a chunk); a ragged-length
  // mix is in the cases above. The batch of 4 holds 32 MB of K/V, within the H200's 50 MB L2; 16
  // hold 128 MB: the persistent grid runs all heads of an item together (its deal order) where one
  // CTA a unit runs a GQA group's heads over all requests, so the pair says whether L2 reuse is
  // what separates the grids on a gathered cache.
  std::printf("timing: the grids, causal, GQA 32/8, bf16\n");
  fails += time_producers(128, 8192, true, 1, 8192);
  fails += time_producers(128, 2048, true, 1, 2048);
  fails += time_producers(128, 16, true, 16, 2048);
  fails += time_producers(128, 16, true, 4, 2048);
  fails += time_producers(128, 1, true, 16, 2048);
  fails += time_producers(64, 16, true, 16, 2048);
  fails += time_producers(128, 64, true, 16, 2048);
  std::printf("%s (%d failing, producers and grids included)\n", fails ? "FAIL" : "all ok", fails);
  return fails ? 1 : 0;
}
