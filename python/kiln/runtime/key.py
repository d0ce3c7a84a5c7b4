"""Cache identity: digests, the spec key, the action key, and header dependencies.

Two keys, both SHA-256 hex:
  spec key   = H(key parts): kiln version, module name, URI, parameters, toolchain identity,
               the exact flags (archs included), Python ABI, digests of the spec's input files,
               and the build-affecting environment. Known before compiling; names the cache slot.
  action key = H(spec key, every header the compiler read, with its digest). Known after the
               first compile (from the compiler's depfiles); recorded in the metadata and checked
               before every load, so editing any included header rebuilds with no reinstall.

And their portable projections, which precompiled modules are found by (docs/release.md):
  portable key        = H(portable parts): the key parts less everything that belongs to one
                        machine (compiler paths and versions, absolute include and library paths)
                        and less the archs (matched by what the module's SASS runs on). Computed
                        without a compiler.
  portable action key = H(portable key, kiln's own headers the compiler read, by portable name).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

KEY_FORMAT = 1


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def spec_key(parts: dict) -> str:
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


class Dep(NamedTuple):
    """A file the compiler read, as it was when the module was built. (A tuple: a module reads
    hundreds of headers, and the warm path builds one per header.)"""

    path: str
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: str) -> Dep:
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns, file_digest(path))

    def changed(self) -> bool:
        """True when the file is gone or its bytes differ (size/mtime first, digest if needed)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        if st.st_size != self.size:
            return True
        if st.st_mtime_ns == self.mtime_ns:
            return False
        return file_digest(self.path) != self.sha256

    def to_json(self) -> list:
        return [self.path, self.size, self.mtime_ns, self.sha256]

    @classmethod
    def from_json(cls, row) -> Dep:
        path, size, mtime_ns, sha = row
        return cls(str(path), int(size), int(mtime_ns), str(sha))


def action_key(spec_key_: str, deps: list[Dep]) -> str:
    h = hashlib.sha256(spec_key_.encode())
    for d in sorted(deps, key=lambda d: d.path):
        h.update(f"\n{d.path}\0{d.sha256}".encode())
    return h.hexdigest()


def portable_action_key(portable_key: str, sources: dict[str, str]) -> str:
    """H(portable key, {portable name: SHA-256} of the kiln files a module was compiled from)."""
    h = hashlib.sha256(b"portable\0" + portable_key.encode())
    for name in sorted(sources):
        h.update(f"\n{name}\0{sources[name]}".encode())
    return h.hexdigest()


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Makefile-style depfile (gcc -MD / nvcc -MD), targets dropped."""
    deps: list[str] = []
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    for line in text.splitlines():
        if ":" not in line:
            continue
        # The first unescaped ':' followed by whitespace or end separates targets from deps.
        i = 0
        while i < len(line):
            if line[i] == ":" and (i + 1 == len(line) or line[i + 1] in " \t"):
                break
            i += 1
        rest = line[i + 1:]
        token, j = [], 0
        while j < len(rest):
            c = rest[j]
            if c == "\\" and j + 1 < len(rest) and rest[j + 1] in " #":
                token.append(rest[j + 1])
                j += 2
                continue
            if c == "$" and j + 1 < len(rest) and rest[j + 1] == "$":
                token.append("$")
                j += 2
                continue
            if c in " \t":
                if token:
                    deps.append("".join(token))
                    token = []
            else:
                token.append(c)
            j += 1
        if token:
            deps.append("".join(token))
    return deps


def collect_deps(depfiles: list[Path], exclude_under: tuple[Path, ...]) -> list[Dep]:
    """Every file named in the depfiles (absolute, deduplicated), except those under
    `exclude_under` (the generated directory: its content is fixed by the spec key already)."""
    seen: dict[str, Dep] = {}
    excluded = tuple(str(p.resolve()) + os.sep for p in exclude_under)
    for df in depfiles:
        for raw in parse_depfile(df.read_text()):
            path = os.path.realpath(raw)
            if path in seen or path.startswith(excluded):
                continue
            seen[path] = Dep.of(path)
    return sorted(seen.values(), key=lambda d: d.path)


def deps_summary(deps: list[Dep]) -> list[dict]:
    return [d._asdict() for d in deps]
