"""What the first call of an op in a fresh process loads: kiln's own modules and the op's, not
torch.compile's machinery. Importing torch._dynamo costs about a second on a 2-core machine, more
than the rest of a warm first call together (docs/perf/compile-time.md), and a decorator on a hot
function can pull it in unnoticed (torch.compiler.assume_constant_result did)."""

from __future__ import annotations

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
