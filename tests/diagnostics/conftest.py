"""Fixtures for the diagnostics tests: APIs decorated under chosen KILN_* settings, in-process.

The decorator reads its settings when it runs, so a test sets the environment, then decorates (a
toy function, or one of kiln's undecorated API functions: at level 0 they are the originals)."""

from __future__ import annotations

import pytest

from kiln.api_logging import logged_api
from kiln.diagnostics import registry
from kiln.runtime import env

DIAG_KNOBS = ("KILN_LOGLEVEL", "KILN_LOGDEST", "KILN_DUMP", "KILN_DUMP_DIR", "KILN_DUMP_MAX_COUNT",
              "KILN_DUMP_MAX_BYTES", "KILN_DUMP_INCLUDE", "KILN_DUMP_EXCLUDE", "KILN_FORCE_BACKEND")


@pytest.fixture
def api_log(tmp_path):
    """The file the API log goes to in these tests (unless a test names another destination)."""
    return tmp_path / "api.log"


@pytest.fixture
def decorate(monkeypatch, api_log):
    """decorate(fn, name, mutates=(), KILN_X=value, ...): `fn` under logged_api with those settings
    (and only those: every other diagnostic knob is unset; the log goes to `api_log`)."""

    def make(fn, name, mutates=(), **settings):
        for knob in DIAG_KNOBS:
            monkeypatch.delenv(knob, raising=False)
        monkeypatch.setenv("KILN_LOGDEST", str(api_log))
        for knob, value in settings.items():
            monkeypatch.setenv(knob, str(value))
        env.reload()  # kiln parses its settings once: have it read these
        return logged_api(name, mutates=mutates)(fn)

    return make


@pytest.fixture(autouse=True)
def restore_registry(monkeypatch):
    """Toy APIs registered by a test are forgotten after it (names may repeat across tests). kiln's
    own APIs are imported first, so their registrations are never made into a copy and lost with
    it (whichever test first uses one)."""
    import kiln

    kiln.load_api()
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
