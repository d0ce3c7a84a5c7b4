// //ops/attention:cascade launchers: merging attention states (ops/attention/attention.h,
// MergeParams and MergeTwoParams). Every argument is keyword-only.
//
//   merge_states(*, v, s, out, out_lse, errors=0, stream=0)              v [n, states, heads, dim]
//   merge_two(*, v_a, s_a, v_b, s_b, mask, out, out_lse, errors=0, stream=0)  v_a, v_b, out [n, heads, dim]
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/attention/common.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using namespace kiln::bindings::attention;
using kb::TensorView;
using kb::value_error;

void merge_states(py::handle v_obj, py::handle s_obj, py::handle out_obj, py::handle out_lse_obj, uintptr_t errors,
                  uintptr_t stream) {
  const TensorView v = elem_view(v_obj, "v", 4, nullptr);
  const TensorView s = float_view(s_obj, "s", 3, v);
  if (s.size(0) != v.size(0) || s.size(1) != v.size(1) || s.size(2) != v.size(2)) {
    value_error("s.shape must be v.shape[:3] " + v.shape_str() + ", got " + s.shape_str());
  }
  const TensorView out = out_view(out_obj, "out", 3, v);
  const TensorView out_lse = float_view(out_lse_obj, "out_lse", 2, v);
  if (out.size(0) != v.size(0) || out.size(1) != v.size(2)) {
    value_error("out.shape must be [v.shape[0], v.shape[2], head_dim], got " + out.shape_str());
  }
  if (out_lse.size(0) != v.size(0) || out_lse.size(1) != v.size(2)) {
    value_error("out_lse.shape must be [v.shape[0], v.shape[2]], got " + out_lse.shape_str());
  }
  kb::check_no_internal_overlap(out_lse);
  kb::check_disjoint(out_lse, s);
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
    st = kiln::attention::merge_states(p, context(v, stream, errors));
  }
  raise_if_failed(st);
}

void merge_two(py::handle a_obj, py::handle a_lse_obj, py::handle b_obj, py::handle b_lse_obj, py::handle mask_obj,
               py::handle out_obj, py::handle out_lse_obj, uintptr_t errors, uintptr_t stream) {
  const TensorView a = elem_view(a_obj, "v_a", 3, nullptr);
  const TensorView b = elem_view(b_obj, "v_b", 3, &a);
  kb::check_same_shape(b, a);
  const TensorView out = elem_view(out_obj, "out", 3, &a);
  kb::check_same_shape(out, a);
  kb::check_no_internal_overlap(out);
  if (out.data != a.data) kb::check_disjoint(out, a);  // in place: out is v_a itself
  kb::check_disjoint(out, b);
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
    const TensorView mask = kb::view_of(mask_obj, "mask");
    kb::check_same_device(mask, a);
    kb::check_dtype(mask, kBool, "mask is boolean");
    kb::check_ndim(mask, 1, 1);
    kb::check_dim(mask, 0, a.size(0), "the number of rows");
    if (mask.stride(0) < 0) kb::value_error("mask must have a stride >= 0, got " + std::to_string(mask.stride(0)));
    p.mask = static_cast<const uint8_t*>(mask.data);  // any stride: a slice, or expanded (0)
    p.mask_stride = mask.stride(0);
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
  kb::check_no_internal_overlap(lo);
  if (lo.data != la.data) kb::check_disjoint(lo, la);
  kb::check_disjoint(lo, lb);
  kiln::Status st;
  {
    py::gil_scoped_release no_gil;
    st = kiln::attention::merge_two(p, context(a, stream, errors));
  }
  raise_if_failed(st);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops/attention:cascade launchers (attention-state merges) for one dtype, head_dim and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("head_dim") = kHeadDim;
  kb::export_error_texts(m);
  m.def("merge_states", &merge_states, py::kw_only(), py::arg("v"), py::arg("s"), py::arg("out"), py::arg("out_lse"),
        py::arg("errors") = 0, py::arg("stream") = 0);
  m.def("merge_two", &merge_two, py::kw_only(), py::arg("v_a"), py::arg("s_a"), py::arg("v_b"), py::arg("s_b"),
        py::arg("mask"), py::arg("out"), py::arg("out_lse"), py::arg("errors") = 0, py::arg("stream") = 0);
}
