// RMSNorm on the CPU: the host backend of //ops:norm (see norm.h for the contract).
//
// Same arithmetic as the CUDA kernels: float32 accumulation, fused residual rounded to T before it
// is normalised, output rounded once (to T, or for the *_quant ops to fp8 after the multiplication
// by 1 / scale). Rows are processed one after another on the calling thread.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/dtypes.h"
#include "ops/norm/norm.h"

namespace kiln::norm::host {

inline int64_t row_offset(int64_t row, int64_t d1, int64_t s0, int64_t s1) {
  return (row / d1) * s0 + (row % d1) * s1;
}

// Where the normalised values go: `out` of T, or (quant set: the *_quant ops) of fp8, times 1 / scale.
template <typename T>
struct Output {
  void* out;
  const QuantArgs* quant;
  float scale_inv;

  Output(void* out, const QuantArgs* quant)
      : out(out),
        quant(quant),
        scale_inv(quant == nullptr ? 1.0f : 1.0f / (quant->scale != nullptr ? *quant->scale : quant->scale_value)) {}

  void store(int64_t at, float y) const {
    if (quant == nullptr) {
      static_cast<T*>(out)[at] = Convert<T>::from_float(y);
    } else if (quant->format == Fp8Format::kE5M2) {
      static_cast<e5m2_t*>(out)[at] = Convert<e5m2_t>::from_float(y * scale_inv);
    } else {
      static_cast<e4m3_t*>(out)[at] = Convert<e4m3_t>::from_float(y * scale_inv);
    }
  }
};

// quant: null, or the *_quant ops' fp8 output.
template <typename T, bool FUSED>
Status run(const NormParams& p, const QuantArgs* quant = nullptr) {
  using C = Convert<T>;
  const T* w = static_cast<const T*>(p.weight);
  const Output<T> output(p.out, quant);
  for (int64_t row = 0; row < p.rows(); ++row) {
    const T* x = static_cast<const T*>(p.input) + row_offset(row, p.d1, p.in_stride0, p.in_stride1);
    const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
    T* res = FUSED ? static_cast<T*>(p.residual) + row_offset(row, p.d1, p.res_stride0, p.res_stride1) : nullptr;
    // Fused: residual += x first (rounded to T); the row to normalise is then the residual.
    const T* src = x;
    if constexpr (FUSED) {
      for (int64_t j = 0; j < p.cols; ++j) res[j] = C::from_float(C::to_float(x[j]) + C::to_float(res[j]));
      src = res;
    }
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < p.cols; ++j) {
      const float v = C::to_float(src[j]);
      sum_sq += v * v;
    }
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(p.cols) + p.eps);
    for (int64_t j = 0; j < p.cols; ++j) {
      output.store(out_at + j, C::to_float(src[j]) * inv_rms * (C::to_float(w[j]) + p.weight_offset));
    }
  }
  return Status::Ok();
}

// LayerNorm: the mean, then the mean squared deviation from it, the output rounded once. The sums
// are double: one thread adds a row sequentially, whose float32 error grows with the row (~n 2^-24,
// 4e-3 relative at 70000 columns), where the CUDA kernels' tree reductions grow with log n.
template <typename T>
Status layernorm(const LayerNormParams& p, const QuantArgs* quant = nullptr) {
  using C = Convert<T>;
  const Output<T> output(p.out, quant);
  for (int64_t row = 0; row < p.rows(); ++row) {
    const T* x = static_cast<const T*>(p.input) + row_offset(row, p.d1, p.in_stride0, p.in_stride1);
    const int64_t out_at = row_offset(row, p.d1, p.out_stride0, p.out_stride1);
    double sum = 0.0;
    for (int64_t j = 0; j < p.cols; ++j) sum += C::to_float(x[j]);
    const float mean = static_cast<float>(sum / static_cast<double>(p.cols));
    double sq = 0.0;
    for (int64_t j = 0; j < p.cols; ++j) {
      const double d = C::to_float(x[j]) - mean;
      sq += d * d;
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(p.cols) + p.eps));
    for (int64_t j = 0; j < p.cols; ++j) {
      output.store(out_at + j, (C::to_float(x[j]) - mean) * rstd * p.gamma[j] + p.beta[j]);
    }
  }
  return Status::Ok();
}

}  // namespace kiln::norm::host
