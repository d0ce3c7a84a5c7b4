"""The crash case the diagnostics exist for: a process killed inside a kiln call leaves the call's
inputs in the log and in a dump, and the dump replays the call."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from helpers import REPO, run_python

# The launcher of the loaded module is replaced by one that SIGKILLs the process: the module was
# looked up (and logged) as in a real call, then the process dies where the kernel would run.
CRASHING_CALL = """
import os, signal, torch, kiln
from kiln import _jit

real_module_for = _jit.module_for

class KilledAtLaunch:
    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        if name == "rmsnorm":
            return lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
        return getattr(self.module, name)

_jit.module_for = lambda *args: KilledAtLaunch(real_module_for(*args))
x = torch.randn(37, 300)[:, :257]
kiln.rmsnorm(x, torch.randn(257), eps=1e-5)
print("unreachable")
"""


def test_a_call_killed_at_launch_leaves_its_inputs_in_the_log_and_a_replayable_dump(tmp_path):
    log, dumps = tmp_path / "api-%p.log", tmp_path / "dumps"
    proc = run_python(CRASHING_CALL, check=False, env={
        "KILN_LOGLEVEL": "3", "KILN_LOGDEST": str(log), "KILN_DUMP": "1", "KILN_DUMP_DIR": str(dumps)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "unreachable" not in proc.stdout
    (written,) = tmp_path.glob("api-*.log")
    text = written.read_text()
    assert "kiln.rmsnorm" in text
    assert "input  = Tensor(shape=[37, 257], dtype=float32, device=cpu, strides=[300, 1]" in text
    assert "eps    = 1e-05" in text
    assert "using module norm_dtype_f32_host" in text and "returned" not in text

    (call,) = (p.parent for p in dumps.rglob("call.json"))
    record = json.loads((call / "call.json").read_text())
    assert record["status"] == "started"  # the call never returned
    assert record["modules"][0]["module"] == "norm_dtype_f32_host"  # known before the launch
    assert record["args"][0]["strides"] == [300, 1]

    # The replay runs the real kernel on the recorded inputs; it completes here, so the crash is
    # not reproduced, and it says so.
    replay = subprocess.run([sys.executable, "-m", "kiln", "replay", str(call)], capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    assert replay.returncode == 1, replay.stderr
    assert "the recorded call never returned (the process died during it)" in replay.stdout
    assert "result: Tensor(shape=[37, 257]" in replay.stdout and "nan=0 inf=0" in replay.stdout
