// The GEMM contract: parameter structs, tactics and entry points of the //ops/gemm targets (:mm,
// :fp8, :grouped; docs/gemm.md). Framework free: raw device pointers, int64_t sizes and strides in
// elements, kiln::Status results, no torch, pybind11 or DLPack.
//
//   out[b, i, j] = alpha * sum_k A[b, i, k] * B[b, k, j]        (mm: batch = 1; bmm: batch > 1)
//
//   A    [m, k] row-major: A(i, k) at a[b * a_batch_stride + i * lda + k]
//   B    [k, n], one of two layouts (BLayout):
//          kKMajor: B(k, j) at b[b * b_batch_stride + j * ldb + k]   "column-major [k, n]": the
//                   transpose view of an [n, k] weight, what linear layers hold (w.t())
//          kNMajor: B(k, j) at b[b * b_batch_stride + k * ldb + j]   row-major [k, n]
//   out  [m, n] row-major: out(i, j) at out[b * out_batch_stride + i * ldo + j]
//
// dtypes: bf16 x bf16 or f16 x f16 in, bf16/f16/f32 out; fp8 (e4m3 x e4m3, e5m2 x e4m3, ...) in,
// bf16/f16/f32 out, with alpha from the scales (ScaleMode). Accumulation is always float32.
//
// Grouped GEMM (segment GEMM, MoE / LoRA): rows [lo_s, hi_s) of x times weight w[e_s]:
//   out[i, j] = sum_k x[i, k] * W_{e_s}(k, j)   for lo_s <= i < hi_s, e_s = weight_indices[s] (or s)
// (16-bit x and weights; fp8 e4m3 with groupwise scales, the K sum in 128-wide blocks each scaled
// by a_scale(i, kb) * b_scale(e_s, j / 128, kb): :fp8_grouped)
// with the segment bounds either FlashInfer's seg_indptr (num_groups + 1 entries, lo_s =
// indptr[s], hi_s = indptr[s + 1]) or torch._grouped_mm's offs (num_groups cumulative row ends,
// lo_0 = 0). Rows of out outside every segment are not written.
//
// Index errors (ops/common/device_error.h): the segment bounds and weight indices are read on the
// device, so they are checked where they are read (check_segment): a segment that starts below 0
// or after its end, ends past total_rows, or names a weight outside [0, num_weights) is skipped
// (its rows are not written) and recorded in LaunchContext::errors (kSegmentStart, kSegmentEnd,
// kWeightIndex); the host backend returns Status::IndexError before it writes anything.
//
// Kernels (the Tactic picks one; gemm_tactics() lists those that serve a problem):
//   kSm90     warp-specialised TMA + wgmma, persistent, optional 2-CTA cluster with B multicast
//             (gemm_sm90.cuh); 9.0 devices, sm_90a code. 16-byte aligned pointers and strides.
//   kSm80     mma.sync + ldmatrix + cp.async tiles (gemm_sm80.cuh); sm80+, 16-bit inputs, 16-byte
//             aligned pointers and row strides.
//   kSmallM   decode GEMV-style mma.sync kernel streaming a K-major B with 16-byte loads, split-K
//             inside a CTA (gemm_sm80.cuh); m <= 64, 16-bit inputs.
//   kFallback plain tiled FMA kernel (gemm_fallback.cuh): any shape, stride, alignment, dtype.
// The host backend (gemm_host.cc) accepts the same tactics under the same rules, as for a 9.0
// device with sm_90a code (kHostArch), and runs float32 loops for every one of them: the CPU runs
// the tactic machinery (choice, blocklist, autotuner) that a GPU runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/device_error.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::gemm {

// Index errors of the GEMM family (ops/common/device_error.h): codes and messages.
enum class ErrorCode : int64_t {
  kSegmentEnd = error_code("gemm", 1),    // a grouped GEMM's segment ends past the rows of its input
  kSegmentStart = error_code("gemm", 2),  // a segment starts below 0 or after its own end
  kWeightIndex = error_code("gemm", 3),   // weight_indices[s] is not a weight of the grouped GEMM
};
inline constexpr ErrorText kErrorTexts[] = {
    {int64_t(ErrorCode::kSegmentEnd),
     "segment {position} ends at row {value}, past the {bound} rows of the input: the segment bounds "
     "(seg_indptr, seg_lens or offs) do not fit it"},
    {int64_t(ErrorCode::kSegmentStart),
     "segment {position} starts at row {value}, outside [0, {bound}] (0 to its own end): segment bounds "
     "must start at 0 and never decrease"},
    {int64_t(ErrorCode::kWeightIndex), "weight_indices[{position}] = {value} is not a weight: valid are [0, {bound})"},
};
KILN_REGISTER_ERROR_TEXTS(kErrorTexts)

enum class DType : int32_t { kBF16, kF16, kF32, kE4M3, kE5M2 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kE4M3:
      return "e4m3";
    case DType::kE5M2:
      return "e5m2";
  }
  return "?";
}

KILN_HOST_DEVICE constexpr int64_t dtype_bytes(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kE4M3 || t == DType::kE5M2) ? 1 : 2;
}

KILN_HOST_DEVICE constexpr bool is_fp8(DType t) {
  return t == DType::kE4M3 || t == DType::kE5M2;
}

enum class BLayout : int32_t {
  kKMajor,  // B(k, j) at b[j * ldb + k]
  kNMajor,  // B(k, j) at b[k * ldb + j]
};

enum class ScaleMode : int32_t {
  kNone,       // 16-bit inputs: alpha = 1
  kPerTensor,  // fp8: alpha = a_scale[0] * b_scale[0] (device pointers to one float each)
  // fp8, DeepSeek-V3 block scaling, k a multiple of 128: the K sum runs in blocks of 128 and
  // block kb's partial of out(i, j) is multiplied by a_scale(i, kb) * b_scale(j / 128, kb):
  //   a_scale(i, kb)  at a_scale[i * a_scale_stride_m + kb * a_scale_stride_k]
  //   b_scale(jb, kb) at b_scale[jb * b_scale_stride_n + kb * b_scale_stride_k]
  // FlashInfer's scale_major_mode "MN": a_scale [k/128, m] (stride_m 1, stride_k m), b_scale
  // [k/128, n/128]; "K": a_scale [m, k/128] (either stride order), b_scale [n/128, k/128].
  kGroupwise,
};

constexpr int64_t kScaleBlock = 128;  // groupwise scale granularity along k and n (and 1 along m)

struct GemmParams {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;

  const void* a = nullptr;
  DType a_dtype = DType::kBF16;
  int64_t lda = 0;
  int64_t a_batch_stride = 0;

  const void* b = nullptr;
  DType b_dtype = DType::kBF16;
  BLayout b_layout = BLayout::kKMajor;
  int64_t ldb = 0;
  int64_t b_batch_stride = 0;

  void* out = nullptr;
  DType out_dtype = DType::kBF16;
  int64_t ldo = 0;
  int64_t out_batch_stride = 0;

  ScaleMode scale_mode = ScaleMode::kNone;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int64_t a_scale_stride_m = 0, a_scale_stride_k = 0;
  int64_t b_scale_stride_n = 0, b_scale_stride_k = 0;
};

enum class IndexType : int32_t { kInt32, kInt64 };

struct GroupedGemmParams {
  int64_t num_groups = 0;  // segments
  int64_t n = 0, k = 0;
  int64_t total_rows = 0;  // rows of x and out; every segment lies inside [0, total_rows)

  const void* a = nullptr;  // x [total_rows, k], row stride lda
  DType a_dtype = DType::kBF16;
  int64_t lda = 0;

  // Segment bounds in the backend's memory: seg_indptr [num_groups + 1] (bounds_are_ends =
  // false) or offs [num_groups] (true). From 0, non-decreasing, last <= total_rows: checked where
  // they are read (check_segment below).
  const void* bounds = nullptr;
  IndexType bounds_type = IndexType::kInt64;
  bool bounds_are_ends = false;

  // Weights [num_weights] x B [k, n] in either layout, weight e at b + e * b_weight_stride.
  const void* b = nullptr;
  BLayout b_layout = BLayout::kKMajor;
  int64_t ldb = 0;
  int64_t b_weight_stride = 0;
  int64_t num_weights = 0;
  const void* weight_indices = nullptr;  // [num_groups], or null: segment s uses weight s
  IndexType weight_indices_type = IndexType::kInt64;

  void* out = nullptr;  // [total_rows, n], row stride ldo
  DType out_dtype = DType::kBF16;
  int64_t ldo = 0;

  // fp8 (//ops/gemm:fp8_grouped, x and weights e4m3): kGroupwise only, k a multiple of 128. Row
  // i's 128-wide k block kb of x has a_scale(i, kb); weight e's 128 x 128 block (jb, kb) has
  // b_scale(e, jb, kb) (a per-weight scale is the same with stride_n = stride_k = 0):
  //   a_scale(i, kb)     at a_scale[i * a_scale_stride_m + kb * a_scale_stride_k]
  //   b_scale(e, jb, kb) at b_scale[e * b_scale_stride_w + jb * b_scale_stride_n + kb * b_scale_stride_k]
  ScaleMode scale_mode = ScaleMode::kNone;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int64_t a_scale_stride_m = 0, a_scale_stride_k = 0;
  int64_t b_scale_stride_w = 0, b_scale_stride_n = 0, b_scale_stride_k = 0;
};

// Segment s of a grouped GEMM: rows [lo, hi) and its weight, or ok = false when its bounds or
// weight index are invalid (then it has no rows: nothing is computed or written for it). Read by
// the CUDA kernels and the host backend alike; `index` reads entry i of an int32/int64 array.
struct Segment {
  int64_t lo, hi;
  int64_t weight;
  bool ok;
};

KILN_HOST_DEVICE int64_t load_index(const void* p, IndexType t, int64_t i) {
  return t == IndexType::kInt64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}

// The segment s, checked: a bad one is recorded in `errors` (when non-null: the device's record,
// ops/common/device_error.h) and comes back with ok = false and no rows.
KILN_HOST_DEVICE Segment check_segment(const GroupedGemmParams& g, int64_t s, int64_t* errors) {
  Segment r;
  if (g.bounds_are_ends) {
    r.lo = s == 0 ? 0 : load_index(g.bounds, g.bounds_type, s - 1);
    r.hi = load_index(g.bounds, g.bounds_type, s);
  } else {
    r.lo = load_index(g.bounds, g.bounds_type, s);
    r.hi = load_index(g.bounds, g.bounds_type, s + 1);
  }
  r.weight = g.weight_indices == nullptr ? s : load_index(g.weight_indices, g.weight_indices_type, s);
  r.ok = false;
  if (r.lo < 0 || r.lo > r.hi) {
    record_error(errors, ErrorCode::kSegmentStart, s, r.lo, r.hi);
  } else if (r.hi > g.total_rows) {
    record_error(errors, ErrorCode::kSegmentEnd, s, r.hi, g.total_rows);
  } else if (r.weight < 0 || r.weight >= g.num_weights) {
    record_error(errors, ErrorCode::kWeightIndex, s, r.weight, g.num_weights);
  } else {
    r.ok = true;
  }
  if (!r.ok) r.lo = r.hi = 0;
  return r;
}

enum class Kernel : int32_t { kSm90, kSm80, kSmallM, kFallback };

inline const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kSm90:
      return "sm90";
    case Kernel::kSm80:
      return "sm80";
    case Kernel::kSmallM:
      return "small_m";
    case Kernel::kFallback:
      return "fallback";
  }
  return "?";
}

// A run-time choice of kernel and its shape, made by the caller (autotuner) or default_tactic().
//   kSm90:     CTA tile tile_m x tile_n x tile_k (128 x {128, 256} x 128 bytes of K), `stages`
//              shared-memory stages, cluster_m CTAs per cluster along M sharing B by multicast.
//   kSm80:     CTA tile tile_m x tile_n x tile_k, `stages` cp.async stages.
//   kSmallM:   tile_m = rows of A per CTA (8, 16, 32, 64: m <= tile_m), tile_n = rows of the
//              [n, k] weight per CTA block (32 or 64), split_k = warps splitting K inside the CTA.
//   kFallback: no parameters.
struct Tactic {
  Kernel kernel = Kernel::kFallback;
  int32_t tile_m = 0, tile_n = 0, tile_k = 0;
  int32_t stages = 0;
  int32_t cluster_m = 1;
  int32_t split_k = 1;

  bool operator==(const Tactic& o) const {
    return kernel == o.kernel && tile_m == o.tile_m && tile_n == o.tile_n && tile_k == o.tile_k && stages == o.stages &&
           cluster_m == o.cluster_m && split_k == o.split_k;
  }
};

// Shared memory of the small-M kernel <MT = tile_m / 8, R = tile_n / 16, WK = split_k>: a per-thread
// cp.async ring of 16-byte chunks (2 R of the weight, MT of x per 32-wide k slice) as deep as fits
// in 96 KB (2..8 slices), plus the split-K reduction buffer. One formula for the kernel
// (gemm_sm80.cuh) and the support rule (gemm_tactics.cc).
namespace small_m {
constexpr int kRingBudget = 96 * 1024;
constexpr int slice_bytes(int mt, int r, int wk) {
  return (2 * r + mt) * 16 * wk * 32;
}
constexpr int stages(int mt, int r, int wk) {
  return kRingBudget / slice_bytes(mt, r, wk) < 2   ? 2
         : kRingBudget / slice_bytes(mt, r, wk) > 8 ? 8
                                                    : kRingBudget / slice_bytes(mt, r, wk);
}
constexpr int64_t ring_bytes(int mt, int r, int wk) {
  return int64_t(stages(mt, r, wk)) * slice_bytes(mt, r, wk);
}
constexpr int64_t smem_bytes(int mt, int r, int wk) {
  return ring_bytes(mt, r, wk) + int64_t(wk) * r * mt * 4 * 32 * int64_t(sizeof(float));
}
}  // namespace small_m

// "sm90_128x256x64_s4_c2", "small_m_16x32_k8", "fallback": stable names for caches and logs.
std::string tactic_name(const Tactic& t);

// Every tactic any kernel of this library implements, in a fixed order (the autotuner's space):
// a tactic's index in it is what the bindings pass around; at most kMaxTactics (a blocklist is a
// bit mask over the indices).
const std::vector<Tactic>& all_tactics();
constexpr int kMaxTactics = 64;

// The arch code the heuristics use for a device: major * 10 + minor, except that 90 means "a 9.0
// device and this module holds sm_90a code" (a 9.0 device without it reports 89, so no kSm90
// tactic is chosen). Queries the device once. The host backend answers kHostArch for any device.
int device_arch(int device);
constexpr int kHostArch = 90;

// Why `t` cannot run `p` on `arch` (empty when it can): shape, dtype, layout, alignment, arch.
std::string unsupported(const GemmParams& p, const Tactic& t, int arch);
std::string unsupported(const GroupedGemmParams& p, const Tactic& t, int arch);

// The tactics of all_tactics() that can run `p` on `arch` (always ends with kFallback).
std::vector<Tactic> gemm_tactics(const GemmParams& p, int arch);
std::vector<Tactic> grouped_gemm_tactics(const GroupedGemmParams& p, int arch);

// The heuristic default (gemm_tactics.cc, one table): deterministic per (arch, dtypes, m, n, k).
Tactic default_tactic(const GemmParams& p, int arch);
Tactic default_grouped_tactic(const GroupedGemmParams& p, int arch);

// Shape and argument checks independent of the tactic (sizes >= 0, strides cover the rows,
// dtype pairs, scale pointers present); the binding checks first, this is the last line.
std::string invalid(const GemmParams& p);
std::string invalid(const GroupedGemmParams& p);

// The tactic a launch runs, as an index of all_tactics() (the one rule for every op and backend):
//   `requested` (an index, or -1 for none) when it can serve p on arch and its bit in `blocked` is
//   clear; with `strict` anything else is an error (the autotuner times exactly what it asked for);
//   otherwise default_tactic() unless blocked, else the first tactic of gemm_tactics() that is not
//   blocked. -1 with *why set when nothing can run (p invalid, or every candidate blocked).
int choose_tactic(const GemmParams& p, int requested, uint64_t blocked, bool strict, int arch, std::string* why);
int choose_tactic(const GroupedGemmParams& p, int requested, uint64_t blocked, bool strict, int arch, std::string* why);

// Launch on ctx.stream. An unsupported tactic or invalid params return an error before anything
// is launched; m, n or batch == 0 is a no-op; k == 0 writes zeros. A module holds the kernels of
// its input dtype only (spec_config.h: :mm bf16 or f16, :fp8 e4m3 or e5m2 for A, :grouped bf16 or
// f16): another input dtype is an error naming the module.
Status gemm(const GemmParams& p, const Tactic& t, LaunchContext ctx);
Status grouped_gemm(const GroupedGemmParams& p, const Tactic& t, LaunchContext ctx);

// A timestamp in nanoseconds written to *out on ctx.stream, in stream order: %globaltimer, the
// GPU's global nanosecond clock, from a one-thread kernel (CUDA), or the steady clock (host). The
// autotuner times with it where CUDA events are unreliable.
Status timestamp(int64_t* out, LaunchContext ctx);

}  // namespace kiln::gemm
