// //ops/attention:prefill, CUDA backend: prefill() of attention.h for this module's dtype,
// head_dim, soft-cap flag and variant (custom mask, position encoding). Copied into the
// specialisation's generated directory.
#include <string>
#include <string_view>

#include "ops/attention/prefill.cuh"
#include "ops/attention/prefill_sm90.cuh"
#include "spec_config.h"

namespace kiln::attention {

using T = spec::dtype;
constexpr int kHeadDim = static_cast<int>(spec::head_dim);

constexpr PrefillPosEncoding kPos = prefill_pos_encoding(spec::pos_encoding);
static_assert(kPos != PrefillPosEncoding::kNone || std::string_view(spec::pos_encoding) == "none",
              "an unknown pos_encoding value");
// The sm90a kernel has no variants (nor has FlashInfer's fa3 a custom mask): a variant module
// builds the FA2 kernel alone.
constexpr bool kPlain = !spec::custom_mask && kPos == PrefillPosEncoding::kNone;

// The sm90a kernel where the call asks for it and it can serve it (a 9.0a build on a 9.0 device,
// TMA-compatible strides, a page size it tiles, tensor maps the driver accepts); the FA2 kernel
// otherwise (documented fallback). kPrefillKernelFA3Strict (KILN_PREFILL_FA3_STRICT=1, for tests)
// turns a fallback into an error that says why.
template <bool kWithSm90>
Status prefill_call(const PrefillParams& p, LaunchContext ctx) {
  if ((p.kernel == kPrefillKernelFA3 || p.kernel == kPrefillKernelFA3Strict) && p.work_capacity > 0) {
    std::string why = "fa3 has no custom mask, RoPE or ALiBi (this module's variant; use backend fa2)";
    if constexpr (kWithSm90) {
      DeviceGuard guard(ctx.device);
      int device = 0;
      cudaGetDevice(&device);
      if (prefill_sm90_supported<T, kHeadDim, spec::soft_cap>(p, device, &why)) {
        Status st = launch_prefill_sm90<T, kHeadDim, spec::soft_cap>(p, ctx);
        if (st.code != kSm90Declined) return st;
        why = st.message;
      }
    }
    if (p.kernel == kPrefillKernelFA3Strict) {
      return Status::Error(1, "prefill: backend fa3 cannot serve this call (KILN_PREFILL_FA3_STRICT=1): " + why);
    }
  }
  return launch_prefill<T, kHeadDim, spec::soft_cap, spec::custom_mask, kPos>(p, ctx);
}

Status prefill(const PrefillParams& p, LaunchContext ctx) {
  return prefill_call<kPlain>(p, ctx);
}

}  // namespace kiln::attention
