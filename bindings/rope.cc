// //ops:rope launcher: validates the tensors, prepares RopeParams and calls the backend's entry point
// (ops/rope/rope.h) on the caller's stream. Compiled by the host compiler for both toolchains; only
// this layer knows Python. Arguments are keyword-only, but the three RoPE entries' (by position or
// keyword: their Python launchers pass them by position, as pybind11 matches each keyword by name on
// every call, about 0.1 us an argument).
//
//   rope_indptr(q_out, k_out, q, k, indptr, offsets, rotary_dim, interleave, rope_scale,
//               rope_theta, smooth_a, smooth_b, errors=0, stream=0)
//   rope_pos_ids(q_out, k_out, q, k, pos_ids, rotary_dim, ..., errors=0, stream=0)
//   rope_cos_sin_cache(q_out, k_out, q, k, positions, cos_sin_cache, interleave, errors=0, stream=0)
//   rope_quantize(*, q_rope_out, k_rope_out, q_nope_out, k_nope_out, q_rope, k_rope, q_nope, k_nope,
//                 cos_sin_cache, pos_ids, quant_scale_q, quant_scale_kv, interleave, e5m2, pdl=False,
//                 errors=0, stream=0)
//
// q [nnz, q_heads, head_dim], k [nnz, k_heads, head_dim] of the module's dtype, contiguous in the
// last dimension (token and head strides free: views of a fused qkv tensor work). q_out/k_out: q/k
// themselves (in place) or separate tensors of their shapes. indptr [batch + 1], offsets [batch],
// pos_ids / positions [nnz]: int32 or int64 each; cos_sin_cache [max_pos, rotary_dim] float32.
// rope_quantize: q_rope [nnz, q_heads, rope_dim], q_nope [nnz, q_heads, nope_dim], k_rope / k_nope
// [nnz, k_heads, *] or (MLA) [nnz, *]; the outputs uint8 views of fp8 tensors of the inputs' shapes
// (e5m2: float8_e5m2, else float8_e4m3fn), disjoint from every input and from each other.
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

// Two views that never share an element though their byte ranges interleave: q and k as head bands
// of one fused [nnz, heads, head_dim] tensor, or the rotary and non-rotary column bands of one
// [nnz, heads, rope_dim + nope_dim] output. Found by a period P, the stride of some dimension d
// of both: every stride of the dimensions up to d (of either view) is a multiple of P, and each
// view's dimensions past d span a footprint [0, ext) with ext <= P; then every element of a lies
// at a lattice point + [0, ext_a), b at the same lattice shifted by r = (b - a) mod P, and they
// are disjoint when [r, r + ext_b) fits in [ext_a, P).
bool disjoint_bands(const TensorView& a, const TensorView& b) {
  if (a.ndim != b.ndim || a.ndim < 2 || a.dtype.bits != b.dtype.bits) return false;
  const int64_t elem = (a.dtype.bits + 7) / 8;
  const int64_t diff = (reinterpret_cast<intptr_t>(b.data) - reinterpret_cast<intptr_t>(a.data));
  if (diff % elem != 0) return false;
  auto footprint = [](const TensorView& t, int after) {
    int64_t ext = 1;
    for (int i = after + 1; i < t.ndim; ++i) {
      if (t.shape[i] > 1 && t.strides[i] < 0) return int64_t(-1);
      if (t.shape[i] > 1) ext += t.strides[i] * (t.shape[i] - 1);
    }
    return ext;
  };
  for (int d = a.ndim - 2; d >= 0; --d) {
    const int64_t period = a.stride(d);
    if (period <= 0 || b.stride(d) != period) continue;
    bool lattice = true;
    for (int i = 0; i <= d && lattice; ++i) {
      lattice = (a.shape[i] <= 1 || a.strides[i] % period == 0) && (b.shape[i] <= 1 || b.strides[i] % period == 0);
    }
    const int64_t ext_a = footprint(a, d), ext_b = footprint(b, d);
    if (!lattice || ext_a < 0 || ext_b < 0 || ext_a > period || ext_b > period) continue;
    const int64_t r = ((diff / elem) % period + period) % period;
    if (r >= ext_a && r + ext_b <= period) return true;
  }
  return false;
}

void check_apart(const TensorView& a, const TensorView& b) {
  if (a.numel() > 0 && b.numel() > 0 && !disjoint_bands(a, b) && kb::views_overlap(a, b)) {
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

TensorView checked_index(py::handle obj, const char* name, const TensorView& q, int64_t len) {
  TensorView t = view_of(obj, name);
  kb::check_same_device(t, q);
  if (!(t.dtype == kInt32 || t.dtype == kInt64)) {
    kb::type_error(t.name + ".dtype must be int32 or int64, got " + kb::dtype_str(t.dtype));
  }
  kb::check_ndim(t, 1, 1);
  if (len >= 0) kb::check_dim(t, 0, len, q.name + ".shape[0] (nnz)");
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
  p.at.rope_theta = 1.0f;
  p.at.rope_rcp_scale = 1.0f;
  return p;
}

void set_frequencies(kiln::rope::Positions& p, double rope_scale, double rope_theta, double smooth_a, double smooth_b) {
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
  const TensorView indptr = checked_index(indptr_obj, "indptr", in.q, -1);
  if (indptr.size(0) < 1) value_error("indptr must have batch + 1 >= 1 elements, got shape " + indptr.shape_str());
  const TensorView offsets = checked_index(offsets_obj, "offsets", in.q, -1);
  kb::check_dim(offsets, 0, indptr.size(0) - 1, "indptr.shape[0] - 1 (batch)");
  RopeParams p = params(in, rotary_dim, interleave);
  set_frequencies(p.at, rope_scale, rope_theta, smooth_a, smooth_b);
  p.at.mode = kiln::rope::PosMode::kIndptr;
  p.at.indptr = indptr.data;
  p.at.indptr64 = indptr.dtype == kInt64;
  p.at.offsets = offsets.data;
  p.at.offsets64 = offsets.dtype == kInt64;
  p.at.batch = offsets.size(0);
  run(p, in.q, errors, stream);
}

void rope_pos_ids(py::handle q_out, py::handle k_out, py::handle q_obj, py::handle k_obj, py::handle pos_obj,
                  int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta, double smooth_a,
                  double smooth_b, uintptr_t errors, uintptr_t stream) {
  const Inputs in = checked_inputs(q_out, k_out, q_obj, k_obj);
  check_rotary_dim(rotary_dim, in.q.size(2));
  const TensorView pos = checked_index(pos_obj, "pos_ids", in.q, in.q.size(0));
  RopeParams p = params(in, rotary_dim, interleave);
  set_frequencies(p.at, rope_scale, rope_theta, smooth_a, smooth_b);
  p.at.mode = kiln::rope::PosMode::kPosIds;
  p.at.pos = pos.data;
  p.at.pos64 = pos.dtype == kInt64;
  run(p, in.q, errors, stream);
}

TensorView checked_cache(py::handle cache_obj, const TensorView& ref) {
  TensorView cache = view_of(cache_obj, "cos_sin_cache");
  kb::check_same_device(cache, ref);
  kb::check_dtype(cache, kFloat32, "cos and sin are float32");
  kb::check_ndim(cache, 2, 2);
  kb::check_last_contiguous(cache);
  kb::check_element_aligned(cache, sizeof(float));
  return cache;
}

void set_cache(kiln::rope::Positions& at, const TensorView& pos, const TensorView& cache) {
  at.mode = kiln::rope::PosMode::kCosSin;
  at.pos = pos.data;
  at.pos64 = pos.dtype == kInt64;
  at.cos_sin = static_cast<const float*>(cache.data);
  at.max_pos = cache.size(0);
  at.cos_sin_stride = cache.stride(0);
}

void rope_cos_sin_cache(py::handle q_out, py::handle k_out, py::handle q_obj, py::handle k_obj, py::handle pos_obj,
                        py::handle cache_obj, bool interleave, uintptr_t errors, uintptr_t stream) {
  const Inputs in = checked_inputs(q_out, k_out, q_obj, k_obj);
  const TensorView pos = checked_index(pos_obj, "positions", in.q, in.q.size(0));
  const TensorView cache = checked_cache(cache_obj, in.q);
  const int64_t rotary_dim = cache.size(1);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > in.q.size(2)) {
    value_error("cos_sin_cache.shape[1] (rotary_dim) must be even and in [2, head_size = " +
                std::to_string(in.q.size(2)) + "], got " + std::to_string(rotary_dim));
  }
  check_rotary_dim(rotary_dim, in.q.size(2));
  RopeParams p = params(in, rotary_dim, interleave);
  set_cache(p.at, pos, cache);
  run(p, in.q, errors, stream);
}

// ---- rope_quantize -------------------------------------------------------------------------------

constexpr kiln::dl::DataType kUInt8{kiln::dl::kUInt, 8, 1};

// One input of rope_quantize: the module's dtype, q's device, `ndim` dimensions (3, or 2 for an
// MLA key), contiguous last dimension, nnz rows.
TensorView checked_part(py::handle obj, const char* name, int ndim, const TensorView* ref) {
  TensorView t = view_of(obj, name);
  kb::check_backend_device(t);
  if (ref != nullptr) kb::check_same_device(t, *ref);
  kb::check_dtype(t, kDType, std::string("this module is ") + kiln::spec::kUri);
  kb::check_ndim(t, ndim, ndim);
  kb::check_last_contiguous(t);
  kb::check_element_aligned(t, sizeof(Elem));
  if (ref != nullptr) kb::check_dim(t, 0, ref->size(0), "q_rope.shape[0] (nnz)");
  return t;
}

void rope_quantize(py::handle q_rope_out, py::handle k_rope_out, py::handle q_nope_out, py::handle k_nope_out,
                   py::handle q_rope_obj, py::handle k_rope_obj, py::handle q_nope_obj, py::handle k_nope_obj,
                   py::handle cache_obj, py::handle pos_obj, double quant_scale_q, double quant_scale_kv,
                   bool interleave, bool e5m2, bool pdl, uintptr_t errors, uintptr_t stream) {
  const TensorView q_rope = checked_part(q_rope_obj, "q_rope", 3, nullptr);
  const TensorView k_rope0 = view_of(k_rope_obj, "k_rope");
  const int kdim = k_rope0.ndim == 2 ? 2 : 3;  // 2: MLA's single latent key head
  const TensorView k_rope = checked_part(k_rope_obj, "k_rope", kdim, &q_rope);
  const TensorView q_nope = checked_part(q_nope_obj, "q_nope", 3, &q_rope);
  const TensorView k_nope = checked_part(k_nope_obj, "k_nope", kdim, &q_rope);
  const int64_t rope_dim = q_rope.size(2), nope_dim = q_nope.size(2);
  kb::check_dim(q_nope, 1, q_rope.size(1), "q_rope.shape[1] (num_qo_heads)");
  kb::check_dim(k_rope, -1, rope_dim, "q_rope.shape[-1] (rope_dim)");
  kb::check_dim(k_nope, -1, nope_dim, "q_nope.shape[-1] (no_rope_dim)");
  if (kdim == 3) kb::check_dim(k_nope, 1, k_rope.size(1), "k_rope.shape[1] (num_kv_heads)");
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > kiln::rope::kMaxRotaryDim) {
    value_error("q_rope.shape[-1] (rope_dim) must be even and in [2, " + std::to_string(kiln::rope::kMaxRotaryDim) +
                "], got " + std::to_string(rope_dim));
  }
  const TensorView pos = checked_index(pos_obj, "pos_ids", q_rope, q_rope.size(0));
  const TensorView cache = checked_cache(cache_obj, q_rope);
  kb::check_dim(cache, 1, rope_dim, "q_rope.shape[-1] (rope_dim)");
  if (!std::isfinite(quant_scale_q) || !std::isfinite(quant_scale_kv)) {
    value_error("quant_scale_q and quant_scale_kv must be finite, got " + std::to_string(quant_scale_q) + " and " +
                std::to_string(quant_scale_kv));
  }
  const TensorView* ins[4] = {&q_rope, &k_rope, &q_nope, &k_nope};
  TensorView outs[4] = {view_of(q_rope_out, "q_rope_out"), view_of(k_rope_out, "k_rope_out"),
                        view_of(q_nope_out, "q_nope_out"), view_of(k_nope_out, "k_nope_out")};
  for (int i = 0; i < 4; ++i) {
    TensorView& o = outs[i];
    kb::check_same_device(o, q_rope);
    kb::check_dtype(o, kUInt8, "an fp8 output's bytes");
    kb::check_same_shape(o, *ins[i]);
    kb::check_last_contiguous(o);
    kb::check_no_internal_overlap(o);
    for (int j = 0; j < 4; ++j) check_apart(o, *ins[j]);
    for (int j = 0; j < i; ++j) check_apart(o, outs[j]);
  }
  kiln::rope::RopeQuantParams p{};
  for (int i = 0; i < 4; ++i) {
    // An empty part (nope_dim 0) is never read or written: no pointer, no stride to align.
    const TensorView& t = *ins[i];
    const bool used = t.numel() > 0;
    p.in[i] = used ? t.data : nullptr;
    p.out[i] = used ? outs[i].data : nullptr;
    p.stride_n[i] = used ? t.stride(0) : 0;
    p.stride_h[i] = used && t.ndim == 3 ? t.stride(1) : 0;  // MLA's 2-D key: one head
    p.stride_n[4 + i] = used ? outs[i].stride(0) : 0;
    p.stride_h[4 + i] = used && outs[i].ndim == 3 ? outs[i].stride(1) : 0;
  }
  p.nnz = q_rope.size(0);
  p.q_heads = q_rope.size(1);
  p.k_heads = kdim == 3 ? k_rope.size(1) : 1;
  p.rope_dim = rope_dim;
  p.nope_dim = nope_dim;
  p.interleave = interleave;
  p.e5m2 = e5m2;
  p.scale_q = static_cast<float>(quant_scale_q);
  p.scale_kv = static_cast<float>(quant_scale_kv);
  set_cache(p.at, pos, cache);
  const kiln::LaunchContext ctx = kb::launch_context(q_rope, stream, errors, pdl);
  p.errors = ctx.errors;
  kiln::Status s;
  {
    py::gil_scoped_release no_gil;
    s = kiln::rope::rope_quantize(p, ctx);
  }
  kb::raise_if_failed(s, kiln::spec::kUri);
}

}  // namespace

PYBIND11_MODULE(KILN_MODULE_NAME, m) {
  m.doc() = "kiln //ops:rope launcher for one dtype and backend";
  m.attr("uri") = kiln::spec::kUri;
  m.attr("dtype") = kiln::dtype_name<Elem>();
  m.attr("max_rotary_dim") = kiln::rope::kMaxRotaryDim;
  kb::export_error_texts(m);
  m.def("rope_indptr", &rope_indptr, py::arg("q_out"), py::arg("k_out"), py::arg("q"), py::arg("k"), py::arg("indptr"),
        py::arg("offsets"), py::arg("rotary_dim"), py::arg("interleave"), py::arg("rope_scale"), py::arg("rope_theta"),
        py::arg("smooth_a"), py::arg("smooth_b"), py::arg("errors") = 0, py::arg("stream") = 0,
        "RoPE of q and k, positions offsets[b] + t - indptr[b]");
  m.def("rope_pos_ids", &rope_pos_ids, py::arg("q_out"), py::arg("k_out"), py::arg("q"), py::arg("k"),
        py::arg("pos_ids"), py::arg("rotary_dim"), py::arg("interleave"), py::arg("rope_scale"), py::arg("rope_theta"),
        py::arg("smooth_a"), py::arg("smooth_b"), py::arg("errors") = 0, py::arg("stream") = 0,
        "RoPE of q and k at pos_ids");
  m.def("rope_cos_sin_cache", &rope_cos_sin_cache, py::arg("q_out"), py::arg("k_out"), py::arg("q"), py::arg("k"),
        py::arg("positions"), py::arg("cos_sin_cache"), py::arg("interleave"), py::arg("errors") = 0,
        py::arg("stream") = 0, "RoPE of q and k with cos/sin read from cos_sin_cache rows");
  m.def("rope_quantize", &rope_quantize, py::kw_only(), py::arg("q_rope_out"), py::arg("k_rope_out"),
        py::arg("q_nope_out"), py::arg("k_nope_out"), py::arg("q_rope"), py::arg("k_rope"), py::arg("q_nope"),
        py::arg("k_nope"), py::arg("cos_sin_cache"), py::arg("pos_ids"), py::arg("quant_scale_q"),
        py::arg("quant_scale_kv"), py::arg("interleave"), py::arg("e5m2"), py::arg("pdl") = false,
        py::arg("errors") = 0, py::arg("stream") = 0,
        "RoPE of the rotary parts (cos_sin_cache rows), both parts scaled and rounded to fp8");
}
