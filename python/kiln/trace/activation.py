"""Trace templates of kiln.activation's APIs: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

Axes: `tokens` (var: rows in the batch) x `intermediate` (const: the MLP's intermediate size d; the
input row holds the gate and up projections, 2d). The reference computes in float64 from the
definitions. Tolerances per dtype: the kernel rounds once at the output (half an ulp: 2^-24, 2^-11,
2^-8 relative) after float32 arithmetic; fp32 allows ~1e-5 relative for expf/erfcf/tanhf's few-ulp
errors, the 16-bit types one ulp.
"""

from __future__ import annotations

import math

import torch

from .examples import DECODE_BATCHES, LLM_MODELS, PREFILL_TOKENS
from .template import Example, TraceTemplate, const, entry_tensors, var

TOLERANCE = {"bfloat16": (1.6e-2, 1e-5), "float16": (2e-3, 1e-5), "float32": (1e-5, 1e-6)}
AXES = {
    "tokens": var("rows activated in one call: decode batch size or prefill tokens"),
    "intermediate": const(doc="the MLP's intermediate size d (the input row is 2d)"),
}
# input (tokens, intermediate * 2) and out (tokens, intermediate), from the BUILD file's entry
INPUTS, OUTPUTS = entry_tensors("//ops:activation", "act_and_mul", {"rows": "tokens", "d": "intermediate"})
SMALL = ({"tokens": 1}, {"tokens": 33})
# The MLP intermediate sizes of the models (their config.json files, as in examples.py).
INTERMEDIATE = {"llama-3.1-8b": 14336, "llama-3.1-70b": 28672, "qwen3-32b": 25600}

EXAMPLES = tuple(
    Example(name=f"{m.name}-{phase}", model=m.name, phase=phase,
            consts={"intermediate": INTERMEDIATE[m.name]},
            workloads=tuple({"tokens": t} for t in tokens), source=m.source)
    for m in LLM_MODELS for phase, tokens in (("decode", DECODE_BATCHES), ("prefill", PREFILL_TOKENS)))


def silu_float64(x):
    return x / (1.0 + torch.exp(-x))


def gelu_float64(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh_float64(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


ACTIVATIONS = {"silu": silu_float64, "gelu": gelu_float64, "gelu_tanh": gelu_tanh_float64}


def act_and_mul_float64(input, act):
    """act(input[..., :d]) * input[..., d:] in float64."""
    x = input.double()
    d = x.shape[-1] // 2
    return ACTIVATIONS[act](x[..., :d]) * x[..., d:]


def silu_and_mul_reference(input):
    return {"out": act_and_mul_float64(input, "silu")}


def gelu_and_mul_reference(input):
    return {"out": act_and_mul_float64(input, "gelu")}


def gelu_tanh_and_mul_reference(input):
    return {"out": act_and_mul_float64(input, "gelu_tanh")}


def _template(name, description, reference):
    return TraceTemplate(name=name, target="//ops:activation", description=description, axes=AXES,
                         inputs=INPUTS, outputs=OUTPUTS, reference=reference,
                         tolerance=TOLERANCE, examples=EXAMPLES, small=SMALL,
                         options={"enable_pdl": "launch detail: programmatic dependent launch on sm90+, "
                                                "no workload"})


SILU_AND_MUL = _template("silu_and_mul", "out = silu(input[:, :d]) * input[:, d:]", silu_and_mul_reference)
GELU_AND_MUL = _template("gelu_and_mul", "out = gelu(input[:, :d]) * input[:, d:] (exact, erf)",
                         gelu_and_mul_reference)
GELU_TANH_AND_MUL = _template("gelu_tanh_and_mul", "out = gelu_tanh(input[:, :d]) * input[:, d:]",
                              gelu_tanh_and_mul_reference)
