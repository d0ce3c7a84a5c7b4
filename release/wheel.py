"""Packaging an artifact set as a wheel that pip installs like any other (PEP 427), written with
the standard library only, byte for byte reproducible (sorted entries, fixed timestamps).

    kiln_precompiled_<toolchain>/__init__.py       a docstring; kiln never imports it
    kiln_precompiled_<toolchain>/manifest.json
    kiln_precompiled_<toolchain>/<module>/<library>
    kiln_kernels_precompiled_<toolchain>-<version>.dist-info/
        METADATA   Version = the kiln version (version.txt); Requires-Dist kiln-kernels==it
        WHEEL      tagged for this interpreter and platform (the modules are CPython extensions)
        entry_points.txt   [kiln.precompiled] <toolchain> = kiln_precompiled_<toolchain>
        RECORD

One distribution per toolchain, so a CUDA package and a host package can be installed together;
installing another arch list of the same toolchain replaces the first.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import sysconfig
import zipfile
from pathlib import Path

from kiln.runtime.manifest import MANIFEST, Manifest, safe_relpath
from kiln.runtime.precompiled import ENTRY_POINT_GROUP

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry: reproducible wheels


def names(toolchain: str) -> tuple[str, str]:
    """(distribution, import package) of the precompiled package of `toolchain`."""
    return f"kiln-kernels-precompiled-{toolchain}", f"kiln_precompiled_{toolchain}"


def wheel_tag() -> str:
    """cp311-cp311-linux_x86_64: the modules are extensions for exactly this interpreter."""
    if sys.implementation.name != "cpython":
        raise RuntimeError(f"precompiled packages are built for CPython, not "
                           f"{sys.implementation.name}")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{platform}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(artifact_dir: Path, m: Manifest, out_dir: Path) -> Path:
    """The wheel of the artifact set in `artifact_dir` (described by `m`), written to `out_dir`."""
    dist, pkg = names(m.toolchain)
    version = m.kiln_version
    tag = wheel_tag()
    stem = f"{dist.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    archs = f" for CUDA archs [{m.arch_list}]" if m.arch_list else ""
    init = (f'"""Precompiled kiln {version} modules ({m.toolchain}{archs}, {m.python_abi}).\n\n'
            f"kiln finds them through the '{ENTRY_POINT_GROUP}' entry point and manifest.json;\n"
            f'nothing here is meant to be imported."""\n')
    files: dict[str, bytes] = {f"{pkg}/__init__.py": init.encode(),
                               f"{pkg}/{MANIFEST}": (artifact_dir / MANIFEST).read_bytes()}
    for entry in m.modules:
        files[f"{pkg}/{safe_relpath(entry.file, entry.module)}"] = (
            artifact_dir / entry.file).read_bytes()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    files[f"{info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {dist}\n"
        f"Version: {version}\n"
        f"Summary: Precompiled kiln {version} kernels ({m.toolchain}{archs}, {m.python_abi})\n"
        "License: Apache-2.0\n"
        f"Requires-Python: =={py}.*\n"
        f"Requires-Dist: kiln-kernels=={version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: kiln-release\nRoot-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    ).encode()
    files[f"{info}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{m.toolchain} = {pkg}\n".encode()
    files[f"{info}/top_level.txt"] = f"{pkg}\n".encode()
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in sorted(files.items()))
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}-{tag}.whl"
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted(files.items()):
            safe_relpath(name, path.name)  # nothing in the archive may lead outside it
            zi = zipfile.ZipInfo(name, date_time=_EPOCH)
            zi.external_attr = 0o100644 << 16  # a regular file, rw-r--r--; never a link
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    tmp.replace(path)
    return path
