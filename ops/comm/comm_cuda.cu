// //ops:comm, CUDA backend: the launchers of comm.cuh's kernels for this module's dtype, and the
// buffer / IPC handle helpers of comm.h. Copied into the specialisation's generated directory,
// next to its spec_config.h (without one, the probe build of tests/comm compiles every dtype).
//
// Launch shape: min(kMaxBlocks, SM count, blocks the work needs) blocks of kThreads; 16-byte
// vectors when every pointer is 16-byte aligned and the count a multiple of the vector.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "ops/comm/comm.cuh"
#include "ops/common/cuda_utils.cuh"

namespace kiln::comm {

namespace {

Status check(const AllReduceParams& p, const char* what) {
  if (p.world_size < 1 || p.world_size > kMaxRanks) {
    return Status::Error(1, std::string(what) + ": world_size must be in [1, " + std::to_string(kMaxRanks) + "], got " +
                                std::to_string(p.world_size));
  }
  if (p.rank < 0 || p.rank >= p.world_size) {
    return Status::Error(1, std::string(what) + ": rank must be in [0, " + std::to_string(p.world_size) + "), got " +
                                std::to_string(p.rank));
  }
  for (int r = 0; r < p.world_size; ++r) {
    if (p.data.ptrs[r] == nullptr || p.signals.ptrs[r] == nullptr) {
      return Status::Error(1, std::string(what) + ": rank " + std::to_string(r) + "'s buffers are not mapped");
    }
  }
  if (p.error == nullptr) return Status::Error(1, std::string(what) + ": no error word");
  if (p.spin_limit < 1) return Status::Error(1, std::string(what) + ": spin_limit must be >= 1");
  return Status::Ok();
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T>
bool vector_ok(const AllReduceParams& p) {
  constexpr int64_t n = 16 / sizeof(T);
  if (p.count % (n * p.world_size) != 0 || !aligned16(p.out)) return false;
  for (int r = 0; r < p.world_size; ++r) {
    if (!aligned16(p.data.ptrs[r])) return false;
  }
  return true;
}

int blocks_for(int64_t work) {
  const int64_t need = (work + kThreads - 1) / kThreads;
  int blocks = kMaxBlocks < sm_count() ? kMaxBlocks : sm_count();
  if (need < blocks) blocks = static_cast<int>(need > 0 ? need : 1);
  return blocks;
}

}  // namespace

template <typename T>
Status launch_all_reduce(const AllReduceParams& p, LaunchContext ctx) {
  if (Status s = check(p, "all_reduce"); !s.ok()) return s;
  if (p.count == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  constexpr int n = 16 / sizeof(T);
  const bool vec = vector_ok<T>(p);
  const int64_t work = vec ? p.count / n : p.count;
  const int blocks = blocks_for(p.algo == Algo::kTwoShot ? work / p.world_size + 1 : work);
  if (p.algo == Algo::kTwoShot) {
    if (vec) {
      two_shot_kernel<T, n><<<blocks, kThreads, 0, stream>>>(p);
    } else {
      two_shot_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(p);
    }
  } else if (vec) {
    one_shot_kernel<T, n><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    one_shot_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cuda_status(cudaGetLastError(), "all_reduce kernel launch");
}

template <typename T>
Status launch_fused(const FusedParams& f, LaunchContext ctx) {
  if (Status s = check(f.reduce, "fused_allreduce_add_rmsnorm"); !s.ok()) return s;
  if (f.reduce.count != f.rows * f.hidden || f.hidden < 1) {
    return Status::Error(1, "fused_allreduce_add_rmsnorm: count must be rows * hidden with hidden >= 1");
  }
  if (f.rows == 0) return Status::Ok();
  DeviceGuard guard(ctx.device);
  const int blocks =
      f.rows < kMaxBlocks ? static_cast<int>(f.rows) : (kMaxBlocks < sm_count() ? kMaxBlocks : sm_count());
  fused_kernel<T><<<blocks, kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(f);
  return cuda_status(cudaGetLastError(), "fused_allreduce_add_rmsnorm kernel launch");
}

Status alloc_buffer(int64_t bytes, int device, void** ptr) {
  DeviceGuard guard(device);
  *ptr = nullptr;
  if (Status s = cuda_status(cudaMalloc(ptr, static_cast<size_t>(bytes)), "cudaMalloc"); !s.ok()) return s;
  return cuda_status(cudaMemset(*ptr, 0, static_cast<size_t>(bytes)), "cudaMemset");
}

Status free_buffer(void* ptr, int device) {
  DeviceGuard guard(device);
  return cuda_status(cudaFree(ptr), "cudaFree");
}

Status ipc_get_handle(void* ptr, int device, IpcHandle* handle) {
  static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t is 64 bytes");
  DeviceGuard guard(device);
  cudaIpcMemHandle_t h;
  if (Status s = cuda_status(cudaIpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle"); !s.ok()) return s;
  std::memcpy(handle->bytes, &h, sizeof h);
  return Status::Ok();
}

Status ipc_open_handle(const IpcHandle& handle, int device, void** ptr) {
  DeviceGuard guard(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes, sizeof h);
  return cuda_status(cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
}

Status ipc_close_handle(void* ptr, int device) {
  DeviceGuard guard(device);
  return cuda_status(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle");
}

Status can_access_peer(int device, int peer, bool* ok, const char** why) {
  *ok = true;
  *why = "";
  if (device == peer) return Status::Ok();
  int can = 0;
  if (Status s = cuda_status(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer"); !s.ok()) {
    return s;
  }
  if (!can) {
    *ok = false;
    *why =
        "cudaDeviceCanAccessPeer reports no peer access between these GPUs (no NVLink or PCIe P2P path, "
        "or P2P disabled by the driver or the virtualisation layer)";
  }
  return Status::Ok();
}

Status copy_to_buffer(void* dst, const void* src, int64_t bytes, LaunchContext ctx) {
  DeviceGuard guard(ctx.device);
  return cuda_status(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(ctx.stream)),
                     "cudaMemcpyAsync into the all-reduce buffer");
}

Status read_and_clear_error(int32_t* error, LaunchContext ctx, int32_t* value) {
  DeviceGuard guard(ctx.device);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (Status s = cuda_status(cudaMemcpyAsync(value, error, sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                             "reading the all-reduce error word");
      !s.ok()) {
    return s;
  }
  if (Status s = cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !s.ok()) return s;
  if (*value == 0) return Status::Ok();
  return cuda_status(cudaMemsetAsync(error, 0, sizeof(int32_t), stream), "clearing the all-reduce error word");
}

#if defined(KILN_COMM_PROBE)
// tests/comm: one instantiation per dtype, without a generated spec_config.h.
template Status launch_all_reduce<float>(const AllReduceParams&, LaunchContext);
template Status launch_all_reduce<f16_t>(const AllReduceParams&, LaunchContext);
template Status launch_all_reduce<bf16_t>(const AllReduceParams&, LaunchContext);
template Status launch_fused<float>(const FusedParams&, LaunchContext);
template Status launch_fused<f16_t>(const FusedParams&, LaunchContext);
template Status launch_fused<bf16_t>(const FusedParams&, LaunchContext);
#else
}  // namespace kiln::comm
#include "spec_config.h"
namespace kiln::comm {
Status all_reduce(const AllReduceParams& p, LaunchContext ctx) {
  return launch_all_reduce<spec::dtype>(p, ctx);
}
Status fused_allreduce_add_rmsnorm(const FusedParams& p, LaunchContext ctx) {
  return launch_fused<spec::dtype>(p, ctx);
}
#endif

}  // namespace kiln::comm
