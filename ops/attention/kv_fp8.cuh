// Reading an fp8 E4M3 KV cache on tensor cores (sm80+): the bytes stay fp8 in shared memory (half
// the traffic of a 16-bit cache) and become f16 operands in registers, exactly (every E4M3 value
// is an f16; one cvt per pair on sm89+). The per-tensor k_scale and
// v_scale are applied in float32 outside the MMAs: k_scale folded into the query, v_scale into the
// output.
//
// Decode puts the keys on the MMAs' M side (S^T = K Q^T, O^T = V^T P^T), so K and V^T are A
// operands. ldmatrix moves 16-bit units, so an 8 x 8 matrix of fp8 rows is 8 rows x 16 bytes, and
// the fragments come out with the fp8 pairs in another order than m16n8k16 wants:
//   K (ldmatrix, not transposed): lane (g, t) holds bytes 4t .. 4t+3 of token row g, four
//     consecutive dims. They serve as k positions 2t, 2t+1 (a0 / a1) and 2t+8, 2t+9 (a2 / a3): the
//     query's B operand takes its dims in the same order (qk_dim), and the dot product is unchanged.
//   V (ldmatrix.trans): lane (g, t) holds tokens 2t, 2t+1 x bytes 2g, 2g+1 (dims 2g, 2g+1 of two
//     tokens). A byte permute splits them into the A rows of dim 2g (row g) and of dim 2g+1 (row
//     g + 8), so one transposed matrix feeds one 16-row m-tile: row r of m-tile c is dim
//     16c + 2 (r % 8) + r / 8 (pv_dim).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kiln::attention::fp8 {

// The four E4M3 bytes of `r` -> two f16x2 registers: bytes 0, 1 (lo) and 2, 3 (hi), low byte
// first. In PTX, so the upper pair reaches the conversion as a half-register operand (SASS
// `F2FP.F16.E4M3.UNPACK_B R, R.H1`): the toolkit's intrinsic takes a 16-bit value and costs a shift.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t r, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n"
      ".reg .b16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(r));
#else  // no fp8 conversion instruction: the toolkit's emulation
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r & 0xffffu), __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  hi = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

// A K fragment register (four E4M3 dims of one token) -> its k positions 2t, 2t+1 (lo) and
// 2t+8, 2t+9 (hi).
__device__ __forceinline__ void k_operands(uint32_t r, uint32_t& lo, uint32_t& hi) {
  e4m3x4_to_f16x2x2(r, lo, hi);
}

// A transposed V fragment register (tokens 2t, 2t+1 x dims 2g, 2g+1) -> the A operand registers
// of the even dim (tokens 2t, 2t+1 of dim 2g) and of the odd one (dim 2g+1).
__device__ __forceinline__ void v_operands(uint32_t r, uint32_t& even, uint32_t& odd) {
  // bytes (2t,2g) (2t+1,2g) (2t,2g+1) (2t+1,2g+1)
  e4m3x4_to_f16x2x2(__byte_perm(r, 0u, 0x3120u), even, odd);
}

// The query dim that B operand register `half` (0: k positions 2t, 2t+1; 1: 2t+8, 2t+9) of k-step
// kk holds, low element first (see k_operands).
__device__ __forceinline__ int qk_dim(int kk, int half, int t) {
  return kk * 16 + 4 * t + half * 2;
}

// The head dim of row r (0..15) of m-tile c in O^T = V^T P^T (see v_operands).
__device__ __forceinline__ int pv_dim(int c, int r) {
  return c * 16 + 2 * (r % 8) + r / 8;
}

}  // namespace kiln::attention::fp8
