"""A regular (non-editable) install: the wheel carries the kernel sources as kiln/_src, the
package directory can be read-only, and kiln never writes into it."""

import os
import shutil
import stat
import subprocess
import sys

import pytest
from helpers import REPO


def _snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.mark.slow
def test_read_only_install_builds_into_the_workspace_only(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".pytest_cache", "_src"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src)],
                   check=True, capture_output=True, text=True, timeout=600)
    assert (site / "kiln" / "_src" / "ops" / "norm" / "norm.cuh").is_file()
    assert (site / "kiln" / "_src" / "version.txt").read_text() == (REPO / "version.txt").read_text()
    assert (site / "kiln" / "codegen" / "templates" / "spec_config.h.jinja").is_file()
    # the release's pinned manifest digests (docs/release.md), read by kiln.runtime.artifacts
    assert (site / "kiln" / "_src" / "release" / "pins.json").read_text() == \
        (REPO / "release" / "pins.json").read_text()
    assert not (site / "release").exists()  # the release tooling itself is not installed
    for p in [site, *site.rglob("*")]:  # read-only, as a system site-packages may be
        mode = p.stat().st_mode
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = _snapshot(site)
    ws = tmp_path / "ws"
    code = (
        "import torch, kiln\n"
        f"assert kiln.__file__.startswith({str(site)!r}), kiln.__file__\n"
        "x, w = torch.randn(5, 300), torch.randn(300)\n"
        "ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()\n"
        "torch.testing.assert_close(kiln.rmsnorm(x, w).double(), ref, rtol=2e-5, atol=2e-5)\n"
        "print(kiln.__version__)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site), KILN_WORKSPACE_BASE=str(ws))
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == (REPO / "version.txt").read_text().strip()
        assert _snapshot(site) == before  # nothing written into the package
        assert any((ws / "artifacts").iterdir())  # everything went to the workspace
    finally:
        for p in [site, *site.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
