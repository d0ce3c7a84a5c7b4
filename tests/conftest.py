"""Shared test setup: a private workspace for the session, device parametrisation through kiln's
capability helpers, the `gpu` marker wiring, and the environment fixtures.

Tests never touch ~/.cache/kiln: the session uses a fresh KILN_WORKSPACE_BASE (or
KILN_TEST_WORKSPACE, to keep compiled modules across local runs).

kiln parses its KILN_* settings once, on first use (runtime/env.py). So a test changes a setting
through the `kiln_env` fixture, which sets the variable and makes kiln read the environment again
(and restores both afterwards); every test starts and ends with a fresh read.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from case_sampling import sampled

from kiln.runtime import env as kiln_env_table

_SESSION_WS = os.environ.get("KILN_TEST_WORKSPACE") or tempfile.mkdtemp(prefix="kiln-test-ws-")
os.environ["KILN_WORKSPACE_BASE"] = _SESSION_WS
# Tests choose archs themselves; an arch list from the caller's shell would change what they build.
os.environ.pop("KILN_CUDA_ARCH_LIST", None)
for knob in ("KILN_DISABLE_JIT", "KILN_NO_CACHE", "KILN_JIT_DEBUG", "KILN_JIT_LINEINFO",
             "KILN_JIT_ASAN",  # tests that build with AddressSanitizer set it in their child
             # nor where precompiled modules come from: tests that need those set them
             "KILN_ARTIFACT_DIR", "KILN_ARTIFACT_REPOSITORY", "KILN_ARTIFACT_PINS", "KILN_OFFLINE",
             "KILN_VERIFY_CHECKSUMS", "KILN_SKIP_VERSION_CHECK"):
    os.environ.pop(knob, None)
# scripts/release_check.sh runs op tests against an installed precompiled package only.
if os.environ.get("KILN_TEST_DISABLE_JIT") == "1":
    os.environ["KILN_DISABLE_JIT"] = "1"
# API diagnostics are decided when kiln is imported (after this file): tests start with them off.
for knob in [k for k in os.environ if k.startswith(("KILN_LOG", "KILN_DUMP"))] + ["KILN_FORCE_BACKEND"]:
    os.environ.pop(knob, None)


def pytest_addoption(parser):
    parser.addoption("--sample", action="append", default=[], metavar="N|MODULE=N",
                     help="keep every N-th case of each parametrised test (its first included): a quick "
                          "device round over large grids such as tests/flashinfer's. MODULE=N sets it "
                          "for one test module (its file name without .py), N for the others; each kept "
                          "case records its N as the junit property 'sample'")


def pytest_collection_modifyitems(config, items):
    from kiln import utils

    sampled(config, items)
    if utils.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (kiln.utils.cuda_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_workspace() -> str:
    return _SESSION_WS


@pytest.fixture(autouse=True)
def _fresh_settings():
    """Every test reads the environment afresh, and leaves no parsed settings behind."""
    kiln_env_table.reload()
    yield
    kiln_env_table.reload()


class KilnEnv:
    """Sets and unsets environment variables for one test, and has kiln re-read them each time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._mp = monkeypatch

    def set(self, name: str | None = None, value: object = None, **values: object) -> None:
        """set("KILN_X", "1") or set(KILN_X="1", KILN_Y="0")."""
        if name is not None:
            values[name] = value
        for k, v in values.items():
            self._mp.setenv(k, str(v))
        kiln_env_table.reload()

    def unset(self, *names: str) -> None:
        for name in names:
            self._mp.delenv(name, raising=False)
        kiln_env_table.reload()


@pytest.fixture
def kiln_env(monkeypatch) -> KilnEnv:
    """kiln_env.set("KILN_DISABLE_JIT", "1"), kiln_env.unset(...): restored after the test."""
    return KilnEnv(monkeypatch)
