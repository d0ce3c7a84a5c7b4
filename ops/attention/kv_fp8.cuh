// Reading an fp8 E4M3 KV cache on tensor cores (sm80+): the bytes stay fp8 in shared memory (half
// the traffic of a 16-bit cache) and become f16 operands in registers, exactly (every E4M3 value
// is an f16; the toolkit's conversion is one cvt per pair on sm89+). The per-tensor k_scale and
// v_scale are applied in float32 outside the MMAs: k_scale folded into the query, v_scale into the
// output.
//
// ldmatrix moves 16-bit units, so an 8 x 8 matrix of fp8 rows is 8 rows x 16 bytes, and the
// fragments come out with the fp8 pairs in another order than m16n8k16 wants:
//   K (ldmatrix, not transposed): lane (g, t) holds bytes 4t .. 4t+3 of row g, four consecutive
//     dims. They serve as k positions 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1): the query's A operand
//     takes its dims in the same order (qk_dims), and the dot product is unchanged.
//   V (ldmatrix.trans): lane (g, t) holds rows 2t, 2t+1 x bytes 2g, 2g+1 (dims 2g, 2g+1 of two
//     tokens). A byte permute splits them into two B operands, one per dim, so one transposed
//     matrix feeds two n-tiles: n-tile 2c + p of chunk c has dims 16c + 2j + p (pv_dim).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kiln::attention::fp8 {

// Two E4M3 bytes (the low 16 bits of `pair`, byte 0 first) -> an f16x2 register, low half first.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// A K fragment register (four E4M3 dims of one token) -> the B operand pair (b0, b1).
__device__ __forceinline__ void k_operands(uint32_t r, uint32_t& b0, uint32_t& b1) {
  b0 = e4m3x2_to_f16x2(r);
  b1 = e4m3x2_to_f16x2(r >> 16);
}

// A transposed V fragment register (tokens 2t, 2t+1 x dims 2g, 2g+1) -> the B operands of the
// even dim (tokens 2t, 2t+1 of dim 2g) and of the odd one (dim 2g+1).
__device__ __forceinline__ void v_operands(uint32_t r, uint32_t& even, uint32_t& odd) {
  const uint32_t split = __byte_perm(r, 0u, 0x3120u);  // bytes (2t,2g) (2t+1,2g) (2t,2g+1) (2t+1,2g+1)
  even = e4m3x2_to_f16x2(split);
  odd = e4m3x2_to_f16x2(split >> 16);
}

// The query dim that A operand element (k-step kk, register half `which` of register r) holds:
// registers 0/1 (k positions 2t, 2t+1) are dims 16 kk + 4t, +1; registers 2/3 (2t+8, 2t+9) are
// 16 kk + 4t + 2, +3 (see k_operands).
__device__ __forceinline__ int qk_dim(int kk, int r, int t) {
  return kk * 16 + 4 * t + (r >> 1) * 2;
}

// The head dim of output column j (0..7) of n-tile n in the P V product (see v_operands).
__device__ __forceinline__ int pv_dim(int n, int j) {
  return (n / 2) * 16 + 2 * j + (n & 1);
}

}  // namespace kiln::attention::fp8
