"""Staging built modules as an artifact set: each library the JIT built, copied below one
directory, and the manifest that describes them by the JIT's own keys (runtime/manifest.py).

    <dest>/manifest.json
    <dest>/<module>/<module>.<action key>.<abi>.so

The same directory is what the artifact repository serves (under <version>/<tag>/<abi>/) and what
the wheel carries as its package.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from kiln.runtime import sources
from kiln.runtime.build import BuildPlan
from kiln.runtime.files import write_atomic
from kiln.runtime.key import file_digest, portable_action_key
from kiln.runtime.manifest import MANIFEST, Manifest, ModuleEntry, digest, safe_relpath
from kiln.runtime.metadata import Metadata


def entry_for(p: BuildPlan, md: Metadata) -> ModuleEntry:
    """The manifest entry of a module the JIT built (its metadata validated against `p`)."""
    # kiln's own headers, by portable name: a lookup checks them against the installation it runs
    # in. The toolchain's headers (C++ library, Python, pybind11, CUDA) are covered by its identity.
    own = {n: d.sha256 for d in md.deps if (n := sources.portable_name(d.path))}
    file = safe_relpath(f"{md.module}/{md.library}", md.module)
    return ModuleEntry(
        module=md.module, uri=md.uri, label=md.label, params=dict(p.spec.params), file=file,
        sha256=md.library_sha256, size=md.library_size, archs=list(md.archs),
        kiln_version=md.kiln_version, python_abi=md.python_abi, toolchain=md.toolchain,
        portable_parts=p.portable_parts, portable_key=p.portable_key, sources=own,
        portable_action_key=portable_action_key(p.portable_key, own), spec_key=md.spec_key,
        action_key=md.action_key,
    )


def stage(built: list[tuple[BuildPlan, Metadata]], dest: Path, toolchain: str,
          arch_list: str) -> tuple[Manifest, str]:
    """Write the artifact set of `built` to `dest` (replaced if it exists). Returns the manifest
    and the SHA-256 of its bytes (the digest a release pins)."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    entries = []
    for p, md in sorted(built, key=lambda b: b[1].module):
        entry = entry_for(p, md)
        target = dest / entry.file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p.key_dir / md.library, target)
        target.chmod(0o644)
        if file_digest(target) != entry.sha256:
            raise RuntimeError(f"{target}: the copy of {p.key_dir / md.library} does not match "
                               "its recorded SHA-256; rebuild with --force")
        entries.append(entry)
    m = Manifest(kiln_version=sources.kiln_version(), python_abi=sources.python_abi(),
                 toolchain=toolchain, arch_list=arch_list, created_at=round(time.time(), 3),
                 modules=tuple(entries))
    data = m.to_bytes()
    Manifest.from_bytes(data, "the staged manifest")  # what a reader checks, checked now
    write_atomic(dest / MANIFEST, data, mode=0o644)
    return m, digest(data)
