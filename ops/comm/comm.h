// Intra-node all-reduce over CUDA IPC buffers: the parameters and entry points of the CUDA
// kernels (comm.cuh, comm_cuda.cu). Framework free.
//
//   all_reduce:                 out[i] = sum_{r = 0 .. world - 1} data[r][i]          (rank order)
//   fused_allreduce_add_rmsnorm: s = round(sum_r data[r][row, :]); residual = round(residual + s);
//                                out[row, :] = round(residual * rsqrt(mean(residual^2) + eps) * weight)
//
// Every rank owns one data buffer (max_size bytes) and one signal block, both allocated with
// cudaMalloc and shared with the other ranks as IPC handles; `data.ptrs[r]` / `signals.ptrs[r]`
// are rank r's buffers as mapped in this process (this rank's own at [rank]). Before a call each
// rank copies its input into its own data buffer on the stream; the kernel then synchronises with
// the peers through flags in the signal blocks, sums in float32 in the fixed order rank 0, 1, ...
// and rounds once, so every rank computes bit-identical results.
//
// Synchronisation: block b of rank r signals block b of rank p by a system-scope release store of
// the call's epoch into p's signal block at [stage][b][r], and waits with acquire loads until its
// own [stage][b][p] reaches the epoch for every p. Epochs grow by one per call (never reset), so
// flags need no clearing. Block b keeps its count of calls in its own rank's signal block
// (counters[b]: read at the start, written at the end), not in a kernel argument, so a CUDA graph
// that replays the launch advances it like an eager call. Every rank makes the same calls with
// the same sizes, so block b has made the same number of calls on every rank. A wait gives up after `spin_limit` polls:
// the kernel writes kBarrierTimeout to `*error` and skips the rest of its work (the output is then undefined), so a
// dead peer is an error the host reads, never a hang.
#pragma once

#include <cstdint>

#include "ops/common/status.h"

namespace kiln::comm {

inline constexpr int kMaxRanks = 8;
// Blocks of one collective kernel: each block synchronises with the same block of every peer, so
// all of them must be resident at once on every GPU (kMaxBlocks <= the SM count of any GPU the
// target supports, one block a SM).
inline constexpr int kMaxBlocks = 32;
inline constexpr int kThreads = 512;
// Barrier stages of one call: start (inputs in place), mid (two-shot: slices reduced), end
// (peers done reading this rank's buffer).
inline constexpr int kStages = 3;
// The signal block of one rank: uint32 flags [kStages][kMaxBlocks][kMaxRanks], then this rank's
// uint32 call counters [kMaxBlocks].
inline constexpr int64_t kFlagWords = int64_t{kStages} * kMaxBlocks * kMaxRanks;
inline constexpr int64_t kSignalBytes = (kFlagWords + kMaxBlocks) * sizeof(uint32_t);
// Written to *error by a kernel whose barrier gave up.
inline constexpr int32_t kBarrierTimeout = 1;

enum class Algo : int { kOneShot = 0, kTwoShot = 1 };

struct RankPtrs {
  void* ptrs[kMaxRanks];
};

struct AllReduceParams {
  RankPtrs data;     // every rank's data buffer, holding its input (count elements)
  RankPtrs signals;  // every rank's signal block (kSignalBytes, zeroed once at allocation)
  void* out;         // count elements; not any rank's data buffer (peers read those meanwhile)
  int rank = 0;
  int world_size = 0;
  int64_t count = 0;
  int64_t spin_limit = 0;    // polls of a flag before the barrier gives up
  int32_t* error = nullptr;  // device memory; kBarrierTimeout when a barrier gave up
  Algo algo = Algo::kOneShot;
};

struct FusedParams {
  AllReduceParams reduce;  // count = rows * hidden; out: the normalised rows (x)
  void* residual;          // [rows, hidden], contiguous, updated in place
  const void* weight;      // [hidden]
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
};

// A CUDA IPC memory handle (cudaIpcMemHandle_t is 64 bytes), as bytes the binding moves through
// the process group.
inline constexpr int kIpcHandleBytes = 64;
struct IpcHandle {
  char bytes[kIpcHandleBytes];
};

// Entry points, implemented for the module's dtype (kiln::spec::dtype) in comm_cuda.cu.
Status all_reduce(const AllReduceParams& p, LaunchContext ctx);
Status fused_allreduce_add_rmsnorm(const FusedParams& p, LaunchContext ctx);

// Buffers and their IPC handles (comm_cuda.cu; not dtype specific).
Status alloc_buffer(int64_t bytes, int device, void** ptr);  // cudaMalloc + zero fill
Status free_buffer(void* ptr, int device);
Status ipc_get_handle(void* ptr, int device, IpcHandle* handle);
Status ipc_open_handle(const IpcHandle& handle, int device, void** ptr);
Status ipc_close_handle(void* ptr, int device);
// Can `device` read `peer`'s memory directly? On false, *why says why (same device: true).
Status can_access_peer(int device, int peer, bool* ok, const char** why);
// This rank's input into its data buffer, on the caller's stream (device to device).
Status copy_to_buffer(void* dst, const void* src, int64_t bytes, LaunchContext ctx);
// Reads the error word after the caller's stream is done, and clears it (a synchronisation).
Status read_and_clear_error(int32_t* error, LaunchContext ctx, int32_t* value);

}  // namespace kiln::comm
