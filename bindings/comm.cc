// //ops:comm launcher: the all-reduce kernels (ops/comm/comm.h) and the buffer / IPC-handle
// helpers kiln.comm's CUDA path uses. Compiled by the host compiler; only this layer knows
// Python. Arguments are keyword-only. Peer buffers are raw device addresses (IPC mappings have no
// tensor): kiln.comm owns them and passes every rank's, this rank's own at [rank].
//
//   all_reduce(*, data, signals, out, rank, world_size, spin_limit, error, algo, stream=0)
//   fused_allreduce_add_rmsnorm(*, data, signals, out, residual, weight, rank, world_size,
//                               spin_limit, error, eps, stream=0)
//   copy_to_buffer(*, dst, src, stream=0)          src: a contiguous tensor of the module's dtype
//   read_and_clear_error(*, error, device, stream=0) -> int
//   alloc_buffer(*, bytes, device) -> int; free_buffer(*, ptr, device)
//   ipc_handle(*, ptr, device) -> bytes; ipc_open(*, handle, device) -> int; ipc_close(*, ptr, device)
//   can_access_peer(*, device, peer) -> (bool, str)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/common/tensor_view.h"
#include "ops/comm/comm.h"
#include "ops/common/dtypes.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
using kiln::bindings::TensorView;
using kiln::bindings::value_error;
using kiln::bindings::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kiln::bindings::dl_dtype<Elem>();

void raise_if(const kiln::Status& s) {
  if (!s.ok()) throw std::runtime_error("kiln " + std::string(kiln::spec::kUri) + ": " + s.message);
}

bool contiguous(const TensorView& t) {
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

TensorView cuda_tensor(py::handle obj, const char* name) {
  TensorView t = view_of(obj, name);
  if (t.device.device_type != kiln::dl::kCUDA) value_error(std::string(name) + " must be a CUDA tensor");
  kiln::bindings::check_dtype(t, kDType, std::string("this module is ") + kiln::spec::kUri);
  if (!contiguous(t)) value_error(std::string(name) + " must be contiguous (shape " + t.shape_str() + ")");
  return t;
}

kiln::comm::AllReduceParams params(const std::vector<uintptr_t>& data, const std::vector<uintptr_t>& signals,
                                   const TensorView& out, int rank, int world_size, int64_t spin_limit,
                                   uintptr_t error) {
  if (world_size < 1 || world_size > kiln::comm::kMaxRanks) {
    value_error("world_size must be in [1, " + std::to_string(kiln::comm::kMaxRanks) + "], got " +
                std::to_string(world_size));
  }
  if (static_cast<int>(data.size()) != world_size || static_cast<int>(signals.size()) != world_size) {
    value_error("data and signals must hold world_size (" + std::to_string(world_size) + ") addresses, got " +
                std::to_string(data.size()) + " and " + std::to_string(signals.size()));
  }
  if (rank < 0 || rank >= world_size) {
    value_error("rank must be in [0, " + std::to_string(world_size) + "), got " + std::to_string(rank));
  }
  kiln::comm::AllReduceParams p{};
  for (int r = 0; r < world_size; ++r) {
    p.data.ptrs[r] = reinterpret_cast<void*>(data[r]);
    p.signals.ptrs[r] = reinterpret_cast<void*>(signals[r]);
    if (data[r] == reinterpret_cast<uintptr_t>(out.data)) value_error("out must not be a rank's data buffer");
  }
  p.out = out.data;
  p.rank = rank;
  p.world_size = world_size;
  p.count = out.numel();
  p.spin_limit = spin_limit;
  p.error = reinterpret_cast<int32_t*>(error);
  return p;
}

kiln::LaunchContext context(const TensorView& t, uintptr_t stream) {
  return kiln::LaunchContext{reinterpret_cast<void*>(stream), t.device.device_id};
}

void all_reduce(const std::vector<uintptr_t>& data, const std::vector<uintptr_t>& signals, py::handle out_obj, int rank,
                int world_size, int64_t spin_limit, uintptr_t error, int algo, uintptr_t stream) {
  TensorView out = cuda_tensor(out_obj, "out");
  kiln::comm::AllReduceParams p = params(data, signals, out, rank, world_size, spin_limit, error);
  if (algo != static_cast<int>(kiln::comm::Algo::kOneShot) && algo != static_cast<int>(kiln::comm::Algo::kTwoShot)) {
    value_error("algo must be 0 (one-shot) or 1 (two-shot), got " + std::to_string(algo));
  }
  p.algo = static_cast<kiln::comm::Algo>(algo);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::comm::all_reduce(p, context(out, stream));
  }
  raise_if(s);
}

void fused(const std::vector<uintptr_t>& data, const std::vector<uintptr_t>& signals, py::handle out_obj,
           py::handle residual_obj, py::handle weight_obj, int rank, int world_size, int64_t spin_limit,
           uintptr_t error, float eps, uintptr_t stream) {
  TensorView out = cuda_tensor(out_obj, "x");
  TensorView residual = cuda_tensor(residual_obj, "residual");
  TensorView weight = cuda_tensor(weight_obj, "weight");
  kiln::bindings::check_same_device(residual, out);
  kiln::bindings::check_same_device(weight, out);
  kiln::bindings::check_same_shape(residual, out);
  if (out.ndim < 1) value_error("x must have at least 1 dimension");
  if (weight.ndim != 1 || weight.shape[0] != out.size(-1)) {
    value_error("weight.shape must be [" + std::to_string(out.size(-1)) + "] (x.shape[-1]), got " + weight.shape_str());
  }
  kiln::bindings::check_disjoint(out, residual);
  kiln::comm::FusedParams f{};
  f.reduce = params(data, signals, out, rank, world_size, spin_limit, error);
  f.residual = residual.data;
  f.weight = weight.data;
  f.hidden = out.size(-1);
  f.rows = f.hidden > 0 ? out.numel() / f.hidden : 0;
  f.eps = eps;
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::comm::fused_allreduce_add_rmsnorm(f, context(out, stream));
  }
  raise_if(s);
}

void copy_to_buffer(uintptr_t dst, py::handle src_obj, uintptr_t stream) {
  TensorView src = cuda_tensor(src_obj, "src");
  raise_if(kiln::comm::copy_to_buffer(reinterpret_cast<void*>(dst), src.data,
                                      src.numel() * static_cast<int64_t>(sizeof(Elem)), context(src, stream)));
}

int read_and_clear_error(uintptr_t error, int device, uintptr_t stream) {
  int32_t value = 0;
  raise_if(kiln::comm::read_and_clear_error(reinterpret_cast<int32_t*>(error),
                                            kiln::LaunchContext{reinterpret_cast<void*>(stream), device}, &value));
  return value;
}

uintptr_t alloc_buffer(int64_t bytes, int device) {
  if (bytes < 1) value_error("bytes must be >= 1, got " + std::to_string(bytes));
  void* ptr = nullptr;
  raise_if(kiln::comm::alloc_buffer(bytes, device, &ptr));
  return reinterpret_cast<uintptr_t>(ptr);
}

py::bytes ipc_handle(uintptr_t ptr, int device) {
  kiln::comm::IpcHandle h{};
  raise_if(kiln::comm::ipc_get_handle(reinterpret_cast<void*>(ptr), device, &h));
  return py::bytes(h.bytes, kiln::comm::kIpcHandleBytes);
}

uintptr_t ipc_open(const std::string& handle, int device) {
  if (static_cast<int>(handle.size()) != kiln::comm::kIpcHandleBytes) {
    value_error("handle must be " + std::to_string(kiln::comm::kIpcHandleBytes) + " bytes, got " +
                std::to_string(handle.size()));
  }
  kiln::comm::IpcHandle h{};
  std::copy(handle.begin(), handle.end(), h.bytes);
  void* ptr = nullptr;
  raise_if(kiln::comm::ipc_open_handle(h, device, &ptr));
  return reinterpret_cast<uintptr_t>(ptr);
}

py::tuple can_access_peer(int device, int peer) {
  bool ok = false;
  const char* why = "";
  raise_if(kiln::comm::can_access_peer(device, peer, &ok, &why));
  return py::make_tuple(ok, std::string(why));
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:comm launcher for one dtype (CUDA)";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.attr("max_ranks") = kiln::comm::kMaxRanks;
  m.attr("signal_bytes") = kiln::comm::kSignalBytes;
  m.attr("barrier_timeout") = kiln::comm::kBarrierTimeout;
  py::dict algos;
  algos["one_shot"] = static_cast<int>(kiln::comm::Algo::kOneShot);
  algos["two_shot"] = static_cast<int>(kiln::comm::Algo::kTwoShot);
  m.attr("algos") = algos;
  m.def("all_reduce", &all_reduce, py::kw_only(), py::arg("data"), py::arg("signals"), py::arg("out"), py::arg("rank"),
        py::arg("world_size"), py::arg("spin_limit"), py::arg("error"), py::arg("algo"), py::arg("stream") = 0,
        "out = sum over ranks of their data buffers (rank order)");
  m.def("fused_allreduce_add_rmsnorm", &fused, py::kw_only(), py::arg("data"), py::arg("signals"), py::arg("out"),
        py::arg("residual"), py::arg("weight"), py::arg("rank"), py::arg("world_size"), py::arg("spin_limit"),
        py::arg("error"), py::arg("eps"), py::arg("stream") = 0,
        "residual += sum over ranks; out = rmsnorm(residual) * weight");
  m.def("copy_to_buffer", &copy_to_buffer, py::kw_only(), py::arg("dst"), py::arg("src"), py::arg("stream") = 0);
  m.def("read_and_clear_error", &read_and_clear_error, py::kw_only(), py::arg("error"), py::arg("device"),
        py::arg("stream") = 0);
  m.def("alloc_buffer", &alloc_buffer, py::kw_only(), py::arg("bytes"), py::arg("device"));
  m.def(
      "free_buffer",
      [](uintptr_t ptr, int device) { raise_if(kiln::comm::free_buffer(reinterpret_cast<void*>(ptr), device)); },
      py::kw_only(), py::arg("ptr"), py::arg("device"));
  m.def("ipc_handle", &ipc_handle, py::kw_only(), py::arg("ptr"), py::arg("device"));
  m.def("ipc_open", &ipc_open, py::kw_only(), py::arg("handle"), py::arg("device"));
  m.def(
      "ipc_close",
      [](uintptr_t ptr, int device) { raise_if(kiln::comm::ipc_close_handle(reinterpret_cast<void*>(ptr), device)); },
      py::kw_only(), py::arg("ptr"), py::arg("device"));
  m.def("can_access_peer", &can_access_peer, py::kw_only(), py::arg("device"), py::arg("peer"));
}
