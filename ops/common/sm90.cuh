// Hopper (sm_90a) building blocks as raw PTX: mbarriers, TMA tensor loads (cp.async.bulk.tensor),
// wgmma with shared-memory matrix descriptors, and setmaxnreg. Everything here compiles for any
// target; the bodies exist only where the arch-specific features do (__CUDA_ARCH_FEAT_SM90_ALL,
// i.e. -gencode arch=compute_90a) and trap elsewhere, so a caller must route to them only on a
// 9.0a build running on a 9.0 device.
//
// Sources: PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (wgmma, the
// matrix-descriptor format, the register fragments) and "cp.async.bulk.tensor" / "mbarrier";
// CUTLASS cute/arch/mma_sm90_desc.hpp (the canonical K-major / MN-major swizzled layouts).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/common/dtypes.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_SM90A 1
#endif

namespace kiln::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(KILN_SM90A)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

// Makes initialised barriers visible to the async (TMA) proxy before any copy signals them.
__device__ __forceinline__ void fence_barrier_init() {
#if defined(KILN_SM90A)
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(KILN_SM90A)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// One arrival that also expects `bytes` of TMA transactions in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(KILN_SM90A)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

// Blocks until the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting on parity 1 returns at once: the producer's first pass over "empty" barriers).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(KILN_SM90A)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}

// ---- TMA ---------------------------------------------------------------------------------------

// Box of a 4-D tensor map at coordinates (c0 innermost .. c3) into shared memory; completion is
// counted in bytes on `bar`. `map` is the address of a __grid_constant__ CUtensorMap parameter.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
#if defined(KILN_SM90A)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
#if defined(KILN_SM90A)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
#if defined(KILN_SM90A)
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma
// operands, TMA).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(KILN_SM90A)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// ---- cp.async producers (ops/attention/prefill_sm90.cuh's gather path) -----------------------

// An arrival on `bar` that the hardware makes once every cp.async this thread issued before it
// has landed in shared memory. .noinc: the arrival counts against the barrier's expected count
// (initialise it with the number of arriving threads), not on top of it (PTX ISA,
// "cp.async.mbarrier.arrive").
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
#if defined(KILN_SM90A)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// ---- TMA: multicast loads and stores (used by ops/gemm) ---------------------------------------

// tma_load_3d into the same shared-memory offset of every CTA of the cluster named in `mask` (bit
// r = cluster rank r); each destination CTA's mbarrier at `bar`'s offset counts the bytes.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const void* map, uint64_t* bar, uint16_t mask, int c0,
                                                      int c1, int c2) {
#if defined(KILN_SM90A)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%4, "
      "%5, %6}], [%2], %3;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "h"(mask), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// Shared memory -> the box of a 3-D tensor map at (c0, c1, c2); parts of the box outside the
// tensor are not written. Completion is tracked per thread in bulk groups (commit / wait below).
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
#if defined(KILN_SM90A)
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}

__device__ __forceinline__ void tma_store_commit() {
#if defined(KILN_SM90A)
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
#if defined(KILN_SM90A)
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}

// Waits until at most N of this thread's bulk groups are incomplete (writes visible in global).
template <int N>
__device__ __forceinline__ void tma_store_wait() {
#if defined(KILN_SM90A)
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// ---- clusters ----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
#if defined(KILN_SM90A)
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}

// Every thread of every CTA of the cluster arrives, then waits for all of them (release/acquire:
// shared-memory writes and barrier inits before it are visible cluster-wide after it).
__device__ __forceinline__ void cluster_sync() {
#if defined(KILN_SM90A)
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// One arrival on the mbarrier at `bar`'s offset in the shared memory of cluster CTA `cta`
// (default semantics, as CUTLASS's ClusterBarrier::arrive: .release.cluster compiles to a
// MEMBAR.ALL.GPU before every arrival).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
#if defined(KILN_SM90A)
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, "
      "[remote];\n}" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
#endif
}

// ---- registers ---------------------------------------------------------------------------------

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(KILN_SM90A)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(KILN_SM90A)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}

// Named barrier over `threads` threads (a multiple of 32); id 0 is __syncthreads'.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// An arrival on a named barrier without waiting for it (the producer side of a bar.sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// bar.red.or over a named barrier: waits for `threads` threads and returns whether `pred` held
// in any of them.
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool pred) {
  uint32_t any = 0;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}"
               : "=r"(any)
               : "r"(uint32_t(pred)), "r"(id), "r"(threads)
               : "memory");
  return any != 0;
}

// ---- wgmma -------------------------------------------------------------------------------------

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all >> 4), base offset 0 (tiles are 1024-byte aligned), and the layout
// type in bits 62-63 (1 = 128-byte swizzle).
//   K-major, 128B swizzle: rows of 64 16-bit elements (128 B) along K, 8-row atoms of 1024 B;
//     SBO = 1024 (next 8 rows), LBO unused (1). A K step of 16 elements adds 32 B to the start.
//   MN-major, 128B swizzle: the same 128-byte rows, now along M/N; LBO = the distance between
//     64-element M/N chunks, SBO = 1024 (next 8 K rows). A K step of 16 rows adds 2048 B.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(KILN_SM90A)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(KILN_SM90A)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(KILN_SM90A)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of accumulator registers across wgmma issue / wait
// (the asm of wgmma does not tell it that the registers are written asynchronously).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The same for A fragments read from registers by wgmma_rs: they must stay intact until the wait.
template <int M, int K>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[M][K]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < K; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N] for one warpgroup, f32 accumulators in the m64nNk16
// fragment (thread t: rows 16*(t/32) + (t%32)/4 (+8), columns 8j + 2*(t%4) (+1)); scale_d = 0
// overwrites D. wgmma_ss: A and B from shared memory, both K-major. wgmma_rs: A from registers
// (the mma.sync m16n8k16 A fragment of the thread's warp), B K-major or, with TRANS_B, MN-major.
// The m64nNk16 forms differ only in N (N / 2 f32 accumulators a thread, placeholders %0..%N/2-1,
// then the A/B operands) and the 16-bit type; these macros spell each form once.
#define KILN_WGMMA_D8(i)                                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define KILN_WGMMA_D32 KILN_WGMMA_D8(0), KILN_WGMMA_D8(8), KILN_WGMMA_D8(16), KILN_WGMMA_D8(24)
#define KILN_WGMMA_D64 KILN_WGMMA_D32, KILN_WGMMA_D8(32), KILN_WGMMA_D8(40), KILN_WGMMA_D8(48), KILN_WGMMA_D8(56)
#define KILN_WGMMA_D128                                                                                          \
  KILN_WGMMA_D64, KILN_WGMMA_D8(64), KILN_WGMMA_D8(72), KILN_WGMMA_D8(80), KILN_WGMMA_D8(88), KILN_WGMMA_D8(96), \
      KILN_WGMMA_D8(104), KILN_WGMMA_D8(112), KILN_WGMMA_D8(120)
#define KILN_WGMMA_P32                                                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WGMMA_P64                                                                                          \
  KILN_WGMMA_P32                                                                                                \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WGMMA_P128                                                                                          \
  KILN_WGMMA_P64                                                                                                 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "  \
  "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "    \
  "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, " \
  "%123, %124, %125, %126, %127"
// SS: A and B descriptors at %A and %A+1 (given as IA, IB), scale-d at IS.
#define KILN_WGMMA_SS(NN, TY, P, D, IA, IB, IS)                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS                                               \
               ", 0;\n"                                                                              \
               "wgmma.mma_async.sync.aligned.m64n" NN "k16.f32." TY "." TY " {" P "}, %" IA ", %" IB \
               ", p, 1, 1, "                                                                         \
               "0, 0;\n}\n"                                                                          \
               : D                                                                                   \
               : "l"(a), "l"(b), "r"(scale_d))
// RS: A fragment registers at IA0..IA0+3 (given as a "{%x, ...}" list), B descriptor IB, scale-d IS,
// the transpose-B immediate IT.
#define KILN_WGMMA_RS(NN, TY, P, D, A4, IB, IS, IT)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS                                              \
               ", 0;\n"                                                                             \
               "wgmma.mma_async.sync.aligned.m64n" NN "k16.f32." TY "." TY " {" P "}, " A4 ", %" IB \
               ", p, 1, 1, "                                                                        \
               "%" IT ";\n}\n"                                                                      \
               : D                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TRANS_B ? 1 : 0))

// D[64 x N] (+)= A[64 x 16] * B[16 x N] for one warpgroup, f32 accumulators in the m64nNk16
// fragment (thread t: rows 16*(t/32) + (t%32)/4 (+8), columns 8j + 2*(t%4) (+1)); scale_d = 0
// overwrites D. wgmma_ss: A and B from shared memory, both K-major. wgmma_rs: A from registers
// (the mma.sync m16n8k16 A fragment of the thread's warp), B K-major or, with TRANS_B, MN-major.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>, "wgmma: 16-bit types");
  static_assert(N == 64 || N == 128 || N == 256, "wgmma N");
#if defined(KILN_SM90A)
  constexpr bool BF16 = std::is_same_v<T, bf16_t>;
  if constexpr (N == 64 && BF16) {
    KILN_WGMMA_SS("64", "bf16", KILN_WGMMA_P32, KILN_WGMMA_D32, "32", "33", "34");
  } else if constexpr (N == 64) {
    KILN_WGMMA_SS("64", "f16", KILN_WGMMA_P32, KILN_WGMMA_D32, "32", "33", "34");
  } else if constexpr (N == 128 && BF16) {
    KILN_WGMMA_SS("128", "bf16", KILN_WGMMA_P64, KILN_WGMMA_D64, "64", "65", "66");
  } else if constexpr (N == 128) {
    KILN_WGMMA_SS("128", "f16", KILN_WGMMA_P64, KILN_WGMMA_D64, "64", "65", "66");
  } else if constexpr (BF16) {
    KILN_WGMMA_SS("256", "bf16", KILN_WGMMA_P128, KILN_WGMMA_D128, "128", "129", "130");
  } else {
    KILN_WGMMA_SS("256", "f16", KILN_WGMMA_P128, KILN_WGMMA_D128, "128", "129", "130");
  }
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();
#endif
}

template <typename T, int N, bool TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>, "wgmma: 16-bit types");
  static_assert(N == 64 || N == 128 || N == 256, "wgmma N");
#if defined(KILN_SM90A)
  constexpr bool BF16 = std::is_same_v<T, bf16_t>;
  if constexpr (N == 64 && BF16) {
    KILN_WGMMA_RS("64", "bf16", KILN_WGMMA_P32, KILN_WGMMA_D32, "{%32, %33, %34, %35}", "36", "37", "38");
  } else if constexpr (N == 64) {
    KILN_WGMMA_RS("64", "f16", KILN_WGMMA_P32, KILN_WGMMA_D32, "{%32, %33, %34, %35}", "36", "37", "38");
  } else if constexpr (N == 128 && BF16) {
    KILN_WGMMA_RS("128", "bf16", KILN_WGMMA_P64, KILN_WGMMA_D64, "{%64, %65, %66, %67}", "68", "69", "70");
  } else if constexpr (N == 128) {
    KILN_WGMMA_RS("128", "f16", KILN_WGMMA_P64, KILN_WGMMA_D64, "{%64, %65, %66, %67}", "68", "69", "70");
  } else if constexpr (BF16) {
    KILN_WGMMA_RS("256", "bf16", KILN_WGMMA_P128, KILN_WGMMA_D128, "{%128, %129, %130, %131}", "132", "133", "134");
  } else {
    KILN_WGMMA_RS("256", "f16", KILN_WGMMA_P128, KILN_WGMMA_D128, "{%128, %129, %130, %131}", "132", "133", "134");
  }
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();
#endif
}

// The same as wgmma_ss for 16-bit types, with B MN-major when TRANS_B (the transpose immediate;
// A stays K-major). Used by ops/gemm for a row-major [k, n] B.
#define KILN_WGMMA_SST(NN, TY, P, D, IA, IB, IS, IT)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS                                               \
               ", 0;\n"                                                                              \
               "wgmma.mma_async.sync.aligned.m64n" NN "k16.f32." TY "." TY " {" P "}, %" IA ", %" IB \
               ", p, 1, 1, 0, %" IT ";\n}\n"                                                         \
               : D                                                                                   \
               : "l"(a), "l"(b), "r"(scale_d), "n"(TRANS_B ? 1 : 0))

template <typename T, int N, bool TRANS_B>
__device__ __forceinline__ void wgmma_ss_tb(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>, "wgmma: 16-bit types");
  static_assert(N == 128 || N == 256, "wgmma_ss_tb N");
#if defined(KILN_SM90A)
  constexpr bool BF16 = std::is_same_v<T, bf16_t>;
  if constexpr (N == 128 && BF16) {
    KILN_WGMMA_SST("128", "bf16", KILN_WGMMA_P64, KILN_WGMMA_D64, "64", "65", "66", "67");
  } else if constexpr (N == 128) {
    KILN_WGMMA_SST("128", "f16", KILN_WGMMA_P64, KILN_WGMMA_D64, "64", "65", "66", "67");
  } else if constexpr (BF16) {
    KILN_WGMMA_SST("256", "bf16", KILN_WGMMA_P128, KILN_WGMMA_D128, "128", "129", "130", "131");
  } else {
    KILN_WGMMA_SST("256", "f16", KILN_WGMMA_P128, KILN_WGMMA_D128, "128", "129", "130", "131");
  }
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();
#endif
}

// D[64 x N] (+)= A[64 x 32] * B[32 x N], 8-bit floats (e4m3, or e5m2 where A_E5M2 / B_E5M2), both
// K-major in shared memory (the only layout wgmma takes for 8-bit types), f32 accumulators in the
// same fragment as the 16-bit forms. A K step of 32 elements is 32 bytes, as for 16-bit k16.
#define KILN_WGMMA_F8(NN, TA, TB, P, D, IA, IB, IS)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS                                                                 \
               ", 0;\n"                                                                                                \
               "wgmma.mma_async.sync.aligned.m64n" NN "k32.f32." TA "." TB " {" P "}, %" IA ", %" IB ", p, 1, 1;\n}\n" \
               : D                                                                                                     \
               : "l"(a), "l"(b), "r"(scale_d))
#define KILN_WGMMA_F8_N(TA, TB)                                                          \
  if constexpr (N == 128) {                                                              \
    KILN_WGMMA_F8("128", TA, TB, KILN_WGMMA_P64, KILN_WGMMA_D64, "64", "65", "66");      \
  } else {                                                                               \
    KILN_WGMMA_F8("256", TA, TB, KILN_WGMMA_P128, KILN_WGMMA_D128, "128", "129", "130"); \
  }

template <int N, bool A_E5M2, bool B_E5M2>
__device__ __forceinline__ void wgmma_ss_fp8(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  static_assert(N == 128 || N == 256, "wgmma_ss_fp8 N");
#if defined(KILN_SM90A)
  if constexpr (!A_E5M2 && !B_E5M2) {
    KILN_WGMMA_F8_N("e4m3", "e4m3")
  } else if constexpr (!A_E5M2) {
    KILN_WGMMA_F8_N("e4m3", "e5m2")
  } else if constexpr (!B_E5M2) {
    KILN_WGMMA_F8_N("e5m2", "e4m3")
  } else {
    KILN_WGMMA_F8_N("e5m2", "e5m2")
  }
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();
#endif
}

#undef KILN_WGMMA_F8_N
#undef KILN_WGMMA_F8
#undef KILN_WGMMA_SST

#undef KILN_WGMMA_RS
#undef KILN_WGMMA_SS
#undef KILN_WGMMA_P128
#undef KILN_WGMMA_P64
#undef KILN_WGMMA_P32
#undef KILN_WGMMA_D128
#undef KILN_WGMMA_D64
#undef KILN_WGMMA_D32
#undef KILN_WGMMA_D8

}  // namespace kiln::sm90
