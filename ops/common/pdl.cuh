// Programmatic dependent launch (PDL, sm90+): a kernel launched with the programmatic
// stream-serialization attribute may begin while the kernel before it on the stream is still
// running, so its launch latency and prologue (index math, shared-memory set-up) overlap the
// previous kernel's tail. In exchange the kernel must not touch global memory that the previous
// kernel reads or writes until kiln::pdl_wait() returns: griddepcontrol.wait blocks until every
// grid it depends on has completed and flushed its memory.
//
// Both device calls are no-ops on a kernel launched without the attribute and below sm90, so a
// kernel that calls them runs unchanged on every arch; kiln::launch() adds the attribute only when
// the LaunchContext asks for it (the Python layer asks only on sm90+: kiln.utils.use_pdl).
//
// Source: CUDA C++ Programming Guide, "Programmatic Dependent Launch and Synchronization";
// PTX ISA, "griddepcontrol".
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ops/common/status.h"

namespace kiln {

// Wait for the grids this one depends on (launched before it on the stream) to finish.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the next PDL-launched kernel on the stream be scheduled: called once this CTA no longer
// needs the SM to itself (its last loads are issued). Memory visibility still comes only from the
// dependent's pdl_wait(), which waits for this grid to complete.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launch `kernel` on ctx.stream, with the programmatic stream-serialization attribute when
// ctx.pdl is set (the kernel must then call pdl_wait() before its first global access).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   const LaunchContext& ctx, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = static_cast<cudaStream_t>(ctx.stream);
  config.attrs = attr;
  config.numAttrs = ctx.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln
