"""Trace templates: each public API describes its own workload.

    from kiln.trace import traced, traced_apis
    traced_apis()["rmsnorm"].template.reference(...)

template.py   the format: axes, inputs/outputs, reference, tolerance, examples
registry.py   the @traced decorator that attaches a template to its API, and the lookup
examples.py   realistic model shapes (Llama-3.1-8B/70B, Qwen3-32B, Gemma) and decode/prefill sizes
definition.py template x example -> the JSON benchmark definition
consistency.py does a template still describe its API's signature (used by the tests)
norm.py       the templates of kiln.norm's APIs
"""

from __future__ import annotations

from .registry import Traced, traced, traced_api, traced_apis
from .template import (
    WORKLOAD_DTYPE,
    Axis,
    Example,
    Scalar,
    Tensor,
    TraceTemplate,
    const,
    dtype_name,
    torch_dtype,
    var,
)

__all__ = [
    "WORKLOAD_DTYPE",
    "Axis",
    "Example",
    "Scalar",
    "Tensor",
    "TraceTemplate",
    "Traced",
    "const",
    "dtype_name",
    "torch_dtype",
    "traced",
    "traced_api",
    "traced_apis",
    "var",
]
