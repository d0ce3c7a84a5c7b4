"""The compile lock: released when its holder dies, never a silent hang, and N cold
processes compile a module once."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, make_toy_sources, run_python

from kiln.runtime.lock import LockTimeout, ModuleLock

HOLDER = """
import sys, time
from kiln.runtime.lock import ModuleLock
with ModuleLock(sys.argv[1], "held module"):
    open(sys.argv[2], "w").close()
    time.sleep(600)
"""


def _start_holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    lock, ready = tmp_path / "m.lock", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(ready)])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "lock holder exited early"
        assert time.monotonic() < deadline, "lock holder never took the lock"
        time.sleep(0.05)
    return proc, lock


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    proc, lock = _start_holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    start = time.monotonic()
    with ModuleLock(lock, "the module", timeout_s=10):
        pass
    assert time.monotonic() - start < 2


def test_waiting_for_a_live_holder_times_out_naming_it(tmp_path):
    proc, lock = _start_holder(tmp_path)
    try:
        with pytest.raises(LockTimeout) as e:
            with ModuleLock(lock, "the module", timeout_s=1):
                pass
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and "the module" in msg and "KILN_JIT_LOCK_TIMEOUT" in msg
    finally:
        proc.kill()
        proc.wait()


def test_concurrent_cold_start_compiles_once(tmp_path):
    """Several processes start cold on the same module at the same moment: exactly one compiles,
    every one loads a correct module."""
    toy = make_toy_sources(tmp_path / "src", value=1234)
    ws = tmp_path / "ws"
    go = tmp_path / "go"
    script = (
        "import time, sys; from pathlib import Path\n"
        "from helpers import toy_spec; from kiln.runtime import jit\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"m = jit.load(toy_spec(Path({str(toy)!r}), name='toy_race'))\n"
        "print(m.answer(), jit.stats.compiled)\n"
    )
    env = dict(os.environ, KILN_WORKSPACE_BASE=str(ws),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    time.sleep(1.0)  # let every interpreter reach the barrier
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = [out.split() for out, _ in outs]
    assert all(r[0] == "1234" for r in results)
    assert sum(int(r[1]) for r in results) == 1, results


def test_lock_wait_is_reported(tmp_path):
    proc, lock = _start_holder(tmp_path)
    try:
        out = run_python(
            "import logging, sys\n"
            "from kiln.runtime.lock import ModuleLock, LockTimeout\n"
            "from kiln.runtime.log import logger\n"
            "logger()\n"
            "ModuleLock.REPORT_EVERY_S = 0.3\n"
            "try:\n"
            f"    ModuleLock({str(lock)!r}, 'mod_x', timeout_s=1.2).__enter__()\n"
            "except LockTimeout:\n"
            "    print('timed out')\n", check=True)
        assert "timed out" in out.stdout
        assert "waiting" in out.stderr and "mod_x" in out.stderr and f"pid {proc.pid}" in out.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_removed_lock_file_is_locked_afresh_by_its_waiter(tmp_path):
    """`clean` removes lock files no process holds; a process that was waiting on the removed
    file must then lock the file at the path, never the removed one (or two processes would both
    hold the module's lock)."""
    import threading

    path = tmp_path / "m.lock"
    holder = ModuleLock(path, "the module", timeout_s=10).__enter__()
    waiter = ModuleLock(path, "the module", timeout_s=10)
    got = threading.Event()
    t = threading.Thread(target=lambda: (waiter.__enter__(), got.set()))
    t.start()
    time.sleep(0.2)
    assert not got.is_set()
    holder.remove()  # unlinks the file, then releases: the waiter's descriptor is of a dead file
    t.join(10)
    assert got.is_set()
    assert os.path.samestat(os.stat(path), os.fstat(waiter._fd))  # the live file at the path
    assert not ModuleLock(path, "the module", timeout_s=0).try_acquire()
    waiter.release()
    other = ModuleLock(path, "the module", timeout_s=0)
    assert other.try_acquire()
    other.release()
