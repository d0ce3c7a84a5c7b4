"""version.txt is the one version source: the package metadata, kiln.__version__, the
cache key and release manifests all derive from it, and nothing else spells a version."""

import re
import tomllib

from helpers import REPO, make_toy_sources, toy_spec

import kiln
from kiln.runtime import build, sources
from release import wheel
from release.package import stage

VERSION = (REPO / "version.txt").read_text().strip()


def test_version_txt_is_a_release_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION  # MAJOR.MINOR.PATCH (docs/release.md)


def test_every_consumer_reads_version_txt():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "version.txt"}
    assert kiln.__version__ == sources.kiln_version() == VERSION


def test_no_other_file_spells_the_version():
    offenders = []
    for path in [*REPO.glob("*.toml"), *REPO.glob("*.py"),
                 *(p for d in ("python", "runtime", "codegen", "release") for p in (REPO / d).rglob("*.py"))]:
        if re.search(r"""(__version__|version)\s*=\s*["']\d+\.\d+""", path.read_text()):
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_the_cache_key_and_a_release_manifest_carry_it(tmp_path):
    from kiln.runtime import jit
    from kiln.runtime.arch import ArchContext
    from kiln.runtime.manifest import MANIFEST, Manifest
    from kiln.runtime.workspace import Workspace

    toy = make_toy_sources(tmp_path / "src")
    ws = Workspace(tmp_path / "ws")
    jit.build(toy_spec(toy), workspace=ws, quiet=True)
    p = build.plan(toy_spec(toy), ArchContext((), "host"), ws)
    assert p.key_parts["kiln_version"] == p.portable_parts["kiln_version"] == VERSION
    m, _ = stage([(p, jit.check(p)[0])], tmp_path / "set", "host", "")
    assert m.kiln_version == VERSION and all(e.kiln_version == VERSION for e in m.modules)
    whl = wheel.write_wheel(tmp_path / "set", Manifest.from_bytes(
        (tmp_path / "set" / MANIFEST).read_bytes(), "test"), tmp_path / "dist")
    assert f"-{VERSION}-" in whl.name
