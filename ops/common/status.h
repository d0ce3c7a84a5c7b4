// kiln::Status: what every launcher in ops/ returns. Framework free: the binding turns a failed
// Status into a Python exception; device code never throws.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace kiln {

struct Status {
  int code = 0;  // 0 = ok; otherwise a backend error code (cudaError_t for CUDA), or kIndexError
  std::string message;

  // An input index out of its range, found by the host backend before it touched anything (the
  // binding raises IndexError for it; CUDA kernels record such errors in LaunchContext::errors).
  static constexpr int kIndexError = -2;

  bool ok() const { return code == 0; }
  static Status Ok() { return {}; }
  static Status Error(int code, std::string message) { return {code, std::move(message)}; }
  static Status IndexError(std::string message) { return {kIndexError, std::move(message)}; }
};

// Where a launch runs: the stream (a cudaStream_t, or null for the host backend), the CUDA device
// ordinal the stream belongs to (-1 on the host), and the device's index-error record (four int64
// in device memory, ops/common/device_error.h; null on the host, whose backend returns
// Status::IndexError instead). `pdl`: launch with programmatic dependent launch (sm90+), so the
// kernel may start while the previous one on the stream finishes; only kernels that wait for their
// producer (kiln::pdl_wait, ops/common/pdl.cuh) before touching memory are launched so.
struct LaunchContext {
  void* stream = nullptr;
  int device = -1;
  int64_t* errors = nullptr;
  bool pdl = false;
};

}  // namespace kiln
