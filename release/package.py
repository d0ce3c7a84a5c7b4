"""Staging built modules as an artifact set: each library the JIT built, copied below one
directory, and the manifest that describes them by the JIT's own keys (runtime/manifest.py).

    <dest>/manifest.json
    <dest>/<module>/<module>.<action key>.<abi>.so
    <dest>/<module>/<module>.<action key>.triton.bundle.json    (a triton module: its launch
                                        metadata and every cubin, in one file: runtime/triton_module.py)

The same directory is what the artifact repository serves (under <version>/<tag>/<abi>/) and what
the wheel carries as its package.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from kiln.runtime import sources
from kiln.runtime.build import BuildPlan
from kiln.runtime.files import write_atomic
from kiln.runtime.key import file_digest, portable_action_key
from kiln.runtime.manifest import MANIFEST, Manifest, ModuleEntry, digest, safe_relpath
from kiln.runtime.metadata import Metadata, is_triton
from kiln.runtime.triton_module import bundle


def shipped_file(p: BuildPlan, md: Metadata) -> tuple[str, bytes | None]:
    """The file name a module ships under, and its bytes when they are not the library's own (a
    triton module ships one bundle of its launch metadata and cubins)."""
    if is_triton(md):
        return md.library.removesuffix(".json") + ".bundle.json", bundle(p.key_dir, md.library)
    return md.library, None


def entry_for(p: BuildPlan, md: Metadata) -> ModuleEntry:
    """The manifest entry of a module the JIT built (its metadata validated against `p`)."""
    # kiln's own headers, by portable name: a lookup checks them against the installation it runs
    # in. The toolchain's headers (C++ library, Python, pybind11, CUDA) are covered by its identity.
    own = {n: d.sha256 for d in md.deps if (n := sources.portable_name(d.path))}
    name, data = shipped_file(p, md)
    file = safe_relpath(f"{md.module}/{name}", md.module)
    sha, size = (md.library_sha256, md.library_size) if data is None else \
        (hashlib.sha256(data).hexdigest(), len(data))
    return ModuleEntry(
        module=md.module, uri=md.uri, label=md.label, params=dict(p.spec.params), file=file,
        sha256=sha, size=size, archs=list(md.archs),
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
        _, data = shipped_file(p, md)
        if data is None:
            shutil.copyfile(p.key_dir / md.library, target)
        else:
            target.write_bytes(data)
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
