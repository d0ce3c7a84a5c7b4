// What every launcher shares about failures: the launch context (stream, device, the device's
// index-error record), a failed Status as a Python exception (IndexError for an index out of range
// found by the host backend, RuntimeError otherwise), and the table of index-error messages the
// Python side formats device-recorded errors with (ops/common/device_error.h).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bindings/common/tensor_view.h"
#include "ops/common/device_error.h"
#include "ops/common/status.h"

namespace kiln::bindings {

namespace py = pybind11;

// `errors`: the address of the device's error record (kiln/errors.py; 0 on the CPU). `pdl`: the
// caller's resolved enable_pdl (kiln.utils.use_pdl: true only on sm90+), never set on the host.
inline kiln::LaunchContext launch_context(const TensorView& t, uintptr_t stream, uintptr_t errors, bool pdl = false) {
  const bool host = t.device.device_type == dl::kCPU || t.device.device_type == dl::kCUDAHost;
  return {reinterpret_cast<void*>(stream), host ? -1 : t.device.device_id,
          host ? nullptr : reinterpret_cast<int64_t*>(errors), pdl && !host};
}

inline void raise_if_failed(const kiln::Status& s, const char* uri) {
  if (s.ok()) return;
  const std::string message = "kiln " + std::string(uri) + ": " + s.message;
  if (s.code == kiln::Status::kIndexError) throw py::index_error(message);
  throw std::runtime_error(message);
}

// Every table registered in this module (its family's, and those of the families it includes).
inline void export_error_texts(py::module_& m) {
  py::dict texts;
  for (const kiln::ErrorTable* t = kiln::error_tables(); t != nullptr; t = t->next) {
    for (size_t i = 0; i < t->size; ++i) texts[py::int_(t->texts[i].code)] = t->texts[i].text;
  }
  m.attr("error_texts") = texts;
}

}  // namespace kiln::bindings
