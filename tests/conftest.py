"""Shared test setup: a private workspace for the session, device parametrisation through kiln's
capability helpers (R4.2-6), and the `gpu` marker wiring.

Tests never touch ~/.cache/kiln: the session uses a fresh KILN_WORKSPACE_BASE (or
KILN_TEST_WORKSPACE, to keep compiled modules across local runs).
"""

from __future__ import annotations

import os
import tempfile

import pytest

_SESSION_WS = os.environ.get("KILN_TEST_WORKSPACE") or tempfile.mkdtemp(prefix="kiln-test-ws-")
os.environ["KILN_WORKSPACE_BASE"] = _SESSION_WS
# Tests choose archs themselves; an arch list from the caller's shell would change what they build.
os.environ.pop("KILN_CUDA_ARCH_LIST", None)
for knob in ("KILN_DISABLE_JIT", "KILN_NO_CACHE", "KILN_JIT_DEBUG", "KILN_JIT_LINEINFO",
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


def pytest_collection_modifyitems(config, items):
    from kiln import utils

    if utils.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (kiln.utils.cuda_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_workspace() -> str:
    return _SESSION_WS
