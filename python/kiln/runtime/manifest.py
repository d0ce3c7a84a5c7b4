"""The manifest of a set of precompiled modules: an installed precompiled package, a directory of
the artifact repository, the local download cache. One format for all (docs/release.md):

    manifest.json
      format, kiln_version, python_abi, toolchain, arch_list, created_at
      modules: one entry per module
        module, uri, label, params, file, sha256, size, archs, kiln_version, python_abi,
        toolchain (the compilers that built it: path and version),
        portable_parts, portable_key, sources ({portable name: SHA-256} of the kiln headers the
        compiler read), portable_action_key, spec_key and action_key (the JIT's own keys on the
        machine that built it)

File names are paths relative to the manifest's directory. Anything that could lead outside it --
an absolute path, '..', a backslash, an empty part -- is refused when a manifest is read or
written, and a file is opened only when no part of its path below the directory is a link.
Reading checks every field's type and that the recorded keys agree with what they are made of.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .key import portable_action_key, spec_key

MANIFEST = "manifest.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest of thousands of modules is well below this
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ManifestError(ValueError):
    """A manifest is malformed, inconsistent, or names a path outside its directory."""


def safe_relpath(name: object, where: str) -> str:
    """`name` when it is a relative path that stays inside its directory; ManifestError otherwise."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: a file name must be a non-empty string, got {name!r}")
    bad = ("an absolute path" if name.startswith("/") or re.match(r"^[A-Za-z]:", name) else
           "a backslash" if "\\" in name else
           "a NUL byte" if "\0" in name else
           "'..'" if ".." in name.split("/") else
           "an empty or '.' part" if any(p in ("", ".") for p in name.split("/")) else None)
    if bad:
        raise ManifestError(f"{where}: refusing file name {name!r}: it has {bad}, so it could "
                            "lead outside the directory it belongs to")
    return name


def resolve_inside(root: Path, name: str, where: str) -> Path:
    """The regular file `root/name`, refusing a name that escapes `root` and any link on the way
    (a link could point anywhere, so its target's checksum would prove nothing about the path)."""
    parts = safe_relpath(name, where).split("/")
    path = Path(root)
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{where}: {path} does not exist") from None
        if stat.S_ISLNK(st.st_mode):
            raise ManifestError(f"{where}: refusing {path}: it is a symbolic link")
        last = i == len(parts) - 1
        if last and not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{where}: refusing {path}: it is not a regular file")
        if not last and not stat.S_ISDIR(st.st_mode):
            raise ManifestError(f"{where}: refusing {path}: {part} is not a directory")
    return path


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ModuleEntry:
    module: str
    uri: str
    label: str
    params: dict
    file: str
    sha256: str
    size: int
    archs: list
    kiln_version: str
    python_abi: str
    toolchain: dict
    portable_parts: dict
    portable_key: str
    sources: dict
    portable_action_key: str
    spec_key: str
    action_key: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: object, where: str) -> ModuleEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a module entry must be an object")
        types = {"module": str, "uri": str, "label": str, "params": dict, "file": str,
                 "sha256": str, "size": int, "archs": list, "kiln_version": str, "python_abi": str,
                 "toolchain": dict, "portable_parts": dict, "portable_key": str, "sources": dict,
                 "portable_action_key": str, "spec_key": str, "action_key": str}
        missing = sorted(set(types) - set(d))
        if missing:
            raise ManifestError(f"{where}: module entry lacks {', '.join(missing)}")
        for name, kind in types.items():
            if not isinstance(d[name], kind) or (kind is int and isinstance(d[name], bool)):
                raise ManifestError(f"{where}: {name} must be {kind.__name__}, got {d[name]!r}")
        entry = cls(**{k: d[k] for k in types})
        where = f"{where} ({entry.module})"
        if not _IDENT.match(entry.module):
            raise ManifestError(f"{where}: module name {entry.module!r} is not an identifier")
        safe_relpath(entry.file, where)
        for name, sha in [("sha256", entry.sha256), *((f"sources[{n}]", s)
                                                      for n, s in entry.sources.items())]:
            if not isinstance(sha, str) or not _SHA256.match(sha):
                raise ManifestError(f"{where}: {name} is not a SHA-256 hex digest: {sha!r}")
        for name in entry.sources:
            safe_relpath(name, where)
        if spec_key(entry.portable_parts) != entry.portable_key:
            raise ManifestError(f"{where}: portable_key does not match portable_parts")
        if portable_action_key(entry.portable_key, entry.sources) != entry.portable_action_key:
            raise ManifestError(f"{where}: portable_action_key does not match its sources")
        return entry


@dataclass(frozen=True)
class Manifest:
    kiln_version: str
    python_abi: str
    toolchain: str  # "host" | "cuda"
    arch_list: str  # the release's arch list, "" for host
    created_at: float
    modules: tuple[ModuleEntry, ...] = field(default=())
    format: int = FORMAT

    def entries(self, module: str) -> list[ModuleEntry]:
        return [m for m in self.modules if m.module == module]

    def to_bytes(self) -> bytes:
        """Canonical bytes: the digest of a manifest is the digest of exactly these."""
        d = {k: v for k, v in asdict(self).items() if k != "modules"}
        d["modules"] = [m.to_json() for m in self.modules]
        return (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{where}: {len(data)} bytes is too large for a manifest")
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise ManifestError(f"{where} is not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a manifest must be a JSON object")
        if d.get("format") != FORMAT:
            raise ManifestError(f"{where} has format {d.get('format')!r}; this kiln reads format "
                                f"{FORMAT}")
        head = {"kiln_version": str, "python_abi": str, "toolchain": str, "arch_list": str,
                "created_at": (int, float), "modules": list}
        for name, kind in head.items():
            if not isinstance(d.get(name), kind):
                raise ManifestError(f"{where}: {name} is missing or has the wrong type")
        modules = tuple(ModuleEntry.from_json(m, where) for m in d["modules"])
        for m in modules:
            if (m.kiln_version, m.python_abi) != (d["kiln_version"], d["python_abi"]):
                raise ManifestError(f"{where}: {m.module} is for kiln {m.kiln_version} and "
                                    f"{m.python_abi}, the manifest for kiln {d['kiln_version']} "
                                    f"and {d['python_abi']}")
        files = [m.file for m in modules]
        if len(set(files)) != len(files):
            raise ManifestError(f"{where}: two modules name the same file")
        return cls(d["kiln_version"], d["python_abi"], d["toolchain"], d["arch_list"],
                   float(d["created_at"]), modules)


def read(path: Path) -> tuple[Manifest, str]:
    """The manifest at `path` and the SHA-256 of its bytes."""
    data = Path(path).read_bytes()
    return Manifest.from_bytes(data, str(path)), digest(data)
