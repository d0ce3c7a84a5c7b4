"""Compatibility metadata stored beside each artifact, and its validation.

`metadata.json` is written last, atomically: it is the commit marker of a cache slot. It records
what the slot holds: the library's file name, size and SHA-256, the headers the compiler read, and
the size and SHA-256 of each build output (objects, depfiles, the linked library in `build/`) so
an incremental rebuild can prove it reuses only what this build produced.

Reading is strict: every field must be present with its type (a wrong-typed or missing field, an
unknown one, a file name that is not a plain name in the slot) is `CorruptMetadata`, never a
TypeError further on. An artifact is usable only when its metadata parses, names this kiln
version, this spec key and Python ABI, agrees with itself (its key parts hash to its spec key, its
action key to its dependencies, its library name to its action key), the library it lists is a
regular file of this user's or root's that no one else can write, with the recorded size and
SHA-256, and no header the compiler read has changed.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from . import files, sources
from .files import write_atomic
from .key import Dep, action_key, spec_key

METADATA = "metadata.json"
FORMAT = 2  # 2: build outputs recorded; strict types
MAX_METADATA_BYTES = 16 << 20  # a module reads a few thousand headers at most
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HEX = re.compile(r"[0-9a-f]*")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Metadata:
    module: str
    uri: str
    label: str
    kiln_version: str
    python_abi: str
    spec_key: str
    action_key: str
    library: str  # a plain file name in the key directory
    library_sha256: str
    library_size: int
    archs: list[str]
    toolchain: dict
    key_parts: dict
    deps: list[Dep] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    built_at: float = 0.0
    build_seconds: float = 0.0
    # {file name in build/: [size, SHA-256]} of the build outputs at publish time.
    outputs: dict[str, list] = field(default_factory=dict)
    format: int = FORMAT

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["deps"] = [x.to_json() for x in self.deps]
        return d

    @classmethod
    def from_json(cls, d: object, where: str = METADATA) -> Metadata:
        """The metadata in `d`, every field checked; CorruptMetadata naming what is wrong."""
        if not isinstance(d, dict):
            raise CorruptMetadata(f"{where} is corrupt: metadata must be a JSON object, got "
                                  f"{type(d).__name__}")
        if d.get("format") != FORMAT:
            raise CorruptMetadata(f"{where} has format {d.get('format')!r}, this kiln writes "
                                  f"{FORMAT}", outdated=isinstance(d.get("format"), int))
        missing = sorted(set(_TYPES) - set(d))
        if missing:
            raise CorruptMetadata(f"{where} is corrupt: it lacks {', '.join(missing)}")
        extra = sorted(set(d) - set(_TYPES))
        if extra:
            raise CorruptMetadata(f"{where} is corrupt: unknown fields {', '.join(map(str, extra))}")
        for name, check in _TYPES.items():
            why = check(d[name])
            if why:
                raise CorruptMetadata(f"{where} is corrupt: {name} {why}, got {_short(d[name])}")
        data = dict(d)
        data["deps"] = list(map(Dep._make, d["deps"]))
        return cls(**data)


class CorruptMetadata(ValueError):
    """metadata.json cannot be used as it is. `outdated`: written by an older kiln (a format this
    one does not read), rather than damaged."""

    def __init__(self, message: str, outdated: bool = False):
        super().__init__(message)
        self.outdated = outdated


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v) -> str | None:
    return None if isinstance(v, str) else "must be a string"


def _ident(v) -> str | None:
    return None if isinstance(v, str) and _IDENT.match(v) else "must be a module name"


def _sha(v) -> str | None:
    return None if isinstance(v, str) and _SHA256.match(v) else "must be a SHA-256 hex digest"


def plain_name(v: object) -> str | None:
    """Why `v` is not a plain file name (no directory part, no '..', nothing hidden), or None."""
    if not isinstance(v, str) or not v:
        return "must be a non-empty file name"
    if "/" in v or "\\" in v or "\0" in v or v in (".", "..") or v.startswith("."):
        return "must be a plain file name in the cache slot (no '/', no '..', not hidden)"
    return None


def _size(v) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be a size in bytes"


def _number(v) -> str | None:
    return None if (_is_int(v) or isinstance(v, float)) and v >= 0 else "must be a number >= 0"


def _str_list(v) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else "must be a list of strings"


def _dict(v) -> str | None:
    return None if isinstance(v, dict) else "must be an object"


def _deps(v) -> str | None:
    why = "must be a list of [path, size, mtime_ns, sha256] rows"
    if type(v) is not list:
        return why
    for r in v:  # hundreds of rows on the warm path: no call per field (int excludes bool here)
        if not (type(r) is list and len(r) == 4 and type(r[0]) is str and r[0]
                and type(r[1]) is int and r[1] >= 0 and type(r[2]) is int
                and type(r[3]) is str and len(r[3]) == 64):
            return why
    if not _HEX.fullmatch("".join(r[3] for r in v)):
        return why
    return None


def _outputs(v) -> str | None:
    ok = isinstance(v, dict) and all(
        plain_name(k) is None and isinstance(r, list) and len(r) == 2 and _size(r[0]) is None
        and _sha(r[1]) is None for k, r in v.items())
    return None if ok else "must map plain file names to [size, sha256]"


_TYPES = {
    "module": _ident, "uri": _str, "label": _str, "kiln_version": _str, "python_abi": _str,
    "spec_key": _sha, "action_key": _sha, "library": plain_name, "library_sha256": _sha,
    "library_size": _size, "archs": _str_list, "toolchain": _dict, "key_parts": _dict,
    "deps": _deps, "commands": _str_list, "built_at": _number, "build_seconds": _number,
    "outputs": _outputs, "format": lambda v: None if _is_int(v) else "must be an integer",
}


TRITON_SUFFIX = ".triton.json"  # a triton module's "library": the launch metadata of its cubins


def is_triton(md: Metadata) -> bool:
    return md.toolchain.get("name") == "triton"


def library_name(module: str, action_key_: str, suffix: str) -> str:
    """The published library's file name: a new action key is a new name (never rewritten)."""
    return f"{module}.{action_key_[:16]}{suffix}"


def write(key_dir: Path, md: Metadata) -> None:
    write_atomic(key_dir / METADATA, json.dumps(md.to_json(), indent=1, sort_keys=True))


def read(key_dir: Path) -> Metadata | None:
    """The metadata in `key_dir`; None when there is none; CorruptMetadata when it cannot be used
    (unreadable, malformed, a link, or a file another user owns or can write)."""
    path = Path(key_dir) / METADATA
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symbolic link; EACCES: not ours
        raise CorruptMetadata(f"{path} cannot be opened ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        why = files.untrusted_file(st)
        if why:
            raise CorruptMetadata(f"{path} {why}")
        if st.st_size > MAX_METADATA_BYTES:
            raise CorruptMetadata(f"{path} has {st.st_size} bytes, too many for metadata")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptMetadata(f"{path} is corrupt: not valid JSON ({e})") from None
    return Metadata.from_json(d, str(path))


def problem(md: Metadata | None, key_dir: Path, spec_key_: str, version: str, abi: str,
            check_deps: bool = True) -> str | None:
    """Why the artifact in `key_dir` cannot be used, or None when it can."""
    return check(md, key_dir, spec_key_, version, abi, check_deps)[1]


def check(md: Metadata | None, key_dir: Path, spec_key_: str, version: str, abi: str,
          check_deps: bool = True) -> tuple[str, str | None]:
    """(state, why) of the artifact in `key_dir` described by `md`:
      ("ok", None)       usable;
      ("absent", why)    nothing was published there (no metadata);
      ("stale", why)     everything verifies, but a header the compiler read has changed since
                         (the one case where the build directory may be reused, once verified);
      ("damaged", why)   anything else: the slot cannot be trusted and is quarantined."""
    if md is None:
        return "absent", "not built yet (no metadata)"
    if md.kiln_version != version:
        return "damaged", f"built by kiln {md.kiln_version}, this is kiln {version}"
    if md.python_abi != abi:
        return "damaged", f"built for Python ABI {md.python_abi}, this is {abi}"
    if md.spec_key != spec_key_:
        return "damaged", "the spec key differs (sources, flags, archs or toolchain changed)"
    if spec_key(md.key_parts) != md.spec_key:
        return "damaged", "metadata is inconsistent (its key parts do not hash to its spec key)"
    for name in ("module", "uri", "kiln_version", "python_abi", "toolchain", "archs"):
        if getattr(md, name) != md.key_parts.get(name):
            return "damaged", f"metadata is inconsistent ({name} differs from its key parts)"
    if md.action_key != action_key(md.spec_key, md.deps):
        return "damaged", "metadata is inconsistent (action key does not match its dependencies)"
    triton = is_triton(md)
    suffix = TRITON_SUFFIX if triton else sources.extension_suffix()
    if md.library != library_name(md.module, md.action_key, suffix):
        return "damaged", (f"metadata is inconsistent (library {md.library!r} is not named after "
                           "its module and action key)")
    built = md.library if triton else f"{md.module}.so"
    if md.outputs.get(built) != [md.library_size, md.library_sha256]:
        return "damaged", ("metadata is inconsistent (the library is not the build output it "
                           "records)")
    lib = Path(key_dir) / md.library
    try:
        st = os.lstat(lib)
    except FileNotFoundError:
        return "damaged", f"library {lib.name} is missing"
    if stat.S_ISLNK(st.st_mode):
        return "damaged", f"library {lib.name} is a symbolic link"
    why = files.untrusted_file(st)
    if why:
        return "damaged", f"library {lib.name} {why}"
    if st.st_size != md.library_size:
        return "damaged", (f"library {lib.name} has {st.st_size} bytes, its metadata records "
                           f"{md.library_size} (truncated or replaced)")
    digest = files.verified_digest(lib)
    if digest != md.library_sha256:
        return "damaged", (f"library {lib.name} does not match its recorded SHA-256 (corrupt or "
                           "replaced)")
    if triton:  # every cubin: published in the slot, verified like the library
        for name, (size, sha) in sorted(md.outputs.items()):
            why = _published_problem(Path(key_dir) / name, size, sha)
            if why:
                return "damaged", why
    if check_deps:
        for d in md.deps:
            if d.changed():
                return "stale", f"dependency changed: {d.path}"
    return "ok", None


def _published_problem(path: Path, size: int, sha: str) -> str | None:
    """Why the published file `path` is not the one recorded ([size, sha]), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    if stat.S_ISLNK(st.st_mode):
        return f"{path.name} is a symbolic link"
    why = files.untrusted_file(st)
    if why:
        return f"{path.name} {why}"
    if st.st_size != size:
        return (f"{path.name} has {st.st_size} bytes, its metadata records {size} (truncated or "
                "replaced)")
    if files.verified_digest(path) != sha:
        return f"{path.name} does not match its recorded SHA-256 (corrupt or replaced)"
    return None
