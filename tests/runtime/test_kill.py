"""SIGKILL at random moments of a cold compile, and of a process waiting on its lock: whatever the
moment, the next process completes and loads a correct module (the toy's known value).

Each trial starts two cold processes on the same module at once (one compiles, the other waits on
the module lock or finds the result), kills each at an independent random moment within the time
a cold load takes, then runs a fresh process on what they left."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, make_toy_sources, run_python

from kiln.runtime import metadata
from kiln.runtime.lock import ModuleLock
from kiln.runtime.workspace import Workspace

TRIALS = 20

LOAD = """
from pathlib import Path
from helpers import toy_spec
from kiln.runtime import jit
m = jit.load(toy_spec(Path({toy!r})))
print("answer", m.answer(), "compiled", jit.stats.compiled)
"""


def _spawn(code: str, ws: Workspace) -> subprocess.Popen:
    env = dict(os.environ, KILN_WORKSPACE_BASE=str(ws.base),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _cold_load_seconds(toy, ws: Workspace) -> float:
    start = time.monotonic()
    proc = run_python(LOAD.format(toy=str(toy)), env={"KILN_WORKSPACE_BASE": str(ws.base)})
    assert "answer 42 compiled 1" in proc.stdout
    return time.monotonic() - start


def _fresh_load_is_correct(toy, ws: Workspace) -> None:
    proc = run_python(LOAD.format(toy=str(toy)), env={"KILN_WORKSPACE_BASE": str(ws.base)},
                      timeout=120)
    assert "answer 42" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_sigkill_at_random_moments_of_a_cold_compile_and_of_a_waiter(tmp_path):
    toy = make_toy_sources(tmp_path / "src")
    span = _cold_load_seconds(toy, Workspace(tmp_path / "ws-probe")) * 1.3
    rng = random.Random(1234)
    outcomes = {"killed": 0, "finished": 0}
    for trial in range(TRIALS):
        ws = Workspace(tmp_path / f"ws-{trial}")
        code = LOAD.format(toy=str(toy))
        procs = [_spawn(code, ws), _spawn(code, ws)]
        kills = sorted((rng.uniform(0, span), i) for i in range(2))
        start = time.monotonic()
        for at, i in kills:
            time.sleep(max(0.0, at - (time.monotonic() - start)))
            if procs[i].poll() is None:
                procs[i].send_signal(signal.SIGKILL)
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            outcomes["killed" if proc.returncode == -signal.SIGKILL else "finished"] += 1
            if proc.returncode == 0:
                assert "answer 42" in out
        _fresh_load_is_correct(toy, ws)
    # The random moments did hit both: processes killed, and processes that completed.
    assert outcomes["killed"] > 0, outcomes


@pytest.mark.slow
def test_sigkill_of_processes_waiting_on_the_lock(tmp_path):
    """Waiters killed while another process holds the module lock leave nothing behind: the lock
    is taken by the next process as soon as the holder lets go."""
    toy = make_toy_sources(tmp_path / "src")
    ws = Workspace(tmp_path / "ws")
    module_dir = ws.ensure(ws.module_dir("toy_module"))
    rng = random.Random(99)
    with ModuleLock(module_dir / ".lock", "toy_module (held by the test)"):
        waiters = [_spawn(LOAD.format(toy=str(toy)), ws) for _ in range(5)]
        for proc in waiters:
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
        for proc in waiters:
            proc.communicate(timeout=60)
    assert not list(ws.artifacts.glob(f"toy_module/*/{metadata.METADATA}"))
    _fresh_load_is_correct(toy, ws)
