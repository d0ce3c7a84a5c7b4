// What the //ops/attention launchers share: views of the module's head-dim rows, int32 index
// arrays and float32 states, and the paged KV cache. Included by each target's binding.
//
// Caches: NHD [pages, page_size, kv_heads, head_dim] or HND [pages, kv_heads, page_size,
// head_dim], any page/slot/head strides (slices of a larger pool work), last dim contiguous; of
// the module's dtype, or of its kv_dtype where it has that axis (paged_cache<KV>).
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/attention/attention.h"
#include "ops/common/dtypes.h"
#include "spec_config.h"

namespace kiln::bindings::attention {

namespace py = pybind11;
using Elem = kiln::spec::dtype;
constexpr dl::DataType kInt32{dl::kInt, 32, 1};
constexpr dl::DataType kFloat32{dl::kFloat, 32, 1};
constexpr dl::DataType kBool{dl::kBool, 8, 1};
constexpr int64_t kHeadDim = kiln::spec::head_dim;

inline std::string module_what() {
  return std::string("this module is ") + kiln::spec::kUri;
}

inline void raise_if_failed(const kiln::Status& s) {
  kiln::bindings::raise_if_failed(s, kiln::spec::kUri);
}

inline kiln::LaunchContext context(const TensorView& t, uintptr_t stream, uintptr_t errors) {
  return launch_context(t, stream, errors);
}

// A tensor of element type E (the module's dtype by default) whose last dimension is head_dim and
// whose rows are 16-byte vectors (pointer and every stride aligned), as the kernels read and
// write them.
template <typename E = Elem>
TensorView elem_view(py::handle obj, const char* name, int ndim, const TensorView* ref) {
  constexpr int64_t vec = 16 / sizeof(E);
  TensorView t = view_of(obj, name);
  if (ref) check_same_device(t, *ref);
  check_backend_device(t);
  check_dtype(t, dl_dtype<E>(), module_what());
  check_ndim(t, ndim, ndim);
  check_dim(t, -1, kHeadDim, "the module's head_dim");
  check_last_contiguous(t);
  bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int i = 0; i < t.ndim - 1; ++i) aligned = aligned && (t.strides[i] % vec == 0 || t.shape[i] == 1);
  if (!aligned)
    value_error(t.name +
                " must be 16-byte aligned (data pointer and every stride); slice it along "
                "leading dimensions only or call .contiguous()");
  return t;
}

// An output of the module's dtype: elem_view, written by no two index tuples, and apart from
// `input` (the tensor the kernel reads while it writes this one).
inline TensorView out_view(py::handle obj, const char* name, int ndim, const TensorView& input) {
  TensorView t = elem_view(obj, name, ndim, &input);
  check_no_internal_overlap(t);
  check_disjoint(t, input);
  return t;
}

inline TensorView index_view(py::handle obj, const char* name, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  check_same_device(t, ref);
  check_dtype(t, kInt32, "indices are int32");
  check_ndim(t, 1, 1);
  check_last_contiguous(t);
  return t;
}

inline TensorView float_view(py::handle obj, const char* name, int ndim, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  check_same_device(t, ref);
  check_dtype(t, kFloat32, "attention states are float32");
  check_ndim(t, ndim, ndim);
  check_last_contiguous(t);
  return t;
}

template <typename T>
const T* ptr(const TensorView& t) {
  return static_cast<const T*>(t.data);
}

struct Cache {
  kiln::attention::PagedKV kv{};
  int64_t num_kv_heads = 0;
  int64_t num_pages = 0;
};

// "NHD" or "HND": the layout names FlashInfer's kv_layout takes.
inline bool is_nhd(const std::string& layout) {
  if (layout != "NHD" && layout != "HND") value_error("kv_layout must be 'NHD' or 'HND', got '" + layout + "'");
  return layout == "NHD";
}

// KV: the cache's element type (the module's kv_dtype where it has one).
template <typename KV = Elem>
Cache paged_cache(py::handle k_obj, py::handle v_obj, const std::string& layout, const TensorView& indptr,
                  const TensorView& indices, const TensorView& ref) {
  const bool nhd = is_nhd(layout);
  const TensorView k = elem_view<KV>(k_obj, "k_cache", 4, &ref);
  const TensorView v = elem_view<KV>(v_obj, "v_cache", 4, &ref);
  check_same_shape(v, k);
  const int slot_dim = nhd ? 1 : 2, head_dim = nhd ? 2 : 1;
  Cache c;
  c.num_kv_heads = k.size(head_dim);
  c.kv.k = k.data;
  c.kv.v = v.data;
  c.kv.k_page_stride = k.stride(0);
  c.kv.k_slot_stride = k.stride(slot_dim);
  c.kv.k_head_stride = k.stride(head_dim);
  c.kv.v_page_stride = v.stride(0);
  c.kv.v_slot_stride = v.stride(slot_dim);
  c.kv.v_head_stride = v.stride(head_dim);
  c.kv.page_size = k.size(slot_dim);
  c.num_pages = k.size(0);
  c.kv.page_indptr = ptr<int32_t>(indptr);
  c.kv.page_indices = ptr<int32_t>(indices);
  c.kv.num_pages = c.num_pages;
  c.kv.num_indices = indices.size(0);
  if (c.kv.page_size < 1) value_error("k_cache has page_size 0 (shape " + k.shape_str() + ")");
  if (indptr.size(0) < 1) value_error("the page table's indptr has no entry (a batch of B needs B + 1)");
  return c;
}

inline void check_lse(const TensorView& lse, int64_t rows, int64_t heads) {
  if (lse.size(0) != rows || lse.size(1) != heads || lse.stride(1) != 1) {
    value_error("lse must be a [" + std::to_string(rows) + ", " + std::to_string(heads) +
                "] float32 tensor with contiguous rows, got shape " + lse.shape_str());
  }
}

inline void check_heads(int64_t num_qo_heads, const Cache& cache) {
  if (cache.num_kv_heads < 1 || num_qo_heads % cache.num_kv_heads != 0) {
    value_error("q has " + std::to_string(num_qo_heads) + " heads, which is not a multiple of the cache's " +
                std::to_string(cache.num_kv_heads) + " kv heads");
  }
}

// The cache's per-tensor k_scale / v_scale: finite and > 0; `fp8_only`: a 16-bit cache takes 1.
template <typename KV>
void check_kv_scales(double k_scale, double v_scale, bool fp8_only) {
  for (const auto& [name, value] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    if (!(value > 0 && std::isfinite(value)))
      value_error(std::string(name) + " must be finite and > 0, got " + std::to_string(value));
    if (fp8_only && sizeof(KV) != 1 && value != 1.0)
      value_error(std::string(name) + " applies to fp8 caches only; this module's cache is 16-bit (pass 1)");
  }
}

// sm_scale, and soft_cap where the module applies one (SOFT_CAP: its soft_cap axis).
template <bool SOFT_CAP>
void check_scales(double sm_scale, double soft_cap) {
  if (!(sm_scale > 0) || !std::isfinite(sm_scale)) value_error("sm_scale must be finite and > 0");
  if (SOFT_CAP && !(soft_cap > 0 && std::isfinite(soft_cap)))
    value_error("this module applies a logits soft-cap: soft_cap must be finite and > 0");
}

}  // namespace kiln::bindings::attention
