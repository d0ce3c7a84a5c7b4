// Pieces every GEMM kernel shares: the DType -> C++ type table (one place), float conversion of
// inputs and paired output stores. (The grouped-GEMM segment reader, check_segment, is in gemm.h:
// the host backend reads segments the same way.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ops/common/dtypes.h"
#include "ops/gemm/gemm.h"

namespace kiln::gemm {

template <typename T>
struct TypeTag {
  using type = T;
};

// The one DType <-> C++ type table. dispatch_dtype<ALLOWED>(t, f) calls f(TypeTag<T>{}) and
// returns true, or returns false for a DType outside ALLOWED (the caller reports it by name);
// f is instantiated only for the types in ALLOWED.
enum DTypeSet : unsigned { k16Bit = 1u, kF32Set = 2u, kFp8Set = 4u };

template <unsigned ALLOWED, typename F>
bool dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16:
    case DType::kF16:
      if constexpr ((ALLOWED & k16Bit) != 0) {
        if (t == DType::kBF16) {
          f(TypeTag<bf16_t>{});
        } else {
          f(TypeTag<f16_t>{});
        }
        return true;
      }
      return false;
    case DType::kF32:
      if constexpr ((ALLOWED & kF32Set) != 0) {
        f(TypeTag<float>{});
        return true;
      }
      return false;
    case DType::kE4M3:
    case DType::kE5M2:
      if constexpr ((ALLOWED & kFp8Set) != 0) {
        if (t == DType::kE4M3) {
          f(TypeTag<e4m3_t>{});
        } else {
          f(TypeTag<e5m2_t>{});
        }
        return true;
      }
      return false;
  }
  return false;
}

template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, e4m3_t> || std::is_same_v<T, e5m2_t>;

template <typename T>
__device__ __forceinline__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (kIsFp8<T>) {
    return static_cast<float>(x);
  } else {
    return Convert<T>::to_float(x);
  }
}

// out[0], out[1] = (v0, v1) converted to T (round to nearest even): one 4-byte store for 16-bit
// T, one 8-byte store for float. `p` must be aligned to the pair.
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  } else {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v0, v1);
  }
}

template <typename T>
__device__ __forceinline__ void store_one(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) {
    *p = v;
  } else {
    *p = Convert<T>::from_float(v);
  }
}

}  // namespace kiln::gemm
