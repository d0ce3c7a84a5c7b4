"""Checking a precompiled package or artifact set before it is published: every name stays inside
its archive or directory and none is a link, the manifest reads back, every module's file has the
recorded size and SHA-256, and (with `sass=True`) every module holds SASS for each of its archs,
read with cuobjdump without running anything.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

from kiln.runtime.arch import parse_arch
from kiln.runtime.manifest import MANIFEST, Manifest, ManifestError, digest, resolve_inside, safe_relpath


def cuobjdump() -> str | None:
    """cuobjdump from PATH, the CUDA toolkit, or the nvidia-cuda-cuobjdump wheel (test extra)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13 as cu13  # the wheel installs nvidia/cu13/bin/cuobjdump
    except ImportError:
        return None
    for base in cu13.__path__:
        candidate = Path(base) / "bin" / "cuobjdump"
        if candidate.is_file():
            candidate.chmod(candidate.stat().st_mode | 0o111)
            return str(candidate)
    return None


def nvdisasm() -> str | None:
    """nvdisasm (which cuobjdump runs to print SASS) from PATH, beside cuobjdump, or the
    nvidia-cuda-nvdisasm wheel (test extra)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    tool = cuobjdump()
    candidate = Path(tool).with_name("nvdisasm") if tool else None
    if candidate is not None and candidate.is_file():
        candidate.chmod(candidate.stat().st_mode | 0o111)
        return str(candidate)
    return None


def dump_sass(library: Path) -> str:
    """The SASS of every cubin in `library` (cuobjdump --dump-sass, with nvdisasm found for it)."""
    tool, disasm = cuobjdump(), nvdisasm()
    if tool is None or disasm is None:
        raise FileNotFoundError("printing SASS needs cuobjdump and nvdisasm (the CUDA toolkit, or "
                                "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return subprocess.run([tool, "--dump-sass", str(library)], capture_output=True, text=True,
                          check=True, env={**os.environ, "NVDISASM_PATH": str(Path(disasm).parent)}).stdout


def sass_problems(library: Path, archs: list[str]) -> list[str]:
    tool = cuobjdump()
    if tool is None:
        return ["cuobjdump not found (install the nvidia-cuda-cuobjdump wheel or the CUDA toolkit)"]
    listing = subprocess.run([tool, "--list-elf", str(library)], capture_output=True, text=True,
                             check=True).stdout
    return [f"{library.name} has no SASS for sm_{parse_arch(a).sm}" for a in archs
            if f".sm_{parse_arch(a).sm}." not in listing]


def _check_entries(m: Manifest, read, sass_dir: Path | None) -> list[str]:
    problems = []
    for e in m.modules:
        try:
            data = read(e.file)
        except (OSError, KeyError, ManifestError) as err:
            problems.append(f"{e.module}: {e.file} cannot be read ({err})")
            continue
        if len(data) != e.size or digest(data) != e.sha256:
            problems.append(f"{e.module}: {e.file} does not match its recorded size and SHA-256")
        elif e.toolchain.get("name") == "triton":  # a bundle: each cubin against its digest
            problems += _bundle_problems(e, data)
        elif sass_dir is not None and e.toolchain.get("name") == "cuda":
            lib = sass_dir / Path(e.file).name
            lib.write_bytes(data)
            problems += sass_problems(lib, e.archs)
    return problems


def _bundle_problems(e, data: bytes) -> list[str]:
    """What is wrong with a triton module's bundle: not one of `e.module`, or a cubin that does
    not match the digest its launch metadata records, or an arch the entry claims and lacks."""
    import json

    from kiln.runtime.triton_module import BUNDLE_FORMAT

    try:
        d = json.loads(data)
        library, cubins = d["library"], d["cubins"]
        if d.get("format") != BUNDLE_FORMAT or library.get("module") != e.module:
            return [f"{e.module}: {e.file} is not a triton bundle of {e.module}"]
        problems = []
        for entry, per_arch in sorted(library["kernels"].items()):
            missing = sorted(set(e.archs) - set(per_arch))
            if missing:
                problems.append(f"{e.module}: kernel {entry} has no cubin for {', '.join(missing)}")
            for arch, launch in sorted(per_arch.items()):
                blob = bytes.fromhex(cubins[launch["cubin"]])
                if len(blob) != launch["cubin_size"] or digest(blob) != launch["cubin_sha256"]:
                    problems.append(f"{e.module}: {launch['cubin']} ({entry}, {arch}) does not match "
                                    "its recorded size and SHA-256")
        return problems
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return [f"{e.module}: {e.file} is not a readable triton bundle ({err})"]


def verify_directory(root: Path, sass: bool = False) -> tuple[Manifest, list[str]]:
    """The manifest of the artifact set in `root` and what is wrong with the set ([] if nothing)."""
    m = Manifest.from_bytes((root / MANIFEST).read_bytes(), str(root / MANIFEST))
    with tempfile.TemporaryDirectory() as tmp:
        return m, _check_entries(m, lambda f: resolve_inside(root, f, str(root)).read_bytes(),
                                 Path(tmp) if sass else None)


def verify_wheel(path: Path, sass: bool = False) -> tuple[Manifest, list[str]]:
    """The manifest inside the wheel at `path` and what is wrong with the wheel ([] if nothing)."""
    problems = []
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        for info in infos:
            try:
                safe_relpath(info.filename, path.name)
            except ManifestError as e:
                problems.append(str(e))
            if stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"{path.name}: {info.filename} is a symbolic link")
        manifests = [i.filename for i in infos if i.filename.count("/") == 1
                     and i.filename.endswith("/" + MANIFEST)]
        if len(manifests) != 1:
            raise ManifestError(f"{path.name} holds {len(manifests)} package manifests, not one")
        pkg = manifests[0].split("/")[0]
        m = Manifest.from_bytes(z.read(manifests[0]), f"{path.name}:{manifests[0]}")
        with tempfile.TemporaryDirectory() as tmp:
            problems += _check_entries(m, lambda f: z.read(f"{pkg}/{f}"), Path(tmp) if sass else None)
    return m, problems
