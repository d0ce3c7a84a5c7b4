// kiln::Status: what every launcher in ops/ returns. Framework free: the binding turns a failed
// Status into a Python exception; device code never throws.
#pragma once

#include <string>
#include <utility>

namespace kiln {

struct Status {
  int code = 0;  // 0 = ok; otherwise a backend error code (cudaError_t for CUDA)
  std::string message;

  bool ok() const { return code == 0; }
  static Status Ok() { return {}; }
  static Status Error(int code, std::string message) { return {code, std::move(message)}; }
};

// Where a launch runs: the stream (a cudaStream_t, or null for the host backend) and the CUDA
// device ordinal the stream belongs to (-1 on the host).
struct LaunchContext {
  void* stream = nullptr;
  int device = -1;
};

}  // namespace kiln
