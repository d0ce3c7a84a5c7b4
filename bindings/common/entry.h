// What the generated bindings (kiln/codegen/binding.py, from a BUILD file's entries) call beside
// tensor_view.h: the shape relations an entry declares, and the row views the params take.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "bindings/common/tensor_view.h"

namespace kiln::bindings {

inline void check_ndim_between(const TensorView& t, int lo, int hi) {
  if (hi - lo <= 1) {
    check_ndim(t, lo, hi);
  } else if (t.ndim < lo || t.ndim > hi) {
    const std::string want =
        hi >= kMaxDims ? "at least " + std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
    value_error(t.name + " must have " + want + " dimension" + (lo == 1 && hi >= kMaxDims ? "" : "s") + ", got " +
                (t.ndim == 0 ? std::string("a scalar") : "shape " + t.shape_str()));
  }
}

inline void check_ndim_at_least(const TensorView& t, int lo) {
  check_ndim_between(t, lo, kMaxDims);
}

// t.shape[dim] is a multiple of `factor` (the declared dimension, "2*d").
inline void check_multiple(const TensorView& t, int dim, int64_t factor, const char* declared) {
  if (t.size(dim) % factor != 0) {
    value_error(t.name + ".shape[" + std::to_string(dim) + "] must be a multiple of " + std::to_string(factor) + " (" +
                declared + "), got " + std::to_string(t.size(dim)) + " (shape " + t.shape_str() + ")");
  }
}

// t.shape[dim] is at least `lo`: a declared "batch+1" dimension (an indptr), whose batch is >= 0.
inline void check_size_at_least(const TensorView& t, int dim, int64_t lo, const char* declared) {
  if (t.size(dim) >= lo) return;
  if (t.ndim == 1) {
    value_error(t.name + " must have " + declared + " >= " + std::to_string(lo) + " elements, got shape " +
                t.shape_str());
  }
  value_error(t.name + ".shape[" + std::to_string(dim) + "] (" + declared + ") must be >= " + std::to_string(lo) +
              ", got " + std::to_string(t.size(dim)) + " (shape " + t.shape_str() + ")");
}

// t's shape is ref's leading dimensions (all but its last `ref_trailing`) followed by `trailing`;
// `explain` says where each came from.
inline void check_lead_shape(const TensorView& t, const TensorView& ref, int ref_trailing,
                             std::initializer_list<int64_t> trailing, const char* explain) {
  const int lead = ref.ndim - ref_trailing;
  bool ok = t.ndim == lead + static_cast<int>(trailing.size());
  for (int i = 0; ok && i < lead; ++i) ok = t.shape[i] == ref.shape[i];
  int i = lead;
  for (int64_t v : trailing) ok = ok && t.shape[i++] == v;
  if (ok) return;
  std::string want = "[";
  for (int j = 0; j < lead; ++j) want += std::to_string(ref.shape[j]) + ", ";
  for (int64_t v : trailing) want += std::to_string(v) + ", ";
  if (want.size() > 1) want.resize(want.size() - 2);
  value_error(t.name + ".shape must be " + want + "] (" + explain + "), got " + t.shape_str());
}

inline void check_numel(const TensorView& t, int64_t n) {
  if (t.numel() != n) {
    value_error(t.name + " must hold " + std::to_string(n) + " element" + (n == 1 ? "" : "s") + ", got shape " +
                t.shape_str());
  }
}

// a is b itself: the same elements through the same strides (an op computed in place).
inline bool same_view(const TensorView& a, const TensorView& b) {
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
inline bool disjoint_bands(const TensorView& a, const TensorView& b) {
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

// `a` and `b` share no byte, bands of one tensor included (an entry declared with bands=True).
inline void check_apart(const TensorView& a, const TensorView& b) {
  if (views_overlap(a, b) && !disjoint_bands(a, b)) {
    value_error(a.name + " and " + b.name + " overlap in memory; they must be separate tensors");
  }
}

// An output computed in place is named as its input in errors: `in` when `out` is its view.
inline const TensorView& in_place_named(const TensorView& out, const TensorView& in) {
  return same_view(out, in) ? in : out;
}

// The number of rows: the product of every dimension but the last.
inline int64_t leading_count(const TensorView& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// The row view of a 2-D or 3-D tensor: [d0, d1, cols] with strides s0, s1 (elements); a 2-D one is
// [1, rows, cols].
struct Rows3 {
  int64_t d0, d1, cols, s0, s1;
};

inline Rows3 rows3(const TensorView& t) {
  if (t.ndim == 2) return {1, t.size(0), t.size(1), 0, t.stride(0)};
  return {t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1)};
}

// The stride between consecutive rows once the leading dimensions are folded into one; an error
// when they do not fold (a row stride that changes from one leading index to the next).
inline int64_t folded_row_stride(const TensorView& t) {
  int64_t stride = 0, span = -1;  // span: elements one step of the folded index covers so far
  for (int i = t.ndim - 2; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (span < 0) {
      stride = t.strides[i];
      span = t.strides[i] * t.shape[i];
    } else if (t.strides[i] != span) {
      value_error(t.name + "'s leading dimensions must fold into one row stride (shape " + t.shape_str() + ", stride " +
                  std::to_string(t.strides[i]) + " in dimension " + std::to_string(i) + ", expected " +
                  std::to_string(span) + "); call .contiguous() first");
    } else {
      span *= t.shape[i];
    }
  }
  return stride;
}

}  // namespace kiln::bindings
