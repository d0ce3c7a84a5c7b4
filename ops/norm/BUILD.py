# //ops:norm -- RMSNorm, fused residual-add RMSNorm, their Gemma (1 + w) variants, LayerNorm, and
# the fp8-quantised rmsnorm_quant / fused_add_rmsnorm_quant / layernorm_quant.
# One module per dtype and toolchain: norm_dtype_bf16_cuda, norm_dtype_bf16_host, ... The quantised
# kernels are a unit of their own (norm_quant_cuda.cu), compiled in parallel with the others.
#
# The launcher is generated from the entries below. input/out/residual: [rows, hidden] or
# [batch, seq, hidden], last dimension contiguous, leading strides free; weight: [hidden]; all of
# the module's dtype. LayerNorm's gemma and beta: [hidden], float32 whatever the module's dtype.
# The *_quant ops: out of input's shape, float8_e4m3fn or float8_e5m2; scale a one-element float32
# tensor (read by the kernel), or None and scale_value (finite and nonzero) is the scale.

ROWS = ["*rows", "hidden"]  # 2-D or 3-D (ndim=(2, 3) on the anchor)
EPS = require("std::isfinite(eps) && eps >= 0", "eps must be finite and >= 0, got {eps}")
SCALE_VALUE = require("!scale_obj.is_none() || (std::isfinite(scale_value) && scale_value != 0.0)",
                      "scale must be finite and nonzero, got {scale_value}")
FP8 = {"float8_e4m3fn": "kiln::norm::Fp8Format::kE4M3", "float8_e5m2": "kiln::norm::Fp8Format::kE5M2"}


def input_arg(access="r"):
    return tensor("input", shape=ROWS, ndim=(2, 3), access=access)


def f32_param(name):
    return tensor(name, shape=["hidden"], dtype="float32", why="LayerNorm's parameters are float32")


def fp8_out():
    return tensor("out", shape=ROWS, dtype=FP8, access="w", why="the quantised output")


def scale_args():
    return [tensor("scale", dtype="float32", numel=1, optional=True, layout="any",
                   why="the scale is float32"),
            scalar("scale_value", "float")]


def rows(prefix, t):  # the 2-D / 3-D row view of tensor t, into fields <prefix>stride0/1
    return {f"{prefix}stride0": f"kb::rows3({t}).s0", f"{prefix}stride1": f"kb::rows3({t}).s1"}


SHAPE = {"d0": "kb::rows3(input).d0", "d1": "kb::rows3(input).d1", "cols": "input.size(-1)",
         **rows("in_", "input")}
QUANT = {"quant__format": "out_dtype", "quant__scale": "static_cast<const float*>(scale.data)",
         "quant__scale_value": "scale.data ? 1.0f : static_cast<float>(scale_value)"}


def rms_params(type, residual, **more):
    fields = {"out": "out.data", "input": "input.data", "weight": "weight.data", **SHAPE,
              **rows("out_", "out"), "eps": "static_cast<float>(eps)", **more}
    if residual:
        fields.update({"residual": "residual.data", **rows("res_", "residual")})
    return params(type, **fields)


def ln_params(type, **more):
    return params(type, out="out.data", input="input.data", gamma="static_cast<const float*>(gemma.data)",
                  beta="static_cast<const float*>(beta.data)", **SHAPE, **rows("out_", "out"),
                  eps="static_cast<float>(eps)", **more)


op_library(
    name="norm",
    doc="RMSNorm / fused add + RMSNorm (and Gemma variants), LayerNorm, their fp8-quantised forms; 2-D and 3-D rows",
    srcs=["norm_cuda.cu", "norm_quant_cuda.cu"],
    host_srcs=["norm_host.cc"],
    headers=["ops/norm/norm.h"],
    entries=[
        entry("rmsnorm", doc="out = input * rsqrt(mean(input^2, -1) + eps) * (weight + weight_offset)",
              args=[tensor("out", shape=ROWS, access="w", may_alias="input"), input_arg(),
                    tensor("weight", shape=["hidden"]), scalar("eps", "float"),
                    scalar("weight_offset", "float")],
              pdl=True, dispatch={"dtype": "input.dtype"}, api="kiln.rmsnorm", requires=[EPS],
              params=rms_params("kiln::norm::NormParams", False,
                                weight_offset="static_cast<float>(weight_offset)"),
              call="kiln::norm::rmsnorm"),
        entry("fused_add_rmsnorm", doc="residual += input; input = rmsnorm(residual) (in place)",
              args=[input_arg("rw"), tensor("residual", shape=ROWS, access="rw"),
                    tensor("weight", shape=["hidden"]), scalar("eps", "float"),
                    scalar("weight_offset", "float")],
              pdl=True, dispatch={"dtype": "input.dtype"}, api="kiln.fused_add_rmsnorm", requires=[EPS],
              params=params("kiln::norm::NormParams", out="input.data", input="input.data",
                            weight="weight.data", **SHAPE, **rows("out_", "input"), residual="residual.data",
                            **rows("res_", "residual"), eps="static_cast<float>(eps)",
                            weight_offset="static_cast<float>(weight_offset)"),
              call="kiln::norm::fused_add_rmsnorm"),
        entry("layernorm", doc="out = (input - mean) * rsqrt(var + eps) * gemma + beta",
              args=[tensor("out", shape=ROWS, access="w", may_alias="input"), input_arg(), f32_param("gemma"),
                    f32_param("beta"), scalar("eps", "float")],
              dispatch={"dtype": "input.dtype"}, api="kiln.layernorm", requires=[EPS],
              params=ln_params("kiln::norm::LayerNormParams"), call="kiln::norm::layernorm"),
        entry("rmsnorm_quant", doc="out = fp8(rmsnorm(input) / scale)",
              args=[fp8_out(), input_arg(), tensor("weight", shape=["hidden"]), *scale_args(),
                    scalar("eps", "float")],
              pdl=True, dispatch={"dtype": "input.dtype"}, api="kiln.rmsnorm_quant",
              requires=[SCALE_VALUE, EPS],
              params=rms_params("kiln::norm::QuantNormParams", False, **QUANT),
              call="kiln::norm::rmsnorm_quant"),
        entry("fused_add_rmsnorm_quant", doc="residual += input; out = fp8(rmsnorm(residual) / scale)",
              args=[fp8_out(), input_arg(), tensor("residual", shape=ROWS, access="rw"),
                    tensor("weight", shape=["hidden"]), *scale_args(), scalar("eps", "float")],
              pdl=True, dispatch={"dtype": "input.dtype"}, api="kiln.fused_add_rmsnorm_quant",
              requires=[SCALE_VALUE, EPS],
              params=rms_params("kiln::norm::QuantNormParams", True, **QUANT),
              call="kiln::norm::fused_add_rmsnorm_quant"),
        entry("layernorm_quant", doc="out = fp8(layernorm(input) / scale)",
              args=[fp8_out(), input_arg(), f32_param("gemma"), f32_param("beta"), *scale_args(),
                    scalar("eps", "float")],
              dispatch={"dtype": "input.dtype"}, api="kiln.layernorm_quant", requires=[SCALE_VALUE, EPS],
              params=ln_params("kiln::norm::QuantLayerNormParams", **QUANT),
              call="kiln::norm::layernorm_quant"),
    ],
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release="all",  # every dtype ships in precompiled packages (python -m release build)
)
