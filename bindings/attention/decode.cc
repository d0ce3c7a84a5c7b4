// //ops/attention:decode launcher: validates the tensors, builds DecodeParams (ops/attention/
// attention.h) and calls the backend on the caller's stream. Every argument is keyword-only, so a
// swapped pair of arguments is an error, never a silent mix-up.
//
//   decode(*, q, k_cache, v_cache, kv_layout, page_indptr, page_indices, kv_len, work_request,
//          work_token_begin, work_token_end, work_out_index, work_merge_index, merge_request,
//          merge_indptr, merge_counter, out, lse, partial_out, partial_lse, sm_scale, soft_cap,
//          k_scale=1, v_scale=1, q_len=1, window_left=-1, rope_scale=1, rope_theta=1e4, errors=0,
//          stream=0)
//   q/out [batch * q_len, heads, head_dim] (request b's queries are rows b * q_len ..), lse
//   [batch * q_len, heads]; kv_len [>= batch] int32, the requests' lengths (query positions);
//   partial_out [slots, q_len * heads, head_dim], partial_lse [slots, q_len * heads];
//   rope_scale / rope_theta: used by ROPE_LLAMA modules (rope axis true) only
//   merge_counter: int32, at least merge entries x CTAs per work item, zero before the first
//   launch (the kernel leaves it zero)
//   k_cache/v_cache: of the module's kv_dtype (its dtype, or fp8 E4M3); logits use k * k_scale, out
//   v * v_scale
//   errors: the address of the device's index-error record (kiln/errors.py), 0 on the CPU
//   heads_per_cta(group_size) -> int    the kernel's query heads per CTA at one query a request
//   ctas_per_item(num_qo_heads, num_kv_heads, q_len) -> int    CTAs per work item (the schedule)
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/attention/common.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using namespace kiln::bindings::attention;
using kb::TensorView;
using kb::value_error;

void decode(py::handle q_obj, py::handle k_obj, py::handle v_obj, const std::string& layout, py::handle indptr_obj,
            py::handle indices_obj, py::handle kv_len_obj, py::handle work_request, py::handle work_begin,
            py::handle work_end, py::handle work_out, py::handle work_merge, py::handle merge_request,
            py::handle merge_indptr, py::handle merge_counter, py::handle out_obj, py::handle lse_obj,
            py::handle partial_out_obj, py::handle partial_lse_obj, double sm_scale, double soft_cap, double k_scale,
            double v_scale, int64_t q_len, int64_t window_left, double rope_scale, double rope_theta, uintptr_t errors,
            uintptr_t stream) {
  const TensorView q = elem_view(q_obj, "q", 3, nullptr);
  const TensorView indptr = index_view(indptr_obj, "indptr", q);
  const TensorView indices = index_view(indices_obj, "indices", q);
  const TensorView kv_len = index_view(kv_len_obj, "kv_len", q);
  const Cache cache = paged_cache<kiln::spec::kv_dtype>(k_obj, v_obj, layout, indptr, indices, q);
  if (q_len < 1 || q_len > 0x7fffffffLL) value_error("q_len must be >= 1, got " + std::to_string(q_len));
  if (q.size(0) % q_len != 0) {
    value_error("q has " + std::to_string(q.size(0)) + " rows, not a multiple of q_len (" + std::to_string(q_len) +
                "): a request's queries are q_len consecutive rows");
  }
  if (window_left < -1 || window_left > 0x7fffffffLL) {
    value_error("window_left must be -1 or in [0, 2^31), got " + std::to_string(window_left));
  }
  if (!(rope_scale > 0) || !std::isfinite(rope_scale) || !(rope_theta > 1) || !std::isfinite(rope_theta)) {
    value_error("rope_scale must be finite and > 0 and rope_theta finite and > 1");
  }
  const int64_t batch = q.size(0) / q_len, num_qo_heads = q.size(1);
  check_heads(num_qo_heads, cache);
  if (indptr.size(0) < batch + 1) {
    value_error("indptr has " + std::to_string(indptr.size(0)) + " entries; q's batch of " + std::to_string(batch) +
                " needs " + std::to_string(batch + 1));
  }
  if (kv_len.size(0) < batch) {
    value_error("kv_len has " + std::to_string(kv_len.size(0)) + " entries; q's batch of " + std::to_string(batch) +
                " needs " + std::to_string(batch));
  }
  const TensorView wr = index_view(work_request, "work_request", q), wb = index_view(work_begin, "work_token_begin", q);
  const TensorView we = index_view(work_end, "work_token_end", q), wo = index_view(work_out, "work_out_index", q);
  const TensorView wm = index_view(work_merge, "work_merge_index", q);
  const TensorView mr = index_view(merge_request, "merge_request", q);
  const TensorView mi = index_view(merge_indptr, "merge_indptr", q);
  const TensorView mc = index_view(merge_counter, "merge_counter", q);
  for (const TensorView* t : {&wb, &we, &wo, &wm}) kb::check_same_shape(*t, wr);
  if (mi.size(0) != mr.size(0) + 1) value_error("merge_indptr must have merge_request.shape[0] + 1 entries");
  // check_heads: a whole multiple
  const int64_t ctas_per_item = kiln::attention::decode_ctas_per_item(num_qo_heads, cache.num_kv_heads, q_len);
  if (mc.size(0) < mr.size(0) * ctas_per_item) {
    value_error("merge_counter has " + std::to_string(mc.size(0)) + " entries; " + std::to_string(mr.size(0)) +
                " merge entries x " + std::to_string(ctas_per_item) + " CTAs per work item need " +
                std::to_string(mr.size(0) * ctas_per_item));
  }
  TensorView out = out_view(out_obj, "out", 3, q);
  kb::check_same_shape(out, q);
  kiln::attention::DecodeParams p{};
  if (!lse_obj.is_none()) {
    const TensorView lse = float_view(lse_obj, "lse", 2, q);
    check_lse(lse, q.size(0), num_qo_heads);
    kb::check_no_internal_overlap(lse);
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_b = lse.stride(0);
  }
  if (mr.size(0) > 0 || !partial_out_obj.is_none()) {
    const TensorView po = float_view(partial_out_obj, "partial_out", 3, q);
    const TensorView pl = float_view(partial_lse_obj, "partial_lse", 2, q);
    const int64_t rows = q_len * num_qo_heads;  // a slot's states
    if (po.size(1) != rows || po.size(2) != kHeadDim || pl.size(0) != po.size(0) || pl.size(1) != rows ||
        po.stride(0) != rows * kHeadDim || po.stride(1) != kHeadDim || pl.stride(0) != rows) {
      value_error(
          "partial_out/partial_lse must be contiguous [slots, q_len * num_qo_heads, head_dim] / [slots, "
          "q_len * num_qo_heads]");
    }
    if (reinterpret_cast<uintptr_t>(po.data) % 16 != 0) {  // the in-launch merge reads it in float4s
      value_error("partial_out (the float workspace buffer's start) must be 16-byte aligned");
    }
    p.partial_out = static_cast<float*>(po.data);
    p.partial_lse = static_cast<float*>(pl.data);
  }
  check_scales<kiln::spec::soft_cap>(sm_scale, soft_cap);
  check_kv_scales<kiln::spec::kv_dtype>(k_scale, v_scale, false);
  p.q = q.data;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.kv = cache.kv;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = cache.num_kv_heads;
  p.kv_len = ptr<int32_t>(kv_len);
  p.q_len = q_len;
  p.window_left = static_cast<int32_t>(window_left);
  p.rope_rcp_scale = static_cast<float>(1.0 / rope_scale);
  p.rope_freq_exp = static_cast<float>(-2.0 * std::log2(rope_theta) / static_cast<double>(kHeadDim));
  p.work_request = ptr<int32_t>(wr);
  p.work_token_begin = ptr<int32_t>(wb);
  p.work_token_end = ptr<int32_t>(we);
  p.work_out_index = ptr<int32_t>(wo);
  p.work_merge_index = ptr<int32_t>(wm);
  p.work_capacity = wr.size(0);
  p.merge_request = ptr<int32_t>(mr);
  p.merge_indptr = ptr<int32_t>(mi);
  p.merge_capacity = mr.size(0);
  p.merge_counter = static_cast<int32_t*>(mc.data);
  p.out = out.data;
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.sm_scale = static_cast<float>(sm_scale);
  p.soft_cap = static_cast<float>(soft_cap);
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::attention::decode(p, context(q, stream, errors));
  }
  raise_if_failed(s);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/attention:decode launcher for one dtype, kv dtype, head_dim, soft-cap flag and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("head_dim") = kHeadDim;
  kb::export_error_texts(m);
  m.def("heads_per_cta", &kiln::attention::heads_per_cta, py::arg("group_size"),
        "query heads per CTA for a GQA group of this size at one query a request");
  m.def("ctas_per_item", &kiln::attention::decode_ctas_per_item, py::arg("num_qo_heads"), py::arg("num_kv_heads"),
        py::arg("q_len"), "CTAs per work item (kv heads x head chunks x query chunks; the schedule counts with it)");
  m.def("decode", &decode, py::kw_only(), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"),
        py::arg("page_indptr"), py::arg("page_indices"), py::arg("kv_len"), py::arg("work_request"),
        py::arg("work_token_begin"), py::arg("work_token_end"), py::arg("work_out_index"), py::arg("work_merge_index"),
        py::arg("merge_request"), py::arg("merge_indptr"), py::arg("merge_counter"), py::arg("out"), py::arg("lse"),
        py::arg("partial_out"), py::arg("partial_lse"), py::arg("sm_scale"), py::arg("soft_cap"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::arg("q_len") = 1, py::arg("window_left") = -1,
        py::arg("rope_scale") = 1.0, py::arg("rope_theta") = 1e4, py::arg("errors") = 0, py::arg("stream") = 0);
}
