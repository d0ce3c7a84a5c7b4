// //ops:attention launchers: validate the tensors, build the parameter structs of
// ops/attention/attention.h, and call the backend on the caller's stream. The only C++ of the
// attention family that knows Python (R3.3, R8.2).
//
//   decode(q, k_cache, v_cache, kv_layout, page_indptr, page_indices, work_request,
//          work_token_begin, work_token_end, work_out_index, merge_request, merge_indptr,
//          out, lse, partial_out, partial_lse, sm_scale, soft_cap, stream)
//   prefill(q, k_cache, v_cache, kv_layout, qo_indptr, kv_indptr, kv_indices, kv_len,
//           work_request, work_q_start, out, lse, sm_scale, soft_cap, causal, window_left,
//           kernel (0 fa2, 1 fa3, 2 fa3 without fallback), kv_contiguous, stream)
//   merge_states(v, s, out, out_lse, stream)                     v [n, states, heads, dim]
//   merge_two(a, a_lse, b, b_lse, mask, out, out_lse, stream)    a, b, out [n, heads, dim]
//   append_paged_kv(key, value, batch_indices, positions, k_cache, v_cache, kv_layout,
//                   page_indptr, page_indices, stream)
//
// Caches: NHD [pages, page_size, kv_heads, head_dim] or HND [pages, kv_heads, page_size,
// head_dim], any page/slot/head strides (slices of a larger pool work), last dim contiguous.
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/common/tensor_view.h"
#include "ops/attention/attention.h"
#include "ops/common/dtypes.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using kb::TensorView;
using kb::value_error;
using kb::view_of;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kb::dl_dtype<Elem>();
constexpr kiln::dl::DataType kInt32{kiln::dl::kInt, 32, 1};
constexpr kiln::dl::DataType kFloat32{kiln::dl::kFloat, 32, 1};
constexpr kiln::dl::DataType kBool{kiln::dl::kBool, 8, 1};
constexpr int64_t kHeadDim = kiln::spec::head_dim;
constexpr int64_t kVec = 16 / sizeof(Elem);  // the kernels' 16-byte vectors
enum Layout : int { kNHD = 0, kHND = 1 };

std::string module_what() {
  return std::string("this module is ") + kiln::spec::kUri;
}

void raise_if_failed(const kiln::Status& s) {
  if (!s.ok()) throw std::runtime_error("kiln " + std::string(kiln::spec::kUri) + ": " + s.message);
}

kiln::LaunchContext context(const TensorView& t, uintptr_t stream) {
  return {reinterpret_cast<void*>(stream), t.device.device_type == kiln::dl::kCPU ? -1 : t.device.device_id};
}

// A tensor of the module's dtype whose last dimension is head_dim and whose rows are 16-byte
// vectors (pointer and every stride aligned), as the kernels read and write them.
TensorView elem_view(py::handle obj, const char* name, int ndim, const TensorView* ref) {
  TensorView t = view_of(obj, name);
  if (ref) kb::check_same_device(t, *ref);
  kb::check_backend_device(t);
  kb::check_dtype(t, kDType, module_what());
  kb::check_ndim(t, ndim, ndim);
  kb::check_dim(t, -1, kHeadDim, "the module's head_dim");
  kb::check_last_contiguous(t);
  bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int i = 0; i < t.ndim - 1; ++i) aligned = aligned && (t.strides[i] % kVec == 0 || t.shape[i] == 1);
  if (!aligned)
    value_error(t.name +
                " must be 16-byte aligned (data pointer and every stride); slice it along "
                "leading dimensions only or call .contiguous()");
  return t;
}

TensorView index_view(py::handle obj, const char* name, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, ref);
  kb::check_dtype(t, kInt32, "indices are int32");
  kb::check_ndim(t, 1, 1);
  kb::check_last_contiguous(t);
  return t;
}

TensorView float_view(py::handle obj, const char* name, int ndim, const TensorView& ref) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, ref);
  kb::check_dtype(t, kFloat32, "attention states are float32");
  kb::check_ndim(t, ndim, ndim);
  kb::check_last_contiguous(t);
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

Cache paged_cache(py::handle k_obj, py::handle v_obj, int layout, const TensorView& indptr, const TensorView& indices,
                  const TensorView& ref) {
  if (layout != kNHD && layout != kHND)
    value_error("kv_layout must be 0 (NHD) or 1 (HND), got " + std::to_string(layout));
  const TensorView k = elem_view(k_obj, "k_cache", 4, &ref);
  const TensorView v = elem_view(v_obj, "v_cache", 4, &ref);
  kb::check_same_shape(v, k);
  const int slot_dim = layout == kNHD ? 1 : 2, head_dim = layout == kNHD ? 2 : 1;
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
  if (c.kv.page_size < 1) value_error("k_cache has page_size 0 (shape " + k.shape_str() + ")");
  return c;
}

void decode(py::handle q_obj, py::handle k_obj, py::handle v_obj, int layout, py::handle indptr_obj,
            py::handle indices_obj, py::handle work_request, py::handle work_begin, py::handle work_end,
            py::handle work_out, py::handle merge_request, py::handle merge_indptr, py::handle out_obj,
            py::handle lse_obj, py::handle partial_out_obj, py::handle partial_lse_obj, double sm_scale,
            double soft_cap, uintptr_t stream) {
  const TensorView q = elem_view(q_obj, "q", 3, nullptr);
  const TensorView indptr = index_view(indptr_obj, "indptr", q);
  const TensorView indices = index_view(indices_obj, "indices", q);
  const Cache cache = paged_cache(k_obj, v_obj, layout, indptr, indices, q);
  const int64_t batch = q.size(0), num_qo_heads = q.size(1);
  if (cache.num_kv_heads < 1 || num_qo_heads % cache.num_kv_heads != 0) {
    value_error("q has " + std::to_string(num_qo_heads) + " heads, which is not a multiple of the cache's " +
                std::to_string(cache.num_kv_heads) + " kv heads");
  }
  if (indptr.size(0) < batch + 1) {
    value_error("indptr has " + std::to_string(indptr.size(0)) + " entries; q's batch of " + std::to_string(batch) +
                " needs " + std::to_string(batch + 1));
  }
  const TensorView wr = index_view(work_request, "work_request", q), wb = index_view(work_begin, "work_token_begin", q);
  const TensorView we = index_view(work_end, "work_token_end", q), wo = index_view(work_out, "work_out_index", q);
  const TensorView mr = index_view(merge_request, "merge_request", q);
  const TensorView mi = index_view(merge_indptr, "merge_indptr", q);
  for (const TensorView* t : {&wb, &we, &wo}) kb::check_same_shape(*t, wr);
  if (mi.size(0) != mr.size(0) + 1) value_error("merge_indptr must have merge_request.shape[0] + 1 entries");
  TensorView out = elem_view(out_obj, "out", 3, &q);
  kb::check_same_shape(out, q);
  kiln::attention::DecodeParams p{};
  if (!lse_obj.is_none()) {
    const TensorView lse = float_view(lse_obj, "lse", 2, q);
    if (lse.size(0) != batch || lse.size(1) != num_qo_heads || lse.stride(1) != 1) {
      value_error("lse must be a [" + std::to_string(batch) + ", " + std::to_string(num_qo_heads) +
                  "] float32 tensor with contiguous rows, got shape " + lse.shape_str());
    }
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_b = lse.stride(0);
  }
  if (mr.size(0) > 0 || !partial_out_obj.is_none()) {
    const TensorView po = float_view(partial_out_obj, "partial_out", 3, q);
    const TensorView pl = float_view(partial_lse_obj, "partial_lse", 2, q);
    if (po.size(1) != num_qo_heads || po.size(2) != kHeadDim || pl.size(0) != po.size(0) ||
        pl.size(1) != num_qo_heads || po.stride(0) != num_qo_heads * kHeadDim || po.stride(1) != kHeadDim ||
        pl.stride(0) != num_qo_heads) {
      value_error("partial_out/partial_lse must be contiguous [slots, num_qo_heads, head_dim] / [slots, num_qo_heads]");
    }
    p.partial_out = static_cast<float*>(po.data);
    p.partial_lse = static_cast<float*>(pl.data);
  }
  if (!(sm_scale > 0) || !std::isfinite(sm_scale)) value_error("sm_scale must be finite and > 0");
  if (kiln::spec::soft_cap && !(soft_cap > 0))
    value_error("this module applies a logits soft-cap: soft_cap must be > 0");
  p.q = q.data;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.kv = cache.kv;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = cache.num_kv_heads;
  p.work_request = ptr<int32_t>(wr);
  p.work_token_begin = ptr<int32_t>(wb);
  p.work_token_end = ptr<int32_t>(we);
  p.work_out_index = ptr<int32_t>(wo);
  p.work_capacity = wr.size(0);
  p.merge_request = ptr<int32_t>(mr);
  p.merge_indptr = ptr<int32_t>(mi);
  p.merge_capacity = mr.size(0);
  p.out = out.data;
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.sm_scale = static_cast<float>(sm_scale);
  p.soft_cap = static_cast<float>(soft_cap);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::attention::decode(p, context(q, stream));
  }
  raise_if_failed(s);
}

void prefill(py::handle q_obj, py::handle k_obj, py::handle v_obj, int layout, py::handle qo_indptr_obj,
             py::handle indptr_obj, py::handle indices_obj, py::handle kv_len_obj, py::handle work_request,
             py::handle work_q_start, py::handle out_obj, py::handle lse_obj, double sm_scale, double soft_cap,
             bool causal, int window_left, int kernel, bool kv_contiguous, uintptr_t stream) {
  const TensorView q = elem_view(q_obj, "q", 3, nullptr);
  const TensorView qo_indptr = index_view(qo_indptr_obj, "qo_indptr", q);
  const TensorView indptr = index_view(indptr_obj, "kv_indptr", q);
  const TensorView indices = index_view(indices_obj, "kv_indices", q);
  const TensorView kv_len = index_view(kv_len_obj, "kv_len", q);
  const Cache cache = paged_cache(k_obj, v_obj, layout, indptr, indices, q);
  const int64_t batch = kv_len.size(0), num_qo_heads = q.size(1);
  if (qo_indptr.size(0) != batch + 1 || indptr.size(0) < batch + 1) {
    value_error("qo_indptr must have " + std::to_string(batch + 1) + " entries and kv_indptr at least that many");
  }
  if (cache.num_kv_heads < 1 || num_qo_heads % cache.num_kv_heads != 0) {
    value_error("q has " + std::to_string(num_qo_heads) + " heads, which is not a multiple of the cache's " +
                std::to_string(cache.num_kv_heads) + " kv heads");
  }
  const TensorView wr = index_view(work_request, "work_request", q);
  const TensorView wq = index_view(work_q_start, "work_q_start", q);
  kb::check_same_shape(wq, wr);
  TensorView out = elem_view(out_obj, "out", 3, &q);
  kb::check_same_shape(out, q);
  kiln::attention::PrefillParams p{};
  if (!lse_obj.is_none()) {
    const TensorView lse = float_view(lse_obj, "lse", 2, q);
    if (lse.size(0) != q.size(0) || lse.size(1) != num_qo_heads || lse.stride(1) != 1) {
      value_error("lse must be a [" + std::to_string(q.size(0)) + ", " + std::to_string(num_qo_heads) +
                  "] float32 tensor with contiguous rows, got shape " + lse.shape_str());
    }
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_n = lse.stride(0);
  }
  if (!(sm_scale > 0) || !std::isfinite(sm_scale)) value_error("sm_scale must be finite and > 0");
  if (kiln::spec::soft_cap && !(soft_cap > 0))
    value_error("this module applies a logits soft-cap: soft_cap must be > 0");
  p.q = q.data;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.qo_indptr = ptr<int32_t>(qo_indptr);
  p.kv_len = ptr<int32_t>(kv_len);
  p.kv = cache.kv;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = cache.num_kv_heads;
  p.work_request = ptr<int32_t>(wr);
  p.work_q_start = ptr<int32_t>(wq);
  p.work_capacity = wr.size(0);
  p.out = out.data;
  p.out_stride_n = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.sm_scale = static_cast<float>(sm_scale);
  p.soft_cap = static_cast<float>(soft_cap);
  p.causal = causal;
  p.window_left = window_left;
  if (kernel < kiln::attention::kPrefillKernelFA2 || kernel > kiln::attention::kPrefillKernelFA3Strict)
    value_error("kernel must be 0 (fa2), 1 (fa3) or 2 (fa3, no fallback), got " + std::to_string(kernel));
  p.kernel = kernel;
  p.kv_contiguous = kv_contiguous;
  p.kv_num_pages = cache.num_pages;
  p.q_rows = q.size(0);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::attention::prefill(p, context(q, stream));
  }
  raise_if_failed(s);
}

void merge_states(py::handle v_obj, py::handle s_obj, py::handle out_obj, py::handle out_lse_obj, uintptr_t stream) {
  const TensorView v = elem_view(v_obj, "v", 4, nullptr);
  const TensorView s = float_view(s_obj, "s", 3, v);
  if (s.size(0) != v.size(0) || s.size(1) != v.size(1) || s.size(2) != v.size(2)) {
    value_error("s.shape must be v.shape[:3] " + v.shape_str() + ", got " + s.shape_str());
  }
  const TensorView out = elem_view(out_obj, "out", 3, &v);
  const TensorView out_lse = float_view(out_lse_obj, "out_lse", 2, v);
  kiln::attention::MergeParams p{};
  p.v = v.data;
  p.s = ptr<float>(s);
  p.num_items = v.size(0);
  p.num_states = v.size(1);
  p.num_heads = v.size(2);
  p.v_item_stride = v.stride(0);
  p.v_state_stride = v.stride(1);
  p.v_head_stride = v.stride(2);
  p.s_item_stride = s.stride(0);
  p.s_state_stride = s.stride(1);
  p.s_head_stride = s.stride(2);
  p.out = out.data;
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.out_lse = static_cast<float*>(out_lse.data);
  p.lse_row_stride = out_lse.stride(0);
  p.lse_head_stride = out_lse.stride(1);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::merge_states(p, context(v, stream));
  }
  raise_if_failed(st);
}

void merge_two(py::handle a_obj, py::handle a_lse_obj, py::handle b_obj, py::handle b_lse_obj, py::handle mask_obj,
               py::handle out_obj, py::handle out_lse_obj, uintptr_t stream) {
  const TensorView a = elem_view(a_obj, "v_a", 3, nullptr);
  const TensorView b = elem_view(b_obj, "v_b", 3, &a);
  kb::check_same_shape(b, a);
  const TensorView out = elem_view(out_obj, "out", 3, &a);
  kb::check_same_shape(out, a);
  const TensorView la = float_view(a_lse_obj, "s_a", 2, a), lb = float_view(b_lse_obj, "s_b", 2, a);
  const TensorView lo = float_view(out_lse_obj, "out_lse", 2, a);
  for (const TensorView* t : {&la, &lb, &lo}) {
    if (t->size(0) != a.size(0) || t->size(1) != a.size(1)) {
      value_error(t->name + ".shape must be " + a.name + ".shape[:2] [" + std::to_string(a.size(0)) + ", " +
                  std::to_string(a.size(1)) + "], got " + t->shape_str());
    }
  }
  kiln::attention::MergeTwoParams p{};
  if (!mask_obj.is_none()) {
    const TensorView mask = view_of(mask_obj, "mask");
    kb::check_same_device(mask, a);
    kb::check_dtype(mask, kBool, "mask is boolean");
    kb::check_ndim(mask, 1, 1);
    kb::check_dim(mask, 0, a.size(0), "the number of rows");
    kb::check_last_contiguous(mask);
    p.mask = static_cast<const uint8_t*>(mask.data);
  }
  p.a = a.data;
  p.b = b.data;
  p.a_lse = ptr<float>(la);
  p.b_lse = ptr<float>(lb);
  p.out = out.data;
  p.out_lse = static_cast<float*>(lo.data);
  p.rows = a.size(0);
  p.num_heads = a.size(1);
  p.a_row_stride = a.stride(0);
  p.a_head_stride = a.stride(1);
  p.b_row_stride = b.stride(0);
  p.b_head_stride = b.stride(1);
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.a_lse_row_stride = la.stride(0);
  p.b_lse_row_stride = lb.stride(0);
  p.out_lse_row_stride = lo.stride(0);
  for (const TensorView* t : {&la, &lb, &lo}) {
    if (t->size(1) > 1 && t->stride(1) != 1) value_error(t->name + " must be contiguous in its last dimension");
  }
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::merge_two(p, context(a, stream));
  }
  raise_if_failed(st);
}

void append_paged_kv(py::handle key_obj, py::handle value_obj, py::handle batch_obj, py::handle pos_obj,
                     py::handle k_obj, py::handle v_obj, int layout, py::handle indptr_obj, py::handle indices_obj,
                     uintptr_t stream) {
  const TensorView key = elem_view(key_obj, "append_key", 3, nullptr);
  const TensorView value = elem_view(value_obj, "append_value", 3, &key);
  kb::check_same_shape(value, key);
  const TensorView batch = index_view(batch_obj, "batch_indices", key);
  const TensorView pos = index_view(pos_obj, "positions", key);
  kb::check_dim(batch, 0, key.size(0), "append_key.shape[0]");
  kb::check_dim(pos, 0, key.size(0), "append_key.shape[0]");
  const TensorView indptr = index_view(indptr_obj, "kv_indptr", key);
  const TensorView indices = index_view(indices_obj, "kv_indices", key);
  const Cache cache = paged_cache(k_obj, v_obj, layout, indptr, indices, key);
  kb::check_dim(key, 1, cache.num_kv_heads, "the cache's kv heads");
  kiln::attention::AppendParams p{};
  p.key = key.data;
  p.value = value.data;
  p.key_stride_n = key.stride(0);
  p.key_stride_h = key.stride(1);
  p.value_stride_n = value.stride(0);
  p.value_stride_h = value.stride(1);
  p.batch_indices = ptr<int32_t>(batch);
  p.positions = ptr<int32_t>(pos);
  p.nnz = key.size(0);
  p.num_kv_heads = cache.num_kv_heads;
  p.kv = cache.kv;
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::append_paged_kv(p, context(key, stream));
  }
  raise_if_failed(st);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:attention launchers for one dtype, head_dim, soft-cap flag and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("head_dim") = kHeadDim;
  m.def("decode", &decode, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"),
        py::arg("page_indptr"), py::arg("page_indices"), py::arg("work_request"), py::arg("work_token_begin"),
        py::arg("work_token_end"), py::arg("work_out_index"), py::arg("merge_request"), py::arg("merge_indptr"),
        py::arg("out"), py::arg("lse"), py::arg("partial_out"), py::arg("partial_lse"), py::arg("sm_scale"),
        py::arg("soft_cap"), py::arg("stream") = 0);
  m.def("prefill", &prefill, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"),
        py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_len"), py::arg("work_request"),
        py::arg("work_q_start"), py::arg("out"), py::arg("lse"), py::arg("sm_scale"), py::arg("soft_cap"),
        py::arg("causal"), py::arg("window_left"), py::arg("kernel") = 0, py::arg("kv_contiguous") = false,
        py::arg("stream") = 0);
  m.def("merge_states", &merge_states, py::arg("v"), py::arg("s"), py::arg("out"), py::arg("out_lse"),
        py::arg("stream") = 0);
  m.def("merge_two", &merge_two, py::arg("v_a"), py::arg("s_a"), py::arg("v_b"), py::arg("s_b"), py::arg("mask"),
        py::arg("out"), py::arg("out_lse"), py::arg("stream") = 0);
  m.def("append_paged_kv", &append_paged_kv, py::arg("append_key"), py::arg("append_value"), py::arg("batch_indices"),
        py::arg("positions"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"), py::arg("kv_indptr"),
        py::arg("kv_indices"), py::arg("stream") = 0);
}
