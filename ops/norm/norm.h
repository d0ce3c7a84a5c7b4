// RMSNorm family: the parameters and entry points shared by the CUDA and the host backends.
//
//   rmsnorm:            out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset)
//   fused_add_rmsnorm:  residual[r, :] += x[r, :]   (rounded to the element type), then
//                       x[r, :] = rmsnorm(residual[r, :])   (in place)
//   weight_offset = 0 for RMSNorm, 1 for Gemma's (1 + w) variant.
//   layernorm:          out[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * gamma + beta, mean and the
//                       biased variance over the row; gamma and beta float32 whatever the dtype.
//   the *_quant ops:    the same value y, stored as fp8(y * (1 / scale)) into an fp8 `out` (E4M3 or
//                       E5M2), rounded to nearest even and saturated to the format's largest
//                       finite value (+-448, +-57344); NaN stays NaN. The fused one writes the
//                       residual as fused_add_rmsnorm does and leaves the input alone. A zero
//                       scale gives saturated (or NaN, for y = 0) outputs.
//
// Layout: every row tensor is viewed as [d0, d1, cols] (a 2-D tensor has d0 = 1), the last
// dimension contiguous, the two leading strides arbitrary (element units, int64). The weight is
// [cols], contiguous. Accumulation is float32. The element type is the module's specialisation
// (kiln::spec::dtype); a module serves one dtype. Framework free.
#pragma once

#include <cstdint>

#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::norm {

struct NormParams {
  void* out;  // fused_add_rmsnorm: the input itself (normalised in place); fp8 for *_quant
  const void* input;
  void* residual;  // fused_add_rmsnorm only
  const void* weight;
  int64_t d0, d1, cols;  // rows = d0 * d1
  int64_t out_stride0, out_stride1;
  int64_t in_stride0, in_stride1;
  int64_t res_stride0, res_stride1;
  float eps;
  float weight_offset;

  KILN_HOST_DEVICE int64_t rows() const { return d0 * d1; }
};

struct LayerNormParams {
  void* out;
  const void* input;
  const float* gamma;    // [cols], contiguous
  const float* beta;     // [cols], contiguous
  int64_t d0, d1, cols;  // rows = d0 * d1
  int64_t out_stride0, out_stride1;
  int64_t in_stride0, in_stride1;
  float eps;

  KILN_HOST_DEVICE int64_t rows() const { return d0 * d1; }
};

// What the *_quant ops add: `out` holds fp8 of `format`; the scale is *scale (one float32 in device
// memory, read by the kernel) when set, else scale_value. (Derived structs, so the kernels of the
// unquantised ops keep their own parameter block.)
enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

struct QuantArgs {
  Fp8Format format;
  const float* scale;
  float scale_value;
};

struct QuantNormParams : NormParams {
  QuantArgs quant;
};

struct QuantLayerNormParams : LayerNormParams {
  QuantArgs quant;
};

// Implemented once per backend for the module's dtype (norm_cuda.cu, norm_host.cc). ctx.pdl:
// launch with programmatic dependent launch (the RMSNorm ops; LayerNorm never asks for it).
Status rmsnorm(const NormParams& p, LaunchContext ctx);
Status fused_add_rmsnorm(const NormParams& p, LaunchContext ctx);
Status layernorm(const LayerNormParams& p, LaunchContext ctx);
Status rmsnorm_quant(const QuantNormParams& p, LaunchContext ctx);
Status fused_add_rmsnorm_quant(const QuantNormParams& p, LaunchContext ctx);
Status layernorm_quant(const QuantLayerNormParams& p, LaunchContext ctx);

}  // namespace kiln::norm
