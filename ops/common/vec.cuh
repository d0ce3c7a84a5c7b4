// Aligned vectors of N elements for wide (up to 16-byte) global loads and stores.
//
// Vec<bf16_t, 8> is 16 bytes and loads with one LDG.E.128 when the address is 16-byte aligned;
// launchers check alignment before choosing N (and fall back to narrower vectors otherwise).
#pragma once

#include "ops/common/dtypes.h"

namespace kiln {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];

  __device__ __forceinline__ static Vec load(const T* ptr) { return *reinterpret_cast<const Vec*>(ptr); }
  // Read-only data (weights): through the non-coherent cache.
  __device__ __forceinline__ static Vec load_ro(const T* ptr) {
    Vec out;
    if constexpr (sizeof(Vec) == 16) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(ptr));
      memcpy(&out, &raw, sizeof out);
    } else if constexpr (sizeof(Vec) == 8) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(ptr));
      memcpy(&out, &raw, sizeof out);
    } else {
      out = *reinterpret_cast<const Vec*>(ptr);
    }
    return out;
  }
  // A 16- or 8-byte vector store. Written as PTX because NVVM splits a struct (or memcpy'd
  // uint4) store of 16-bit elements into four st.global.v2.u16 (seen with nvcc 13.0).
  __device__ __forceinline__ void store(T* ptr) const {
    [[maybe_unused]] const size_t global = __cvta_generic_to_global(ptr);
    if constexpr (sizeof(Vec) == 16) {
      uint32_t w[4];
      memcpy(w, v, sizeof w);
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(global), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    } else if constexpr (sizeof(Vec) == 8) {
      uint32_t w[2];
      memcpy(w, v, sizeof w);
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(global), "r"(w[0]), "r"(w[1]) : "memory");
    } else {
      *reinterpret_cast<Vec*>(ptr) = *this;
    }
  }
  __device__ __forceinline__ float get(int i) const { return Convert<T>::to_float(v[i]); }
  __device__ __forceinline__ void set(int i, float x) { v[i] = Convert<T>::from_float(x); }
};

}  // namespace kiln
