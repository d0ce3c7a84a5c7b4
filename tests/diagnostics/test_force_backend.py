"""KILN_FORCE_BACKEND: a diagnostic control, announced when in effect, never the default."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.diagnostics import call as call_module
from kiln.runtime import env


@pytest.fixture(autouse=True)
def fresh_announcement(monkeypatch):
    import threading

    monkeypatch.setattr(call_module, "_force_announced", threading.Event())


def test_the_default_is_no_forced_backend():
    assert env.KNOBS["KILN_FORCE_BACKEND"].default == ""


def test_a_forced_backend_wraps_even_at_level_0_and_is_announced_once(decorate, api_log):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_FORCE_BACKEND="host")
    assert rmsnorm is not kiln.norm.rmsnorm
    x, w = torch.randn(3, 16), torch.randn(16)
    torch.testing.assert_close(rmsnorm(x, w), kiln.rmsnorm(x, w), rtol=0, atol=0)
    rmsnorm(x, w)
    log = api_log.read_text()
    assert log.count("KILN_FORCE_BACKEND=host is in effect") == 1
    assert "diagnostic control" in log and "never a production setting" in log


def test_each_logged_call_says_its_backend_was_forced(decorate, api_log):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_FORCE_BACKEND="host",
                       KILN_LOGLEVEL=1)
    rmsnorm(torch.randn(2, 8), torch.randn(8))
    assert "kiln.rmsnorm [KILN_FORCE_BACKEND=host]" in api_log.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a CUDA device")
def test_forcing_cuda_without_a_device_is_a_clear_error(decorate):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_FORCE_BACKEND="cuda")
    with pytest.raises(RuntimeError, match="KILN_FORCE_BACKEND=cuda, but torch sees no CUDA device"):
        rmsnorm(torch.randn(2, 8), torch.randn(8))


@pytest.mark.gpu
def test_forcing_the_host_backend_for_cuda_tensors(decorate, tmp_path):
    rmsnorm = decorate(kiln.norm.rmsnorm, "kiln.rmsnorm", mutates=("out",), KILN_FORCE_BACKEND="host",
                       KILN_DUMP=1, KILN_DUMP_DIR=tmp_path / "dumps")
    fused = decorate(kiln.norm.fused_add_rmsnorm, "kiln.fused_add_rmsnorm", mutates=("input", "residual"),
                     KILN_FORCE_BACKEND="host")
    x, w = torch.randn(5, 256, device="cuda"), torch.randn(256, device="cuda")
    out = torch.empty_like(x)
    assert rmsnorm(x, w, out=out) is out and out.is_cuda
    torch.testing.assert_close(out.cpu(), kiln.rmsnorm(x.cpu(), w.cpu()), rtol=0, atol=0)
    r = torch.randn_like(x)
    xc, rc = x.cpu(), r.cpu()
    fused(x, r, w)
    kiln.fused_add_rmsnorm(xc, rc, w.cpu())
    assert torch.equal(x.cpu(), xc) and torch.equal(r.cpu(), rc)
    import json

    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "dumps").rglob("call.json")]
    assert record["forced_backend"] == "host" and record["backend"] == "host"
    assert record["device"]["device"].startswith("cuda")
