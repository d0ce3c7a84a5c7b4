"""Helpers for the precompiled-module tests: a small release of toy modules (each compiles in a
second), installed as a package or laid out as an artifact repository, and a manifest editor
that keeps the recorded keys consistent (so a test changes exactly one thing)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from helpers import make_toy_sources, toy_spec

from kiln.runtime import jit, sources
from kiln.runtime.arch import ArchContext
from kiln.runtime.artifacts import ReleaseId
from kiln.runtime.build import plan
from kiln.runtime.key import portable_action_key, spec_key
from kiln.runtime.manifest import MANIFEST, Manifest, digest
from kiln.runtime.workspace import Workspace
from release import package, wheel


def build_toy_release(root: Path, names=("toy_module",), value: int = 42) -> tuple[Path, Manifest]:
    """Build toy modules (answer() == value) in a private workspace under `root` and stage them
    as the host artifact set of this kiln version. Returns (toy sources, staged directory)."""
    toy = make_toy_sources(root / "src", value=value)
    ws = Workspace(root / "build-ws")
    built = []
    for name in names:
        spec = toy_spec(toy, name=name)
        jit.build(spec, workspace=ws, quiet=True)
        p = plan(spec, ArchContext((), "host"), ws)
        md, reason = jit.check(p)
        assert reason is None, reason
        built.append((p, md))
    rid = host_release()
    staged = rid.dir_in(root / "repo")
    package.stage(built, staged, "host", "")
    return toy, staged


def host_release() -> ReleaseId:
    return ReleaseId(sources.kiln_version(), "host", sources.python_abi())


def manifest_digest(artifact_dir: Path) -> str:
    return digest((artifact_dir / MANIFEST).read_bytes())


def edit_manifest(artifact_dir: Path, edit) -> None:
    """Apply `edit(dict)` to the manifest JSON, then recompute the keys it records."""
    path = artifact_dir / MANIFEST
    d = json.loads(path.read_text())
    edit(d)
    for m in d["modules"]:
        m["portable_key"] = spec_key(m["portable_parts"])
        m["portable_action_key"] = portable_action_key(m["portable_key"], m["sources"])
    path.write_text(json.dumps(d, indent=1, sort_keys=True))


def set_version(d: dict, version: str) -> None:
    d["kiln_version"] = version
    for m in d["modules"]:
        m["kiln_version"] = version
        m["portable_parts"]["kiln_version"] = version


def install_package(artifact_dir: Path, site: Path) -> Path:
    """Unpack the wheel of `artifact_dir` into `site` as pip would; returns the package dir."""
    m = Manifest.from_bytes((artifact_dir / MANIFEST).read_bytes(), "test")
    whl = wheel.write_wheel(artifact_dir, m, site.parent / "wheels")
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    return site / wheel.names("host")[1]


def write_pins(path: Path, artifact_dir: Path, rid: ReleaseId | None = None) -> Path:
    path.write_text(json.dumps({(rid or host_release()).path: manifest_digest(artifact_dir)}))
    return path


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest
