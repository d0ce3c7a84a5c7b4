// Host side of TMA: cuTensorMapEncodeTiled through the runtime's driver entry point (nothing
// links libcuda), and the stride/alignment rules a tensor map accepts. Used by ops/gemm and the
// sm90a prefill kernel (ops/attention/prefill_sm90.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::tma {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A global stride (bytes) a tensor map accepts: a positive multiple of 16 below 2^40.
inline bool stride_ok(int64_t bytes) {
  return bytes > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40);
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A 3-D tiled map (dim 0 contiguous) with 128-byte swizzle and zero fill out of bounds.
inline bool encode_3d(CUtensorMap* map, CUtensorMapDataType dt, const void* base, const uint64_t (&dims)[3],
                      const uint64_t (&stride_bytes)[2], const uint32_t (&box)[3],
                      CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const EncodeTiled enc = encoder();
  if (enc == nullptr) return false;
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t s[2] = {stride_bytes[0], stride_bytes[1]};
  const cuuint32_t b[3] = {box[0], box[1], box[2]};
  const cuuint32_t e[3] = {1, 1, 1};
  return enc(map, dt, 3, const_cast<void*>(base), d, s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace kiln::tma
