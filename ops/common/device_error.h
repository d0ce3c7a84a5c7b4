// Index errors found on the device: a kernel that reads an index out of its range (a page id past
// the cache, a batch index past the batch, a position past the request's length, a GEMM segment
// past the rows of its input, a weight index past the weights) records the first
// one in a small per-device record and skips the work that index would have done, so it never
// reads or writes memory it does not own. The Python side reads the record (kiln.check_errors,
// a later plan(), or after every call with KILN_VALIDATE_INDICES=1) and raises a clear error.
//
// The record is four int64 in device memory, zero while no error was found:
//   [0] code (a family's, below), [1] position (the index into the array holding the bad value),
//   [2] the bad value, [3] the bound it broke (values must be in [0, bound)).
// The host backend checks the same things before it touches anything and returns an error Status
// at once instead (kiln::index_error builds its message from the same table).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/common/macros.h"

namespace kiln {

// Each family owns its codes and their messages, in its own header (ops/attention/attention.h,
// ops/gemm/gemm.h, ...): an enum class of int64_t codes made by error_code(family, n), so codes of
// different families never collide, and a table of ErrorText registered when the module loads
// (KILN_REGISTER_ERROR_TEXTS). A module exports every table registered in it (the bindings'
// error_texts), so the Python message and the C++ codes cannot drift apart, and this file does
// not change when a family adds a code.

// FNV-1a of the family's name, 15 bits: the code's bits 16..30 (tests/runtime/test_device_errors.py
// checks that no two families share them).
constexpr int64_t error_family(const char* name, uint32_t h = 2166136261u) {
  return *name ? error_family(name + 1, (h ^ static_cast<unsigned char>(*name)) * 16777619u)
               : static_cast<int64_t>(h & 0x7fffu) << 16;
}
constexpr int64_t error_code(const char* family, int n) {
  return error_family(family) | n;
}

// The message of each code, with {position}, {value} and {bound} filled in by the reader.
struct ErrorText {
  int64_t code;
  const char* text;
};

// The tables registered in this module (a list made while it loads, read afterwards only).
struct ErrorTable {
  const ErrorText* texts;
  size_t size;
  const ErrorTable* next;
};
inline const ErrorTable*& error_tables() {
  static const ErrorTable* head = nullptr;
  return head;
}
struct ErrorTableRegistration {
  ErrorTable table;
  template <size_t N>
  explicit ErrorTableRegistration(const ErrorText (&texts)[N]) : table{texts, N, error_tables()} {
    error_tables() = &table;
  }
};
// At namespace scope in a family's header, after its table: once per module, however many of
// its files include the header (an inline variable).
#define KILN_REGISTER_ERROR_TEXTS(texts) inline const ::kiln::ErrorTableRegistration texts##_registration{texts};

// Record the first error of a launch (later ones are dropped: one clear message is enough).
template <typename Code>
KILN_HOST_DEVICE void record_error(int64_t* record, Code code, int64_t position, int64_t value, int64_t bound) {
  if (record == nullptr) return;
#if defined(__CUDA_ARCH__)
  auto* word = reinterpret_cast<unsigned long long*>(record);
  if (atomicCAS(word, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    record[1] = position;
    record[2] = value;
    record[3] = bound;
    __threadfence();
  }
#else
  if (record[0] == 0) {
    record[0] = static_cast<int64_t>(code);
    record[1] = position;
    record[2] = value;
    record[3] = bound;
  }
#endif
}

// The message of a record, for the host backend's Status (the Python reader formats its own).
inline std::string index_error(int64_t code, int64_t position, int64_t value, int64_t bound) {
  std::string text = "index error " + std::to_string(code) + " at {position}: {value} outside [0, {bound})";
  for (const ErrorTable* t = error_tables(); t != nullptr; t = t->next) {
    for (size_t i = 0; i < t->size; ++i) {
      if (t->texts[i].code == code) text = t->texts[i].text;
    }
  }
  auto put = [&](const std::string& key, int64_t v) {
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key)) {
      text.replace(at, key.size(), std::to_string(v));
    }
  };
  put("{position}", position);
  put("{value}", value);
  put("{bound}", bound);
  return text;
}
template <typename Code>
std::string index_error(Code code, int64_t position, int64_t value, int64_t bound) {
  return index_error(static_cast<int64_t>(code), position, value, bound);
}

}  // namespace kiln
