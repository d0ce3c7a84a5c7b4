"""`python -m kiln env [--json]`: the report a bug report needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import kiln
from kiln.__main__ import main
from kiln.diagnostics import env_report


def test_the_report_names_versions_toolchains_archs_workspaces_and_settings(kiln_env, capsys,
                                                                          session_workspace):
    kiln_env.set("KILN_LOGLEVEL", "3")
    kiln_env.set("MAX_JOBS", "2")
    kiln_env.set("KILN_LOGLEVL", "1")  # a typo
    kiln_env.set("KILN_NO_CACHE", "maybe")  # invalid
    kiln_env.set("KILN_JIT_VERBOSE", "0")  # set, but to the default
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for label in ("kiln", "Python", "torch", "CUDA driver", "nvcc", "host compiler", "triton", "GPUs",
                  "arch list in force", "workspace", "generated", "artifacts", "API logging"):
        assert re.search(rf"^\s*{label}\s", out, re.M), label
    assert f"kiln                 {kiln.__version__}" in out
    assert f"workspace            {session_workspace}" in out
    assert "API logging          level 3 (arguments and outputs) to stderr; dumps off" in out
    assert re.search(r"^  \* KILN_LOGLEVEL=3 +\(default 0\)$", out, re.M)
    assert re.search(r"^  \* MAX_JOBS=2 ", out, re.M)
    assert re.search(r"^  \? KILN_LOGLEVL=1 +\(not a kiln variable: a typo\?\)$", out, re.M)
    assert re.search(r"^  ! KILN_NO_CACHE=maybe +\(KILN_NO_CACHE='maybe' is not a boolean", out, re.M)
    assert re.search(r"^    KILN_JIT_VERBOSE=0 +\(the default\)$", out, re.M)


def test_json_report(kiln_env, capsys):
    kiln_env.set("KILN_FORCE_BACKEND", "host")
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kiln"]["version"] == kiln.__version__
    assert {"version", "cuda_runtime", "cuda_available", "devices"} <= set(report["torch"])
    assert set(report["arch_list"]) == {"archs", "source"}
    assert report["api_logging"]["force_backend"] == "host"
    rows = {v["name"]: v for v in report["variables"]}
    assert rows["KILN_FORCE_BACKEND"]["status"] == "non-default"
    assert rows["KILN_WORKSPACE_BASE"]["status"] == "non-default"


def test_a_failing_probe_is_reported_not_fatal(kiln_env):
    kiln_env.set("KILN_CUDA_ARCH_LIST", "banana")
    report = env_report.collect()
    assert "cannot parse CUDA arch 'banana'" in report["arch_list"]["error"]
    assert "arch list in force   unavailable: ArchError" in env_report.format_text(report)


def test_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "kiln", "env"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "arch list in force" in proc.stdout and "variables set" in proc.stdout
