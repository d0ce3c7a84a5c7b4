// cp.async (sm80+): 16-byte global -> shared copies that complete asynchronously, in commit
// groups. Used for multi-stage pipelines where a thread later reads back what it copied.
#pragma once

#include <cstdint>

namespace kiln {

// Copy 16 bytes from global `src` to shared `dst`; when `valid` is false nothing is read and the
// destination is zero-filled (src-size 0), so masked tokens cost no memory traffic.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const uint32_t saddr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kiln
