"""The fuzz suite: every public API with hypothesis-drawn inputs on the CPU backend (shapes, dtypes,
strides, bad page tables, non-monotonic indptr, bad last_page_len, NaN/Inf, aliasing outputs), in a
child process so that a crash fails the test with the input that caused it; outputs are written
into guarded buffers whose other bytes must stay untouched. Once more under AddressSanitizer (the
host backend built with KILN_JIT_ASAN=1). tests/fuzz/fuzz_driver.py holds the cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, asan_env, asan_runtime

DRIVER = REPO / "tests" / "fuzz" / "fuzz_driver.py"
APIS = {"rmsnorm", "fused_add_rmsnorm", "batch_decode", "batch_prefill", "batch_prefill_ragged",
        "single_decode", "single_prefill", "merge_states", "merge_state_in_place", "append_paged_kv_cache",
        "get_batch_indices_positions"}


def _fuzz(tmp_path, examples: int, extra_env: dict, timeout: float) -> dict[str, int]:
    log = tmp_path / "case.json"
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, KILN_TEST_FUZZ_EXAMPLES=str(examples), KILN_TEST_FUZZ_LOG=str(log),
               PYTHONPATH=path, **extra_env)
    proc = subprocess.run([sys.executable, str(DRIVER)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)
    last = log.read_text() if log.exists() else "(none)"
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, (f"the fuzz child exited {proc.returncode}; the last case it began:\n"
                                  f"{last}\n{tail}")
    assert "AddressSanitizer" not in proc.stderr, tail
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FUZZ COUNTS "))
    return json.loads(line.removeprefix("FUZZ COUNTS "))


def test_every_api_survives_ten_thousand_fuzzed_inputs(tmp_path):
    counts = _fuzz(tmp_path, 1000, {}, timeout=1500)
    assert set(counts) == APIS
    assert sum(counts.values()) >= 10_000, counts


@pytest.mark.slow
@pytest.mark.skipif(asan_runtime() is None, reason="the host compiler has no AddressSanitizer runtime")
def test_the_fuzz_finds_nothing_under_address_sanitizer(tmp_path):
    env = {**asan_env(), "KILN_JIT_ASAN": "1", "KILN_TEST_FUZZ_NARROW": "1"}
    counts = _fuzz(tmp_path, 120, env, timeout=1500)
    assert set(counts) == APIS and sum(counts.values()) >= 1200, counts
