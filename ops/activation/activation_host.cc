// //ops:activation, host backend: the entry point of activation.h for this module's dtype.
// The same float32 arithmetic as the CUDA kernel, rows one after another on the calling thread.
// Copied into the specialisation's generated directory, next to its spec_config.h.
#include "ops/activation/activation.h"
#include "ops/common/dtypes.h"
#include "spec_config.h"

namespace kiln::activation {

namespace {

template <typename T, Act A>
Status run(const ActParams& p) {
  using C = Convert<T>;
  for (int64_t row = 0; row < p.rows; ++row) {
    const T* x = static_cast<const T*>(p.input) + row * p.in_stride;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    for (int64_t j = 0; j < p.d; ++j) out[j] = C::from_float(apply<A>(C::to_float(x[j])) * C::to_float(x[p.d + j]));
  }
  return Status::Ok();
}

}  // namespace

Status act_and_mul(const ActParams& p, LaunchContext) {
  switch (p.act) {
    case Act::kSilu:
      return run<spec::dtype, Act::kSilu>(p);
    case Act::kGelu:
      return run<spec::dtype, Act::kGelu>(p);
    case Act::kGeluTanh:
      return run<spec::dtype, Act::kGeluTanh>(p);
  }
  return Status::Error(1, "act_and_mul: unknown activation " + std::to_string(static_cast<int>(p.act)));
}

}  // namespace kiln::activation
