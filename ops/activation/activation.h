// Gated activations: the parameters and entry point shared by the CUDA and the host backends.
//
//   out[r, j] = act(input[r, j]) * input[r, d + j]      j < d, input row [2d], output row [d]
//   act: silu(x) = x / (1 + exp(-x)); gelu(x) = x/2 (1 + erf(x / sqrt 2)) (exact);
//        gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (the tanh approximation)
//
// Layout: input [rows, 2d] and out [rows, d], each contiguous in its last dimension with a free row
// stride (element units, int64). Arithmetic in float32, the result rounded once to the element
// type (the module's specialisation, kiln::spec::dtype). Framework free.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::activation {

// The activation applied to the first half; the binding exports these values.
enum class Act : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };
inline constexpr int kNumActs = 3;

struct ActParams {
  void* out;
  const void* input;
  int64_t rows;
  int64_t d;  // output columns; the input row holds 2 * d
  int64_t in_stride, out_stride;
  Act act;
};

inline constexpr float kInvSqrt2 = 0.70710678118654752440f;
inline constexpr float kSqrt2OverPi = 0.79788456080286535588f;
inline constexpr float kGeluTanhCubic = 0.044715f;

// The exponential and the division the activations use. Fast (CUDA, 16-bit element types only):
// __expf and __fdividef, whose few 1e-6 of relative error the output's rounding (2^-9 for bf16,
// 2^-12 for fp16) cannot show; they take the kernel from the arithmetic bound back to the memory
// bound (docs/perf/activation.md). Otherwise expf and IEEE division: the host's std functions under
// the host compiler, CUDA's full-precision ones under nvcc.
template <bool Fast>
KILN_HOST_DEVICE float act_exp(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) return __expf(v);
#endif
  return expf(v);
}

template <bool Fast>
KILN_HOST_DEVICE float act_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) return __fdividef(a, b);
#endif
  return a / b;
}

// erfc(z) for z >= 0 as t exp(-z^2 + P(t)), t = 1 / (1 + z/2) (Numerical Recipes' erfcc, a
// Chebyshev fit with relative error below 1.2e-7 for every z >= 0): one exponential, one division
// and ten FMAs, where CUDA's erfcf costs about twice that.
template <bool Fast>
KILN_HOST_DEVICE float erfc_nonnegative(float z) {
  const float t = act_div<Fast>(1.0f, 1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * act_exp<Fast>(-z * z + p);
}

// One definition of each activation for both backends (Fast: see act_exp).
template <Act A, bool Fast = false>
KILN_HOST_DEVICE float apply(float x) {
  if constexpr (A == Act::kSilu) {
    return act_div<Fast>(x, 1.0f + act_exp<Fast>(-x));
  } else if constexpr (A == Act::kGelu) {
    // 1 + erf(x / sqrt 2) as erfc(-x / sqrt 2): no cancellation for negative x, where 1 + erf
    // loses every digit (the float64 reference sees the difference from x ~ -4 on).
    if constexpr (Fast) {
      const float e = erfc_nonnegative<Fast>(fabsf(x) * kInvSqrt2);
      return 0.5f * x * (x < 0.0f ? e : 2.0f - e);
    } else {
      return 0.5f * x * erfcf(-x * kInvSqrt2);
    }
  } else {
    // 0.5 x (1 + tanh u) = x sigmoid(2u): the same function without 1 + tanh u cancelling for
    // negative x, and one exponential instead of tanhf.
    const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
    return act_div<Fast>(x, 1.0f + act_exp<Fast>(-2.0f * u));
  }
}

// Implemented once per backend for the module's dtype (activation_cuda.cu, activation_host.cc).
// ctx.pdl: launch with programmatic dependent launch (CUDA, sm90+; the host backend ignores it).
Status act_and_mul(const ActParams& p, LaunchContext ctx);

}  // namespace kiln::activation
