// fp8 (E4M3 "fn") quantisation: the parameters and entry points shared by the CUDA and the host
// backends. The one rounding both use is ops/common/dtypes.h's (float_to_e4m3_satfinite on the
// host, the toolkit's SATFINITE conversion on the device).
//
//   scale = absmax / 448                      (float32 division; 448 = E4M3's largest finite value)
//   q     = e4m3(x / scale)                   (float32 division, then round to nearest even,
//                                              saturated at +-448; q = 0 where scale == 0)
// per_token_group_quant: absmax over each group of group_size consecutive elements of a row; one
//   float32 scale per (row, group), stored at scales[row * scale_stride_row + g * scale_stride_group].
// scaled_fp8_quant: one scale for the whole tensor, either given (static) or computed from the
//   tensor's absmax (dynamic: the scale buffer receives absmax / 448).
//
// Layout: input [rows, cols] and out [rows, cols] (E4M3 bytes), each contiguous in its last
// dimension with a free row stride (element units, int64). The input element type is the module's
// specialisation (kiln::spec::dtype). Framework free.
#pragma once

#include <cstdint>

#include "ops/common/dtypes.h"
#include "ops/common/macros.h"
#include "ops/common/status.h"

namespace kiln::quantization {

inline constexpr float kE4M3Max = 448.0f;

struct GroupQuantParams {
  void* out;  // E4M3 bytes
  float* scales;
  const void* input;
  int64_t rows, cols, group_size;
  int64_t in_stride, out_stride;
  int64_t scale_stride_row, scale_stride_group;
};

struct TensorQuantParams {
  void* out;     // E4M3 bytes
  float* scale;  // [1]: read (static) or written (dynamic)
  const void* input;
  int64_t rows, cols;
  int64_t in_stride, out_stride;
  bool dynamic;
};

// Implemented once per backend for the module's input dtype (quantization_cuda.cu, _host.cc).
Status per_token_group_quant(const GroupQuantParams& p, LaunchContext ctx);
Status scaled_fp8_quant(const TensorQuantParams& p, LaunchContext ctx);

}  // namespace kiln::quantization
