// //ops/gemm, host side shared by every backend and target: the tactic list, the support rules of
// each kernel, argument checks, the default-tactic heuristic (the one table, default_tactic()) and
// the rule that picks what a launch runs (choose_tactic()). Plain C++ (no CUDA): the same code
// answers on a CPU-only machine; a compile unit of every :mm, :fp8 and :grouped module.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/math.h"
#include "ops/gemm/gemm.h"

namespace kiln::gemm {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

bool is16(DType t) {
  return t == DType::kBF16 || t == DType::kF16;
}

// Output dtypes the kernels write, for any input dtype: bf16, f16 or f32 (the sm90 16-bit kernels
// only the input's or f32: unsupported()).
bool out_ok(DType out) {
  return out == DType::kBF16 || out == DType::kF16 || out == DType::kF32;
}

// Largest dynamic shared memory of one CTA per arch (bytes): 9.0 / 10.x 227 KB, 8.0 163 KB,
// 8.6 / 8.7 / 8.9 / 12.x 99 KB.
int64_t smem_limit(int arch) {
  if (arch == 90 || arch == 100 || arch == 103) return 227 * 1024;
  if (arch == 80) return 163 * 1024;
  return 99 * 1024;
}

constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kInt32Max = 0x7fffffff;

// One table of the sm90 kernels' shapes: (tile_n, stages) for each 128-byte K tile.
struct Sm90Shape {
  int32_t tile_n, stages;
};
constexpr Sm90Shape kSm90Shapes[] = {{128, 6}, {256, 4}};

}  // namespace

std::string tactic_name(const Tactic& t) {
  std::string s = kernel_name(t.kernel);
  switch (t.kernel) {
    case Kernel::kSm90:
      return s + "_" + str(t.tile_m) + "x" + str(t.tile_n) + "x" + str(t.tile_k) + "_s" + str(t.stages) + "_c" +
             str(t.cluster_m);
    case Kernel::kSm80:
      return s + "_" + str(t.tile_m) + "x" + str(t.tile_n) + "x" + str(t.tile_k) + "_s" + str(t.stages);
    case Kernel::kSmallM:
      return s + "_" + str(t.tile_m) + "x" + str(t.tile_n) + "_k" + str(t.split_k);
    case Kernel::kFallback:
      return s;
  }
  return s;
}

const std::vector<Tactic>& all_tactics() {
  static const std::vector<Tactic> list = [] {
    std::vector<Tactic> v;
    for (int32_t tile_k : {64, 128})  // 16-bit inputs, fp8 inputs
      for (const Sm90Shape& s : kSm90Shapes)
        for (int32_t cluster : {1, 2}) v.push_back({Kernel::kSm90, 128, s.tile_n, tile_k, s.stages, cluster, 1});
    for (int32_t stages : {3, 4}) v.push_back({Kernel::kSm80, 128, 128, 64, stages, 1, 1});
    // Small-M shapes whose shared memory fits a CTA on some arch (64 x 64 x 8 warps needs 256 KB).
    for (int32_t tile_m : {8, 16, 32, 64})
      for (int32_t tile_n : {32, 64})
        for (int32_t split : {4, 8})
          if (small_m::smem_bytes(tile_m / 8, tile_n / 16, split) <= 227 * 1024) {
            v.push_back({Kernel::kSmallM, tile_m, tile_n, 32, 0, 1, split});
          }
    v.push_back({Kernel::kFallback, 0, 0, 0, 0, 1, 1});
    return v;
  }();
  return list;  // <= kMaxTactics entries (tests/ops/gemm/test_gemm.py checks it)
}

std::string invalid(const GemmParams& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) {
    return "sizes must be >= 0, got m " + str(p.m) + ", n " + str(p.n) + ", k " + str(p.k) + ", batch " + str(p.batch);
  }
  if (p.m == 0 || p.n == 0 || p.batch == 0) return "";
  if (!(is16(p.a_dtype) && p.b_dtype == p.a_dtype) && !(is_fp8(p.a_dtype) && is_fp8(p.b_dtype))) {
    return std::string("unsupported input dtypes a ") + dtype_name(p.a_dtype) + ", b " + dtype_name(p.b_dtype) +
           " (bf16 x bf16, f16 x f16, or fp8 e4m3/e5m2 x e4m3/e5m2)";
  }
  if (!out_ok(p.out_dtype)) {
    return std::string("out dtype ") + dtype_name(p.out_dtype) + " is not supported (bf16, f16 or f32)";
  }
  if (is_fp8(p.a_dtype) == (p.scale_mode == ScaleMode::kNone)) {
    return is_fp8(p.a_dtype) ? "fp8 inputs need scales (per-tensor or groupwise)" : "scales are only for fp8 inputs";
  }
  if (p.scale_mode != ScaleMode::kNone && (p.a_scale == nullptr || p.b_scale == nullptr)) {
    return "a_scale and b_scale must be given";
  }
  if (p.scale_mode == ScaleMode::kGroupwise && (p.k % kScaleBlock != 0 || p.batch != 1)) {
    return "groupwise scaling needs k a multiple of 128 (got " + str(p.k) + ") and batch 1 (got " + str(p.batch) + ")";
  }
  // An empty a or b (k == 0) may have no storage at all; out has m x n > 0 elements here.
  if (p.out == nullptr || (p.k > 0 && (p.a == nullptr || p.b == nullptr))) return "a, b and out must be non-null";
  if (p.k > 0 && p.lda < p.k) return "lda (" + str(p.lda) + ") must be >= k (" + str(p.k) + ")";
  const int64_t b_row = p.b_layout == BLayout::kKMajor ? p.k : p.n;
  if (b_row > 0 && p.ldb < b_row) return "ldb (" + str(p.ldb) + ") must be >= " + str(b_row);
  if (p.ldo < p.n) return "ldo (" + str(p.ldo) + ") must be >= n (" + str(p.n) + ")";
  return "";
}

std::string invalid(const GroupedGemmParams& p) {
  if (p.num_groups < 0 || p.n < 0 || p.k < 0 || p.total_rows < 0 || p.num_weights < 0) {
    return "sizes must be >= 0";
  }
  if (p.num_groups == 0 || p.n == 0 || p.total_rows == 0) return "";
  if (!is16(p.a_dtype) && p.a_dtype != DType::kE4M3) {
    return std::string("grouped GEMM takes bf16, f16 or e4m3 inputs, got ") + dtype_name(p.a_dtype);
  }
  if (!out_ok(p.out_dtype) || (is_fp8(p.a_dtype) && p.out_dtype == DType::kF32)) {
    return std::string("out dtype ") + dtype_name(p.out_dtype) + " is not supported for " + dtype_name(p.a_dtype) +
           " (16-bit: bf16, f16 or f32; e4m3: bf16 or f16)";
  }
  if (is_fp8(p.a_dtype) != (p.scale_mode == ScaleMode::kGroupwise) || p.scale_mode == ScaleMode::kPerTensor) {
    return is_fp8(p.a_dtype) ? "fp8 grouped GEMM needs groupwise scales" : "scales are only for fp8 inputs";
  }
  if (p.scale_mode == ScaleMode::kGroupwise) {
    if (p.a_scale == nullptr || p.b_scale == nullptr) return "a_scale and b_scale must be given";
    if (p.k % kScaleBlock != 0) return "groupwise scaling needs k a multiple of 128 (got " + str(p.k) + ")";
  }
  if (p.out == nullptr || p.bounds == nullptr || (p.k > 0 && (p.a == nullptr || p.b == nullptr))) {
    return "x, weights, out and the segment bounds must be non-null";
  }
  if (p.num_weights <= 0) return "num_weights must be >= 1";
  if (p.k > 0 && p.lda < p.k) return "lda (" + str(p.lda) + ") must be >= k (" + str(p.k) + ")";
  if (p.ldo < p.n) return "ldo (" + str(p.ldo) + ") must be >= n (" + str(p.n) + ")";
  return "";
}

std::string unsupported(const GemmParams& p, const Tactic& t, int arch) {
  if (std::string why = invalid(p); !why.empty()) return why;
  const int64_t ea = dtype_bytes(p.a_dtype), eo = dtype_bytes(p.out_dtype);
  const bool kmajor = p.b_layout == BLayout::kKMajor;
  switch (t.kernel) {
    case Kernel::kFallback:
      if (ceil_div<int64_t>(p.n, 64) > kMaxGridY || p.batch > kMaxGridY)
        return "n or batch too large for the fallback grid";
      return "";
    case Kernel::kSm90: {
      if (arch != 90) return "needs a 9.0 device and sm_90a code (arch " + str(arch) + ")";
      const bool shape_listed = std::any_of(std::begin(kSm90Shapes), std::end(kSm90Shapes), [&](const Sm90Shape& s) {
        return s.tile_n == t.tile_n && s.stages == t.stages;
      });
      if (t.tile_m != 128 || !shape_listed || (t.cluster_m != 1 && t.cluster_m != 2)) return "not an sm90 tactic";
      if (t.tile_k * ea != 128) return "tile_k must be 128 bytes of the input dtype (" + str(128 / ea) + ")";
      if (is16(p.a_dtype) && is16(p.out_dtype) && p.out_dtype != p.a_dtype) {
        return "the sm90 16-bit kernels write the input dtype or f32";  // the others convert any
      }
      if (is_fp8(p.a_dtype)) {
        if (!kmajor) return "fp8 needs a K-major (column-major) b";
        if (p.b_dtype != DType::kE4M3 || p.out_dtype == DType::kF32) {
          return "the sm90 fp8 kernels take e4m3 or e5m2 a, e4m3 b, bf16 or f16 out";
        }
      }
      if (p.scale_mode == ScaleMode::kGroupwise && t.tile_n != 128) return "groupwise scaling needs tile_n 128";
      if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.out)) return "a, b and out must be 16-byte aligned";
      if ((p.lda * ea) % 16 || (p.ldb * ea) % 16 || (p.ldo * eo) % 16) {
        return "row strides must be multiples of 16 bytes (lda " + str(p.lda) + ", ldb " + str(p.ldb) + ", ldo " +
               str(p.ldo) + ")";
      }
      if (p.batch > 1 &&
          ((p.a_batch_stride * ea) % 16 || (p.b_batch_stride * ea) % 16 || (p.out_batch_stride * eo) % 16 ||
           p.a_batch_stride <= 0 || p.out_batch_stride <= 0 || p.b_batch_stride <= 0)) {
        return "batch strides must be positive multiples of 16 bytes";
      }
      if (p.m > kInt32Max || p.n > kInt32Max || p.k > kInt32Max || p.batch > kInt32Max) return "sizes >= 2^31";
      return "";
    }
    case Kernel::kSm80: {
      if (arch < 80) return "needs sm80+ (arch " + str(arch) + ")";
      if (t.tile_m != 128 || t.tile_n != 128 || t.tile_k != 64 || (t.stages != 3 && t.stages != 4)) {
        return "not an sm80 tactic";
      }
      if (t.stages * 32 * 1024 > smem_limit(arch)) return "stages do not fit in shared memory on arch " + str(arch);
      if (!is16(p.a_dtype)) return "16-bit inputs only";
      if (!aligned16(p.a) || !aligned16(p.b)) return "a and b must be 16-byte aligned";
      if (p.k % 8 || p.lda % 8 || p.ldb % 8) return "k, lda and ldb must be multiples of 8";
      if (!kmajor && p.n % 8) return "an N-major b needs n a multiple of 8";
      if (p.batch > 1 && (p.a_batch_stride % 8 || p.b_batch_stride % 8)) return "batch strides must be multiples of 8";
      if (ceil_div<int64_t>(p.m, 128) > kInt32Max || ceil_div<int64_t>(p.n, 128) > kMaxGridY || p.batch > kMaxGridY) {
        return "grid too large";
      }
      return "";
    }
    case Kernel::kSmallM: {
      if (arch < 80) return "needs sm80+ (arch " + str(arch) + ")";
      const bool listed =
          std::any_of(all_tactics().begin(), all_tactics().end(), [&](const Tactic& o) { return o == t; });
      if (!listed) return "not a small-m tactic";
      if (p.m > t.tile_m) return "m " + str(p.m) + " > tile_m " + str(t.tile_m);
      if (small_m::smem_bytes(t.tile_m / 8, t.tile_n / 16, t.split_k) > smem_limit(arch)) {
        return "needs " + str(small_m::smem_bytes(t.tile_m / 8, t.tile_n / 16, t.split_k)) +
               " bytes of shared memory, more than arch " + str(arch) + " gives a CTA";
      }
      if (!is16(p.a_dtype)) return "16-bit inputs only";
      if (!kmajor) return "needs a K-major b (the [n, k] weight)";
      if (!aligned16(p.a) || !aligned16(p.b)) return "a and b must be 16-byte aligned";
      if (p.k % 8 || p.lda % 8 || p.ldb % 8) return "k, lda and ldb must be multiples of 8";
      if (p.batch > 1 && (p.a_batch_stride % 8 || p.b_batch_stride % 8)) return "batch strides must be multiples of 8";
      if (ceil_div(p.n, int64_t(t.tile_n)) > kInt32Max || p.batch > kMaxGridY) return "grid too large";
      return "";
    }
  }
  return "unknown kernel";
}

std::string unsupported(const GroupedGemmParams& p, const Tactic& t, int arch) {
  if (std::string why = invalid(p); !why.empty()) return why;
  const int64_t ea = dtype_bytes(p.a_dtype), eo = dtype_bytes(p.out_dtype);
  switch (t.kernel) {
    case Kernel::kFallback:
      if (ceil_div<int64_t>(p.n, 64) > kMaxGridY) return "n too large for the fallback grid";
      return "";
    case Kernel::kSm90: {
      GemmParams d;  // the dense rules on one segment's shapes
      d.m = p.total_rows, d.n = p.n, d.k = p.k, d.batch = 1;
      d.a = p.a, d.a_dtype = d.b_dtype = p.a_dtype, d.lda = p.lda;
      d.b = p.b, d.b_layout = p.b_layout, d.ldb = p.ldb;
      d.out = p.out, d.out_dtype = p.out_dtype, d.ldo = p.ldo;
      d.scale_mode = p.scale_mode, d.a_scale = p.a_scale, d.b_scale = p.b_scale;
      if (std::string why = unsupported(d, t, arch); !why.empty()) return why;
      if (t.cluster_m != 1) return "grouped GEMM runs without clusters";
      if ((p.n * eo) % 16) return "grouped GEMM needs n * sizeof(out) a multiple of 16 bytes";
      if (p.num_weights > 1 && ((p.b_weight_stride * ea) % 16 || p.b_weight_stride <= 0)) {
        return "the weight stride must be a positive multiple of 16 bytes";
      }
      if (p.total_rows > kInt32Max) return "total_rows >= 2^31";
      return "";
    }
    default:
      return std::string("grouped GEMM has no ") + kernel_name(t.kernel) + " kernel";
  }
}

namespace {

// choose_tactic() for either kind of problem.
template <class P>
int choose(const P& p, int requested, uint64_t blocked, bool strict, int arch, std::string* why,
           const std::vector<Tactic>& candidates, const Tactic& fallback_default) {
  const std::vector<Tactic>& all = all_tactics();
  auto index_of = [&](const Tactic& t) {
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] == t) return int(i);
    return -1;
  };
  auto is_blocked = [&](int i) { return i >= 0 && i < kMaxTactics && ((blocked >> i) & 1u) != 0; };
  if (std::string bad = invalid(p); !bad.empty()) {
    *why = bad;
    return -1;
  }
  if (requested >= int(all.size())) {
    *why = "tactic index " + str(requested) + " is not a tactic (there are " + str(int64_t(all.size())) + ")";
    return -1;
  }
  if (requested >= 0) {
    const std::string no = unsupported(p, all[size_t(requested)], arch);
    if (no.empty() && !is_blocked(requested)) return requested;
    if (strict) {
      *why = "tactic " + tactic_name(all[size_t(requested)]) + (no.empty() ? " is blocklisted" : ": " + no);
      return -1;
    }
  }
  const int d = index_of(fallback_default);
  if (d >= 0 && !is_blocked(d) && unsupported(p, fallback_default, arch).empty()) return d;
  for (const Tactic& t : candidates) {
    const int i = index_of(t);
    if (!is_blocked(i)) return i;
  }
  *why = "every tactic that can run this problem is blocklisted (KILN_TACTIC_BLOCKLIST, docs/gemm.md)";
  return -1;
}

}  // namespace

int choose_tactic(const GemmParams& p, int requested, uint64_t blocked, bool strict, int arch, std::string* why) {
  if (!invalid(p).empty()) return choose(p, requested, blocked, strict, arch, why, {}, Tactic{});
  return choose(p, requested, blocked, strict, arch, why, gemm_tactics(p, arch), default_tactic(p, arch));
}

int choose_tactic(const GroupedGemmParams& p, int requested, uint64_t blocked, bool strict, int arch,
                  std::string* why) {
  if (!invalid(p).empty()) return choose(p, requested, blocked, strict, arch, why, {}, Tactic{});
  return choose(p, requested, blocked, strict, arch, why, grouped_gemm_tactics(p, arch),
                default_grouped_tactic(p, arch));
}

std::vector<Tactic> gemm_tactics(const GemmParams& p, int arch) {
  std::vector<Tactic> v;
  for (const Tactic& t : all_tactics())
    if (unsupported(p, t, arch).empty()) v.push_back(t);
  return v;
}

std::vector<Tactic> grouped_gemm_tactics(const GroupedGemmParams& p, int arch) {
  std::vector<Tactic> v;
  for (const Tactic& t : all_tactics())
    if (unsupported(p, t, arch).empty()) v.push_back(t);
  return v;
}

// ---- the default-tactic heuristic (one table) --------------------------------------------------
//
//   kernel    when                                             shape
//   kSm90     9.0 + sm_90a, 32 < m <= 64                       sm90_choice() (the TMA weight stream
//                                                              beat the small-M kernel at 5 of the
//                                                              7 issue shapes at m = 64)
//   kSmallM   m <= 64, 16-bit, K-major b (decode GEMV)         kSmallMTable by n, tile_m by m
//   kSm90     9.0 + sm_90a, TMA rules hold                     sm90_choice(): fewest tile waves
//   kSm80     sm80+, 16-byte rows                              128 x 128 x 64, 3 stages
//   kFallback otherwise
// Measured basis (every tactic timed side by side): docs/perf/gemm.md.
namespace {

// Small M: tile_m = the smallest of 8, 16, 32, 64 >= m; 32 weight rows a block and 8 warps for
// n <= 4096 (64-row blocks leave most SMs idle there: 64 blocks), else 64 rows, with 8 warps from
// n > 16384 and 4 below (64 x 64 takes 4: 8 do not fit).
struct SmallMRow {
  int64_t max_n;
  int32_t tile_n, split_k;
};
constexpr SmallMRow kSmallMTable[] = {
    {4096, 32, 8},
    {16384, 64, 4},
    {INT64_MAX, 64, 8},
};

Tactic small_m_choice(const GemmParams& p) {
  const int32_t tile_m = p.m <= 8 ? 8 : p.m <= 16 ? 16 : p.m <= 32 ? 32 : 64;
  for (const SmallMRow& r : kSmallMTable) {
    if (p.n > r.max_n) continue;
    int32_t split = r.split_k;
    if (small_m::smem_bytes(tile_m / 8, r.tile_n / 16, split) > 227 * 1024) split = 4;
    return Tactic{Kernel::kSmallM, tile_m, r.tile_n, 32, 0, 1, split};
  }
  return Tactic{};
}

// Relative time of one 128 x BN tile per unit of work: 128 x 128 tiles run ~7% slower per FLOP
// (more shared-memory traffic per wgmma, two epilogues per 256 columns).
constexpr double kTileCost128 = 1.07;

// Cluster 1: the 2-CTA B multicast never paid on the H200 (docs/perf/gemm.md: equal or slower at
// every issue shape), so the default never takes it; the tuner may.
Tactic sm90_choice(const GemmParams& p, int num_sms, int32_t tile_k, bool groupwise) {
  const int64_t mt = ceil_div<int64_t>(p.m, 128);
  Tactic best{};
  double best_cost = 1e300;
  for (const Sm90Shape& s : kSm90Shapes) {
    if (groupwise && s.tile_n != 128) continue;
    const int64_t tiles = mt * ceil_div<int64_t>(p.n, s.tile_n) * p.batch;
    const double waves = double(ceil_div<int64_t>(tiles, num_sms));
    const double cost = waves * (s.tile_n / 256.0) * (s.tile_n == 128 ? kTileCost128 : 1.0);
    if (cost < best_cost - 1e-9) best_cost = cost, best = {Kernel::kSm90, 128, s.tile_n, tile_k, s.stages, 1, 1};
  }
  return best;
}

}  // namespace

Tactic default_tactic(const GemmParams& p, int arch) {
  constexpr int kSms = 132;  // H100 SXM / H200: the wave count only ranks tiles
  const int32_t tile_k = int32_t(128 / dtype_bytes(p.a_dtype));
  const bool groupwise = p.scale_mode == ScaleMode::kGroupwise;
  if (arch == 90 && p.m > 32 && p.m <= 64) {
    const Tactic t = sm90_choice(p, kSms, tile_k, groupwise);
    if (unsupported(p, t, arch).empty()) return t;
  }
  if (p.m <= 64) {
    const Tactic t = small_m_choice(p);
    if (unsupported(p, t, arch).empty()) return t;
  }
  if (arch == 90) {
    const Tactic t = sm90_choice(p, kSms, tile_k, groupwise);
    if (unsupported(p, t, arch).empty()) return t;
  }
  const Tactic sm80{Kernel::kSm80, 128, 128, 64, 3, 1, 1};
  if (unsupported(p, sm80, arch).empty()) return sm80;
  return Tactic{Kernel::kFallback, 0, 0, 0, 0, 1, 1};
}

Tactic default_grouped_tactic(const GroupedGemmParams& p, int arch) {
  // Segments are ~tokens x top_k / experts rows each: 128 x 256 unless n is narrow.
  const Tactic wide{Kernel::kSm90, 128, 256, int32_t(128 / dtype_bytes(p.a_dtype)), 4, 1, 1};
  const Tactic narrow{Kernel::kSm90, 128, 128, int32_t(128 / dtype_bytes(p.a_dtype)), 6, 1, 1};
  if (p.n > 128 && unsupported(p, wide, arch).empty()) return wide;
  if (unsupported(p, narrow, arch).empty()) return narrow;
  return Tactic{Kernel::kFallback, 0, 0, 0, 0, 1, 1};
}

}  // namespace kiln::gemm
