// //ops:rope launcher: validates the tensors, prepares RopeParams and calls the backend's entry point
// (ops/rope/rope.h) on the caller's stream. Compiled by the host compiler for both toolchains; only
// this layer knows Python. Arguments are keyword-only.
//
//   rope_indptr(*, q_out, k_out, q, k, indptr, offsets, rotary_dim, interleave, rope_scale,
//               rope_theta, smooth_a, smooth_b, errors=0, stream=0)
//   rope_pos_ids(*, q_out, k_out, q, k, pos_ids, rotary_dim, ..., errors=0, stream=0)
//   rope_cos_sin_cache(*, q_out, k_out, q, k, positions, cos_sin_cache, interleave, errors=0, stream=0)
//
// q [nnz, q_heads, head_dim], k [nnz, k_heads, head_dim] of the module's dtype, contiguous in the
// last dimension (token and head strides free: views of a fused qkv tensor work). q_out/k_out: q/k
// themselves (in place) or separate tensors of their shapes. indptr [batch + 1] and offsets [batch]
// int32; pos_ids / positions [nnz] int32 or int64; cos_sin_cache [max_pos, rotary_dim] float32.
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/common/errors.h"
#include "bindings/common/tensor_view.h"
#include "ops/common/dtypes.h"
#include "ops/rope/rope.h"
#include "spec_config.h"

namespace {

namespace py = pybind11;
namespace kb = kiln::bindings;
using kb::TensorView;
using kb::value_error;
using kb::view_of;
using kiln::rope::RopeParams;
using Elem = kiln::spec::dtype;
constexpr auto kDType = kb::dl_dtype<Elem>();
constexpr kiln::dl::DataType kInt32{kiln::dl::kInt, 32, 1};
constexpr kiln::dl::DataType kInt64{kiln::dl::kInt, 64, 1};
constexpr kiln::dl::DataType kFloat32{kiln::dl::kFloat, 32, 1};

bool same_view(const TensorView& a, const TensorView& b) {
  bool same = a.data == b.data && a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i] && a.strides[i] == b.strides[i];
  return same;
}

// q and k as views of one fused [nnz, heads, head_dim] tensor: the same token stride, each token's
// heads a band of it, the two bands apart. The byte-range test of views_overlap would call those
// overlapping (the bands interleave token by token), so they are recognised first.
bool disjoint_head_bands(const TensorView& a, const TensorView& b) {
  if (a.size(0) < 2 || a.stride(0) != b.stride(0) || a.stride(1) != b.stride(1)) return false;
  const int64_t s0 = a.stride(0), s1 = a.stride(1), d = a.size(2);
  if (s0 <= 0 || s1 < d) return false;
  const int64_t band_a = a.size(1) * s1, band_b = b.size(1) * s1;  // each band rounded up to whole heads
  if (band_a > s0 || band_b > s0) return false;
  const int64_t elem = sizeof(Elem);
  const int64_t diff = (reinterpret_cast<intptr_t>(b.data) - reinterpret_cast<intptr_t>(a.data));
  if (diff % elem != 0) return false;
  const int64_t r = ((diff / elem) % s0 + s0) % s0;  // where b's band starts within a's token period
  return r >= band_a && r + band_b <= s0;
}

void check_apart(const TensorView& a, const TensorView& b) {
  if (!disjoint_head_bands(a, b) && kb::views_overlap(a, b)) {
    value_error(a.name + " and " + b.name + " overlap in memory; they must be separate tensors");
  }
}

TensorView checked_heads(py::handle obj, const char* name) {
  TensorView t = view_of(obj, name);
  kb::check_backend_device(t);
  kb::check_dtype(t, kDType, std::string("this module is ") + kiln::spec::kUri);
  kb::check_ndim(t, 3, 3);
  kb::check_last_contiguous(t);
  kb::check_element_aligned(t, sizeof(Elem));
  return t;
}

struct Inputs {
  TensorView q_out, k_out, q, k;
  bool in_place;
};

Inputs checked_inputs(py::handle q_out_obj, py::handle k_out_obj, py::handle q_obj, py::handle k_obj) {
  Inputs in{view_of(q_out_obj, "q_out"), view_of(k_out_obj, "k_out"), checked_heads(q_obj, "q"),
            checked_heads(k_obj, "k"), false};
  const TensorView &q = in.q, &k = in.k;
  kb::check_same_device(k, q);
  kb::check_dim(k, 0, q.size(0), "q.shape[0] (nnz)");
  kb::check_dim(k, 2, q.size(2), "q.shape[2] (head_dim)");
  if (q.size(2) % 2 != 0) value_error("head_dim must be even, got q.shape " + q.shape_str());
  // An empty tensor is the same view as any other empty one of its shape: it does not decide.
  const bool q_same = same_view(in.q_out, q), k_same = same_view(in.k_out, k);
  if (q.numel() > 0 && k.numel() > 0 && q_same != k_same) {
    value_error("q_out and k_out must both be the inputs (in place) or both separate tensors");
  }
  in.in_place = q.numel() > 0 ? q_same : k_same;
  for (TensorView* o : {&in.q_out, &in.k_out}) {
    const TensorView& src = o == &in.q_out ? q : k;
    kb::check_same_device(*o, q);
    kb::check_dtype(*o, kDType, "the dtype of q");
    kb::check_same_shape(*o, src);
    kb::check_last_contiguous(*o);
    kb::check_element_aligned(*o, sizeof(Elem));
    kb::check_no_internal_overlap(*o);
  }
  if (in.in_place) {
    check_apart(q, k);
  } else {
    check_apart(in.q_out, in.k_out);
    check_apart(in.q_out, q);
    check_apart(in.q_out, k);
    check_apart(in.k_out, q);
    check_apart(in.k_out, k);
  }
  return in;
}

void check_rotary_dim(int64_t rotary_dim, int64_t head_dim) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    value_error("rotary_dim must be even and in [2, head_dim = " + std::to_string(head_dim) + "], got " +
                std::to_string(rotary_dim));
  }
  if (rotary_dim > kiln::rope::kMaxRotaryDim) {
    value_error("rotary_dim must be <= " + std::to_string(kiln::rope::kMaxRotaryDim) + ", got " +
                std::to_string(rotary_dim));
  }
}

TensorView checked_index(py::handle obj, const char* name, const TensorView& q, int64_t len, bool allow64) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, q);
  if (!(t.dtype == kInt32 || (allow64 && t.dtype == kInt64))) {
    kb::type_error(t.name + ".dtype must be int32" + (allow64 ? std::string(" or int64") : std::string()) + ", got " +
                   kb::dtype_str(t.dtype));
  }
  kb::check_ndim(t, 1, 1);
  if (len >= 0) kb::check_dim(t, 0, len, "q.shape[0] (nnz)");
  kb::check_last_contiguous(t);
  return t;
}

RopeParams params(const Inputs& in, int64_t rotary_dim, bool interleave) {
  RopeParams p{};
  p.q_out = in.q_out.data;
  p.k_out = in.k_out.data;
  p.q = in.q.data;
  p.k = in.k.data;
  p.nnz = in.q.size(0);
  p.q_heads = in.q.size(1);
  p.k_heads = in.k.size(1);
  p.head_dim = in.q.size(2);
  p.rotary_dim = rotary_dim;
  p.q_stride_n = in.q.stride(0);
  p.q_stride_h = in.q.stride(1);
  p.k_stride_n = in.k.stride(0);
  p.k_stride_h = in.k.stride(1);
  p.qo_stride_n = in.q_out.stride(0);
  p.qo_stride_h = in.q_out.stride(1);
  p.ko_stride_n = in.k_out.stride(0);
  p.ko_stride_h = in.k_out.stride(1);
  p.interleave = interleave;
  p.copy_tail = !in.in_place;
  p.rope_theta = 1.0f;
  p.rope_rcp_scale = 1.0f;
  return p;
}

void set_frequencies(RopeParams& p, double rope_scale, double rope_theta, double smooth_a, double smooth_b) {
  if (!std::isfinite(rope_scale) || rope_scale <= 0) {
    value_error("rope_scale must be finite and > 0, got " + std::to_string(rope_scale));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 0) {
    value_error("rope_theta must be finite and > 0, got " + std::to_string(rope_theta));
  }
  if (!std::isfinite(smooth_a) || !std::isfinite(smooth_b))
    value_error("the Llama 3.1 smoothing factors must be finite");
  p.rope_theta = static_cast<float>(rope_theta);
  p.rope_rcp_scale = static_cast<float>(1.0 / rope_scale);
  p.smooth_a = static_cast<float>(smooth_a);
  p.smooth_b = static_cast<float>(smooth_b);
}

void run(RopeParams& p, const TensorView& q, uintptr_t errors, uintptr_t stream) {
  const kiln::LaunchContext ctx = kb::launch_context(q, stream, errors);
  p.errors = ctx.errors;
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::rope::apply_rope(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

void rope_indptr(py::handle q_out, py::handle k_out, py::handle q_obj, py::handle k_obj, py::handle indptr_obj,
                 py::handle offsets_obj, int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta,
                 double smooth_a, double smooth_b, uintptr_t errors, uintptr_t stream) {
  const Inputs in = checked_inputs(q_out, k_out, q_obj, k_obj);
  check_rotary_dim(rotary_dim, in.q.size(2));
  const TensorView indptr = checked_index(indptr_obj, "indptr", in.q, -1, false);
  if (indptr.size(0) < 1) value_error("indptr must have batch + 1 >= 1 elements, got shape " + indptr.shape_str());
  const TensorView offsets = checked_index(offsets_obj, "offsets", in.q, -1, false);
  kb::check_dim(offsets, 0, indptr.size(0) - 1, "indptr.shape[0] - 1 (batch)");
  RopeParams p = params(in, rotary_dim, interleave);
  set_frequencies(p, rope_scale, rope_theta, smooth_a, smooth_b);
  p.mode = kiln::rope::PosMode::kIndptr;
  p.indptr = static_cast<const int32_t*>(indptr.data);
  p.offsets = static_cast<const int32_t*>(offsets.data);
  p.batch = offsets.size(0);
  run(p, in.q, errors, stream);
}

void rope_pos_ids(py::handle q_out, py::handle k_out, py::handle q_obj, py::handle k_obj, py::handle pos_obj,
                  int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta, double smooth_a,
                  double smooth_b, uintptr_t errors, uintptr_t stream) {
  const Inputs in = checked_inputs(q_out, k_out, q_obj, k_obj);
  check_rotary_dim(rotary_dim, in.q.size(2));
  const TensorView pos = checked_index(pos_obj, "pos_ids", in.q, in.q.size(0), true);
  RopeParams p = params(in, rotary_dim, interleave);
  set_frequencies(p, rope_scale, rope_theta, smooth_a, smooth_b);
  p.mode = kiln::rope::PosMode::kPosIds;
  p.pos = pos.data;
  p.pos64 = pos.dtype == kInt64;
  run(p, in.q, errors, stream);
}

void rope_cos_sin_cache(py::handle q_out, py::handle k_out, py::handle q_obj, py::handle k_obj, py::handle pos_obj,
                        py::handle cache_obj, bool interleave, uintptr_t errors, uintptr_t stream) {
  const Inputs in = checked_inputs(q_out, k_out, q_obj, k_obj);
  const TensorView pos = checked_index(pos_obj, "positions", in.q, in.q.size(0), true);
  const TensorView cache = view_of(cache_obj, "cos_sin_cache");
  kb::check_same_device(cache, in.q);
  kb::check_dtype(cache, kFloat32, "cos and sin are float32");
  kb::check_ndim(cache, 2, 2);
  kb::check_last_contiguous(cache);
  kb::check_element_aligned(cache, sizeof(float));
  const int64_t rotary_dim = cache.size(1);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > in.q.size(2)) {
    value_error("cos_sin_cache.shape[1] (rotary_dim) must be even and in [2, head_size = " +
                std::to_string(in.q.size(2)) + "], got " + std::to_string(rotary_dim));
  }
  check_rotary_dim(rotary_dim, in.q.size(2));
  RopeParams p = params(in, rotary_dim, interleave);
  p.mode = kiln::rope::PosMode::kCosSin;
  p.pos = pos.data;
  p.pos64 = pos.dtype == kInt64;
  p.cos_sin = static_cast<const float*>(cache.data);
  p.max_pos = cache.size(0);
  p.cos_sin_stride = cache.stride(0);
  run(p, in.q, errors, stream);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:rope launcher for one dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.attr("max_rotary_dim") = kiln::rope::kMaxRotaryDim;
  kb::export_error_texts(m);
  m.def("rope_indptr", &rope_indptr, py::kw_only(), py::arg("q_out"), py::arg("k_out"), py::arg("q"), py::arg("k"),
        py::arg("indptr"), py::arg("offsets"), py::arg("rotary_dim"), py::arg("interleave"), py::arg("rope_scale"),
        py::arg("rope_theta"), py::arg("smooth_a"), py::arg("smooth_b"), py::arg("errors") = 0, py::arg("stream") = 0,
        "RoPE of q and k, positions offsets[b] + t - indptr[b]");
  m.def("rope_pos_ids", &rope_pos_ids, py::kw_only(), py::arg("q_out"), py::arg("k_out"), py::arg("q"), py::arg("k"),
        py::arg("pos_ids"), py::arg("rotary_dim"), py::arg("interleave"), py::arg("rope_scale"), py::arg("rope_theta"),
        py::arg("smooth_a"), py::arg("smooth_b"), py::arg("errors") = 0, py::arg("stream") = 0,
        "RoPE of q and k at pos_ids");
  m.def("rope_cos_sin_cache", &rope_cos_sin_cache, py::kw_only(), py::arg("q_out"), py::arg("k_out"), py::arg("q"),
        py::arg("k"), py::arg("positions"), py::arg("cos_sin_cache"), py::arg("interleave"), py::arg("errors") = 0,
        py::arg("stream") = 0, "RoPE of q and k with cos/sin read from cos_sin_cache rows");
}
