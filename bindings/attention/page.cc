// //ops/attention:page launcher: appending tokens to a paged KV cache (ops/attention/attention.h,
// AppendParams). Every argument is keyword-only.
//
//   append_paged_kv(*, append_key, append_value, batch_indices, positions, k_cache, v_cache,
//                   kv_layout, kv_indptr, kv_indices, kv_last_page_len, k_scale=1, v_scale=1,
//                   errors=0, stream=0)
//   the cache: of the module's kv_dtype; an fp8 one receives e4m3(key / k_scale), e4m3(value / v_scale)
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/attention/common.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using namespace kiln::bindings::attention;
using kb::TensorView;

void append_paged_kv(py::handle key_obj, py::handle value_obj, py::handle batch_obj, py::handle pos_obj,
                     py::handle k_obj, py::handle v_obj, const std::string& layout, py::handle indptr_obj,
                     py::handle indices_obj, py::handle last_obj, double k_scale, double v_scale, uintptr_t errors,
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
  const Cache cache = paged_cache<kiln::spec::kv_dtype>(k_obj, v_obj, layout, indptr, indices, key);
  check_kv_scales<kiln::spec::kv_dtype>(k_scale, v_scale, true);
  kb::check_dim(key, 1, cache.num_kv_heads, "the cache's kv heads");
  const TensorView last = index_view(last_obj, "kv_last_page_len", key);
  kb::check_dim(last, 0, indptr.size(0) - 1, "kv_indptr.shape[0] - 1 (the batch size)");
  const TensorView k_cache = kb::view_of(k_obj, "k_cache"), v_cache = kb::view_of(v_obj, "v_cache");
  for (const TensorView* c : {&k_cache, &v_cache}) {
    kb::check_no_internal_overlap(*c);
    kb::check_disjoint(*c, key);
    kb::check_disjoint(*c, value);
  }
  kb::check_disjoint(k_cache, v_cache);
  kiln::attention::AppendParams p{};
  p.key = key.data;
  p.value = value.data;
  p.key_stride_n = key.stride(0);
  p.key_stride_h = key.stride(1);
  p.value_stride_n = value.stride(0);
  p.value_stride_h = value.stride(1);
  p.batch_indices = ptr<int32_t>(batch);
  p.positions = ptr<int32_t>(pos);
  p.last_page_len = ptr<int32_t>(last);
  p.nnz = key.size(0);
  p.num_kv_heads = cache.num_kv_heads;
  p.batch = last.size(0);
  p.kv = cache.kv;
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::append_paged_kv(p, context(key, stream, errors));
  }
  raise_if_failed(st);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() =
      "kiln //ops/attention:page launcher (append to a paged KV cache) for one dtype, kv dtype, head_dim and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("head_dim") = kHeadDim;
  kb::export_error_texts(m);
  m.def("append_paged_kv", &append_paged_kv, py::kw_only(), py::arg("append_key"), py::arg("append_value"),
        py::arg("batch_indices"), py::arg("positions"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_layout"),
        py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"), py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0, py::arg("errors") = 0, py::arg("stream") = 0);
}
