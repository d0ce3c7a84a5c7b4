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

// One definition of each activation for both backends (expf/erfcf/tanhf are the host's std
// functions under the host compiler and CUDA's full-precision ones under nvcc).
template <Act A>
KILN_HOST_DEVICE float apply(float x) {
  if constexpr (A == Act::kSilu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (A == Act::kGelu) {
    // 1 + erf(x / sqrt 2) as erfc(-x / sqrt 2): no cancellation for negative x, where 1 + erf
    // loses every digit (the float64 reference sees the difference from x ~ -4 on).
    return 0.5f * x * erfcf(-x * kInvSqrt2);
  } else {
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
  }
}

// Implemented once per backend for the module's dtype (activation_cuda.cu, activation_host.cc).
// ctx.pdl: launch with programmatic dependent launch (CUDA, sm90+; the host backend ignores it).
Status act_and_mul(const ActParams& p, LaunchContext ctx);

}  // namespace kiln::activation
