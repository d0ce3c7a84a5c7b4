// //ops/gemm, host (CPU) backend of every target: gemm(), grouped_gemm(), device_arch() and
// timestamp() of gemm.h. Float32-accumulating loops over the same parameter structs the CUDA
// kernels read: fp8 inputs are decoded exactly (ops/common/dtypes.h), per-tensor scales multiply
// the sum, groupwise scales multiply each 128-wide K block's partial sum (the DeepSeek-V3
// definition), the output is rounded once to its dtype (round to nearest even). It runs the CPU
// tests and the fuzzing, and serves CPU tensors.
//
// Tactics: every tactic is accepted where its rules hold for a 9.0 device with sm_90a code
// (kHostArch), so the tactic choice, the blocklist and the autotuner run on the CPU as on a GPU;
// all of them run the loops below. Segment bounds and weight indices are checked (check_segment,
// gemm.h) before anything is written: a bad one is Status::IndexError.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/device_error.h"
#include "ops/common/dtypes.h"
#include "ops/gemm/gemm.h"

namespace kiln::gemm {

namespace {

float load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return Convert<bf16_t>::to_float(static_cast<const bf16_t*>(base)[i]);
    case DType::kF16:
      return Convert<f16_t>::to_float(static_cast<const f16_t*>(base)[i]);
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kE4M3:
      return Convert<e4m3_t>::to_float(static_cast<const e4m3_t*>(base)[i]);
    case DType::kE5M2:
      return Convert<e5m2_t>::to_float(static_cast<const e5m2_t*>(base)[i]);
  }
  return 0.0f;
}

void store(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<bf16_t*>(base)[i] = Convert<bf16_t>::from_float(v);
      return;
    case DType::kF16:
      static_cast<f16_t*>(base)[i] = Convert<f16_t>::from_float(v);
      return;
    default:  // invalid() admits no other output dtype
      static_cast<float*>(base)[i] = v;
      return;
  }
}

// sum_k a[k] * b[k] in float32, eight partial sums (independent chains the compiler can keep in
// one vector register); the order differs from a sequential sum only by float32 rounding.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  const int64_t whole = n - n % 8;
  for (int64_t k = 0; k < whole; k += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  float s = 0.0f;
  for (int64_t k = whole; k < n; ++k) s += a[k] * b[k];
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

// B of one batch (or one weight) as float32 [n][k], column j contiguous: B(kk, j) at bt[j * k + kk].
void b_columns(const void* b, DType dt, BLayout layout, int64_t ldb, int64_t n, int64_t k, std::vector<float>* bt) {
  bt->resize(size_t(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t kk = 0; kk < k; ++kk)
      (*bt)[size_t(j * k + kk)] = load(b, dt, layout == BLayout::kKMajor ? j * ldb + kk : kk * ldb + j);
}

void a_row(const void* a, DType dt, int64_t row_at, int64_t k, std::vector<float>* row) {
  row->resize(size_t(k));
  for (int64_t kk = 0; kk < k; ++kk) (*row)[size_t(kk)] = load(a, dt, row_at + kk);
}

}  // namespace

int device_arch(int) {
  return kHostArch;
}

Status timestamp(int64_t* out, LaunchContext) {
  *out =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return Status::Ok();
}

Status gemm(const GemmParams& p, const Tactic& t, LaunchContext) {
  if (std::string why = unsupported(p, t, kHostArch); !why.empty()) {
    return Status::Error(1, "gemm: tactic " + tactic_name(t) + ": " + why);
  }
  if (p.m == 0 || p.n == 0 || p.batch == 0) return Status::Ok();
  const bool groupwise = p.scale_mode == ScaleMode::kGroupwise;
  const float alpha = p.scale_mode == ScaleMode::kPerTensor ? p.a_scale[0] * p.b_scale[0] : 1.0f;
  std::vector<float> bt, row;
  for (int64_t z = 0; z < p.batch; ++z) {
    b_columns(static_cast<const uint8_t*>(p.b) + z * p.b_batch_stride * dtype_bytes(p.b_dtype), p.b_dtype, p.b_layout,
              p.ldb, p.n, p.k, &bt);
    const void* a = static_cast<const uint8_t*>(p.a) + z * p.a_batch_stride * dtype_bytes(p.a_dtype);
    void* out = static_cast<uint8_t*>(p.out) + z * p.out_batch_stride * dtype_bytes(p.out_dtype);
    for (int64_t i = 0; i < p.m; ++i) {
      a_row(a, p.a_dtype, i * p.lda, p.k, &row);
      for (int64_t j = 0; j < p.n; ++j) {
        const float* col = bt.data() + j * p.k;
        float acc = 0.0f;
        if (groupwise) {
          for (int64_t kb = 0; kb * kScaleBlock < p.k; ++kb) {
            const int64_t k0 = kb * kScaleBlock;
            const float part = dot(row.data() + k0, col + k0, kScaleBlock);
            acc += part * p.a_scale[i * p.a_scale_stride_m + kb * p.a_scale_stride_k] *
                   p.b_scale[(j / kScaleBlock) * p.b_scale_stride_n + kb * p.b_scale_stride_k];
          }
        } else {
          acc = dot(row.data(), col, p.k) * alpha;
        }
        store(out, p.out_dtype, i * p.ldo + j, acc);
      }
    }
  }
  return Status::Ok();
}

Status grouped_gemm(const GroupedGemmParams& p, const Tactic& t, LaunchContext) {
  if (std::string why = unsupported(p, t, kHostArch); !why.empty()) {
    return Status::Error(1, "gemm (grouped): tactic " + tactic_name(t) + ": " + why);
  }
  if (p.num_groups == 0 || p.n == 0 || p.total_rows == 0) return Status::Ok();
  int64_t record[4] = {};  // every segment checked before anything is written
  for (int64_t s = 0; s < p.num_groups && record[0] == 0; ++s) check_segment(p, s, record);
  if (record[0] != 0) {
    return Status::IndexError(index_error(static_cast<ErrorCode>(record[0]), record[1], record[2], record[3]));
  }
  const int64_t eb = dtype_bytes(p.a_dtype);
  const bool groupwise = p.scale_mode == ScaleMode::kGroupwise;
  std::vector<float> bt, row;
  for (int64_t s = 0; s < p.num_groups; ++s) {
    const Segment seg = check_segment(p, s, nullptr);
    if (seg.hi == seg.lo) continue;
    b_columns(static_cast<const uint8_t*>(p.b) + seg.weight * p.b_weight_stride * eb, p.a_dtype, p.b_layout, p.ldb, p.n,
              p.k, &bt);
    const float* b_scale = groupwise ? p.b_scale + seg.weight * p.b_scale_stride_w : nullptr;
    for (int64_t i = seg.lo; i < seg.hi; ++i) {
      a_row(p.a, p.a_dtype, i * p.lda, p.k, &row);
      for (int64_t j = 0; j < p.n; ++j) {
        const float* col = bt.data() + j * p.k;
        float acc = 0.0f;
        if (groupwise) {  // each 128-wide k block's partial times its two scales (DeepSeek-V3)
          for (int64_t kb = 0; kb * kScaleBlock < p.k; ++kb) {
            const int64_t k0 = kb * kScaleBlock;
            acc += dot(row.data() + k0, col + k0, kScaleBlock) *
                   p.a_scale[i * p.a_scale_stride_m + kb * p.a_scale_stride_k] *
                   b_scale[(j / kScaleBlock) * p.b_scale_stride_n + kb * p.b_scale_stride_k];
          }
        } else {
          acc = dot(row.data(), col, p.k);
        }
        store(p.out, p.out_dtype, i * p.ldo + j, acc);
      }
    }
  }
  return Status::Ok();
}

}  // namespace kiln::gemm
