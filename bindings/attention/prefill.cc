// //ops/attention:prefill launcher: validates the tensors, builds PrefillParams (ops/attention/
// attention.h) and calls the backend on the caller's stream. Every argument is keyword-only.
//
//   prefill(*, q, k_cache, v_cache, kv_layout, qo_indptr, kv_indptr, kv_indices, kv_len,
//           work_request, work_q_start, out, lse, sm_scale, soft_cap, causal, window_left,
//           kernel="fa2" | "fa3" | "fa3_strict", kv_contiguous=False, custom_mask=None,
//           mask_indptr=None, rope_scale=1.0, rope_theta=1e4, errors=0, stream=0)
//   queries_per_item    queries per work item (the plan's tile), attention.h's constant
//   custom_mask, pos_encoding    the module's variant (its BUILD axes)
// A custom-mask module takes custom_mask (uint8 [bytes], the packed bits) and mask_indptr (int32
// [batch + 1], each request's first byte); any other module refuses them. rope_scale and
// rope_theta apply to pos_encoding rope (ROPE_LLAMA) modules.
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/attention/common.h"

constexpr bool kCustomMask = kiln::spec::custom_mask;

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
namespace ka = kiln::attention;
using namespace kiln::bindings::attention;
using kb::TensorView;
using kb::value_error;

// FlashInfer's backend names, and "fa3_strict": fa3 with an error instead of a fallback (tests).
int32_t kernel_code(const std::string& kernel) {
  if (kernel == "fa2") return ka::kPrefillKernelFA2;
  if (kernel == "fa3") return ka::kPrefillKernelFA3;
  if (kernel == "fa3_strict") return ka::kPrefillKernelFA3Strict;
  value_error("kernel must be 'fa2', 'fa3' or 'fa3_strict', got '" + kernel + "'");
}

void prefill(py::handle q_obj, py::handle k_obj, py::handle v_obj, const std::string& layout, py::handle qo_indptr_obj,
             py::handle indptr_obj, py::handle indices_obj, py::handle kv_len_obj, py::handle work_request,
             py::handle work_q_start, py::handle out_obj, py::handle lse_obj, double sm_scale, double soft_cap,
             bool causal, int window_left, const std::string& kernel, bool kv_contiguous, py::handle mask_obj,
             py::handle mask_indptr_obj, double rope_scale, double rope_theta, uintptr_t errors, uintptr_t stream) {
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
  check_heads(num_qo_heads, cache);
  const TensorView wr = index_view(work_request, "work_request", q);
  const TensorView wq = index_view(work_q_start, "work_q_start", q);
  kb::check_same_shape(wq, wr);
  TensorView out = out_view(out_obj, "out", 3, q);
  kb::check_same_shape(out, q);
  ka::PrefillParams p{};
  if (!lse_obj.is_none()) {
    const TensorView lse = float_view(lse_obj, "lse", 2, q);
    check_lse(lse, q.size(0), num_qo_heads);
    kb::check_no_internal_overlap(lse);
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_n = lse.stride(0);
  }
  check_scales<kiln::spec::soft_cap>(sm_scale, soft_cap);
  if (window_left < -1) value_error("window_left must be -1 (no window) or >= 0, got " + std::to_string(window_left));
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
  p.kernel = kernel_code(kernel);
  p.kv_contiguous = kv_contiguous;
  p.kv_num_pages = cache.num_pages;
  p.q_rows = q.size(0);
  if (kCustomMask != !mask_obj.is_none() || kCustomMask != !mask_indptr_obj.is_none()) {
    value_error(std::string(kCustomMask
                                ? "this module applies a custom mask: custom_mask and mask_indptr are required"
                                : "this module applies no custom mask: custom_mask and mask_indptr must be None") +
                " (" + module_what() + ")");
  }
  if constexpr (kCustomMask) {
    const TensorView mask = kb::view_of(mask_obj, "custom_mask");
    kb::check_same_device(mask, q);
    kb::check_dtype(mask, kiln::dl::DataType{kiln::dl::kUInt, 8, 1}, "the packed mask is uint8 bytes");
    kb::check_ndim(mask, 1, 1);
    kb::check_last_contiguous(mask);
    const TensorView mask_indptr = index_view(mask_indptr_obj, "mask_indptr", q);
    if (mask_indptr.size(0) != batch + 1) {
      value_error("mask_indptr must have " + std::to_string(batch + 1) + " entries (batch + 1), got " +
                  std::to_string(mask_indptr.size(0)));
    }
    p.custom_mask = static_cast<const uint8_t*>(mask.data);
    p.mask_indptr = ptr<int32_t>(mask_indptr);
    p.mask_bytes = mask.size(0);
  }
  if (!(rope_scale > 0 && std::isfinite(rope_scale)) || !(rope_theta > 0 && std::isfinite(rope_theta))) {
    value_error("rope_scale and rope_theta must be finite and > 0, got " + std::to_string(rope_scale) + " and " +
                std::to_string(rope_theta));
  }
  p.rope_rcp_scale = static_cast<float>(1.0 / rope_scale);
  p.rope_theta = static_cast<float>(rope_theta);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = ka::prefill(p, context(q, stream, errors));
  }
  raise_if_failed(s);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/attention:prefill launcher for one dtype, head_dim, soft-cap flag and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("head_dim") = kHeadDim;
  m.attr("queries_per_item") = ka::kPrefillQueriesPerItem;
  m.attr("custom_mask") = kCustomMask;
  m.attr("pos_encoding") = kiln::spec::pos_encoding;
  kb::export_error_texts(m);
  m.def("prefill", &prefill, py::kw_only(), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"),
        py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_len"), py::arg("work_request"),
        py::arg("work_q_start"), py::arg("out"), py::arg("lse"), py::arg("sm_scale"), py::arg("soft_cap"),
        py::arg("causal"), py::arg("window_left"), py::arg("kernel") = "fa2", py::arg("kv_contiguous") = false,
        py::arg("custom_mask") = py::none(), py::arg("mask_indptr") = py::none(), py::arg("rope_scale") = 1.0,
        py::arg("rope_theta") = 1e4, py::arg("errors") = 0, py::arg("stream") = 0);
}
