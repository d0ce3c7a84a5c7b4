"""What the first call of an op in a fresh process loads: kiln's own modules and the op's, not
torch.compile's machinery. Importing torch._dynamo costs about a second on a 2-core machine, more
than the rest of a warm first call together (docs/perf/compile-time.md), and a decorator on a hot
function can pull it in unnoticed (torch.compiler.assume_constant_result did)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from kiln import _pdl

HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "triton")
# what a load from the disk cache does not use: the compile side and the release tooling
NOT_ON_A_DISK_HIT = tuple(f"kiln.runtime.{m}" for m in ("ninja", "resources", "triton_build", "triton_module",
                                                         "artifacts", "download", "manifest"))


def test_pdl_resolve_carries_the_mark_assume_constant_result_gives():
    def probe(): ...

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) == {"_dynamo_marked_constant": True}
    assert _pdl.resolve._dynamo_marked_constant is True


def _first_calls(modules: tuple[str, ...]) -> str:
    """Run a first call of norm, activation and sampling in a fresh process; which of `modules`
    it imported."""
    child = f"""
import sys, torch, kiln
kiln.load_api()
x = torch.randn(2, 64)
kiln.rmsnorm(x, torch.randn(64))
kiln.silu_and_mul(x)
kiln.softmax(x)
print(sorted(m for m in {modules!r} if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         env=dict(os.environ), timeout=600).stdout
    return out.strip().splitlines()[-1]


def test_a_first_call_of_each_family_in_a_fresh_process_leaves_torch_compile_unloaded():
    assert _first_calls(HEAVY) == "[]"


def test_a_first_call_served_from_the_disk_cache_imports_no_compile_side_or_release_tooling():
    _first_calls(())  # compiles what the session's workspace lacks
    assert _first_calls(NOT_ON_A_DISK_HIT) == "[]"


def _disk_hit_census() -> dict:
    """A first kiln.rmsnorm served from the disk cache, in a fresh process: the kiln classes it
    created through dataclasses.dataclass, the torch.library.custom_op calls, and the
    importlib.metadata.entry_points scans it made."""
    child = """
import dataclasses, importlib.metadata, json, sys, torch
made, counts = [], {"custom_op": 0, "entry_points": 0}
real_dataclass, real_custom_op, real_entry_points = (dataclasses.dataclass, torch.library.custom_op,
                                                     importlib.metadata.entry_points)
def dataclass(cls=None, /, **kw):
    def wrap(c):
        if c.__module__.startswith("kiln"):
            made.append(c.__module__ + "." + c.__qualname__)
        return real_dataclass(**kw)(c)
    return wrap if cls is None else wrap(cls)
def custom_op(*a, **kw):
    counts["custom_op"] += 1
    return real_custom_op(*a, **kw)
def entry_points(*a, **kw):
    counts["entry_points"] += 1
    return real_entry_points(*a, **kw)
dataclasses.dataclass, torch.library.custom_op, importlib.metadata.entry_points = (
    dataclass, custom_op, entry_points)
import kiln
kiln.rmsnorm(torch.randn(2, 64), torch.randn(64))
from kiln.runtime import jit, precompiled
print(json.dumps({"dataclasses": made, **counts, "disk_hits": jit.stats.disk_hits,
                  "op": hasattr(torch.ops.kiln, "fused_add_rmsnorm"),
                  "may_declare": precompiled._may_declare(precompiled.ENTRY_POINT_GROUP)}))
"""
    subprocess.run([sys.executable, "-c", "import torch, kiln; kiln.rmsnorm(torch.randn(2, 64), "
                    "torch.randn(64))"], check=True, env=dict(os.environ), timeout=600)  # warm the cache
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         env=dict(os.environ), timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


# What a warm first call of kiln.rmsnorm is allowed to build (docs/perf/compile-time.md, "Warm
# first call, 2026-12-04 (2)"): creating a dataclass costs 0.5-1 ms on the 2-core box, and these
# are what remain: rules.Target, env.Knob, arch.Arch, spec.TritonKernel and CompileSpec,
# metadata.Metadata, toolchain.Compiler, build.BuildPlan, and the trace template's Axis, Example and
# TraceTemplate (dataclasses.replace or field options use them). A new one on this path fails here:
# make it a kiln.runtime.record.Record, or keep it off the path of a disk hit.
DATACLASSES_ON_A_DISK_HIT = 11


def test_a_disk_hit_registers_no_custom_op_through_custom_op_and_builds_few_dataclasses():
    census = _disk_hit_census()
    assert census["disk_hits"] == 1
    assert census["op"]  # the family's ops are registered when its module is imported
    assert census["custom_op"] == 0  # 1-2 ms an op; kiln._ops registers through torch.library.Library
    assert len(census["dataclasses"]) <= DATACLASSES_ON_A_DISK_HIT, census["dataclasses"]
    if not census["may_declare"]:  # no precompiled package installed: no entry-point scan either
        assert census["entry_points"] == 0
