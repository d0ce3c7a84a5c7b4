# //ops:activation -- gated activations of a GLU MLP: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.
# One module per dtype and toolchain (activation_dtype_bf16_cuda, ...); the activation is a run-time
# argument, so one module holds all three (12 small kernels: three activations x four vector widths).
# The launcher is generated from the entry below: input [..., 2d] and out [..., d] of the module's
# dtype, each contiguous in its last dimension with leading dimensions that fold into one row
# stride (any row stride).
op_library(
    name="activation",
    doc="gated activations act(x[..., :d]) * x[..., d:]: silu, gelu (erf), gelu (tanh)",
    srcs=["activation_cuda.cu"],
    host_srcs=["activation_host.cc"],
    headers=["ops/activation/activation.h"],
    entries=[entry(
        "act_and_mul",
        doc="out = act(input[..., :d]) * input[..., d:]",
        args=[tensor("out", shape=["*rows", "d"], access="w"),
              tensor("input", shape=["*rows", "2*d"]),
              choice("act", {"silu": "kiln::activation::Act::kSilu",
                             "gelu": "kiln::activation::Act::kGelu",
                             "gelu_tanh": "kiln::activation::Act::kGeluTanh"})],
        pdl=True,
        dispatch={"dtype": "input.dtype"},
        api="kiln.{act}_and_mul",
        params=params("kiln::activation::ActParams", out="out.data", input="input.data",
                      rows="kb::leading_count(out)", d="out.size(-1)",
                      in_stride="kb::folded_row_stride(input)", out_stride="kb::folded_row_stride(out)",
                      act="act"),
        call="kiln::activation::act_and_mul")],
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",
)
