"""Compatibility metadata stored beside each artifact (R5.5), and its validation.

`metadata.json` is written last, atomically: it is the commit marker. An artifact is usable only
when its metadata parses, names this kiln version, this spec key and Python ABI, the library it
lists exists with the recorded size and SHA-256, and no header the compiler read has changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .files import write_atomic
from .key import Dep, action_key, file_digest

METADATA = "metadata.json"
FORMAT = 1


@dataclass
class Metadata:
    module: str
    uri: str
    label: str
    kiln_version: str
    python_abi: str
    spec_key: str
    action_key: str
    library: str  # file name in the key directory
    library_sha256: str
    library_size: int
    archs: list[str]
    toolchain: dict
    key_parts: dict
    deps: list[Dep] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    built_at: float = 0.0
    build_seconds: float = 0.0
    format: int = FORMAT

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["deps"] = [x.to_json() for x in self.deps]
        return d

    @classmethod
    def from_json(cls, d: dict) -> Metadata:
        d = dict(d)
        d["deps"] = [Dep.from_json(x) for x in d.get("deps", [])]
        return cls(**d)


class CorruptMetadata(ValueError):
    pass


def write(key_dir: Path, md: Metadata) -> None:
    write_atomic(key_dir / METADATA, json.dumps(md.to_json(), indent=1, sort_keys=True))


def read(key_dir: Path) -> Metadata | None:
    """The metadata in `key_dir`; None when there is none; CorruptMetadata when it is unreadable."""
    path = key_dir / METADATA
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        md = Metadata.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptMetadata(f"{path} is corrupt ({e})") from e
    if md.format != FORMAT:
        raise CorruptMetadata(f"{path} has format {md.format}, expected {FORMAT}")
    return md


def problem(md: Metadata | None, key_dir: Path, spec_key: str, version: str, abi: str,
            check_deps: bool = True) -> str | None:
    """Why the artifact in `key_dir` cannot be used, or None when it can."""
    if md is None:
        return "not built yet (no metadata)"
    if md.kiln_version != version:
        return f"built by kiln {md.kiln_version}, this is kiln {version}"
    if md.python_abi != abi:
        return f"built for Python ABI {md.python_abi}, this is {abi}"
    if md.spec_key != spec_key:
        return "the spec key differs (sources, flags, archs or toolchain changed)"
    lib = key_dir / md.library
    try:
        size = lib.stat().st_size
    except OSError:
        return f"library {lib.name} is missing"
    if size != md.library_size or file_digest(lib) != md.library_sha256:
        return f"library {lib.name} does not match its recorded SHA-256 (corrupt or replaced)"
    if md.action_key != action_key(md.spec_key, md.deps):
        return "metadata is inconsistent (action key does not match its dependencies)"
    if check_deps:
        for d in md.deps:
            if d.changed():
                return f"dependency changed: {d.path}"
    return None
