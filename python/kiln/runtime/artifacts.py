"""The artifact repository: its layout, the pinned manifest digests that make it
trustworthy, and the local download cache.

One layout for the repository, a KILN_ARTIFACT_DIR and the download cache:

    <root>/<kiln version>/<arch list tag>/<python abi>/manifest.json
    <root>/<kiln version>/<arch list tag>/<python abi>/<module>/<library file>

The arch list tag is `host` for the CPU backend, else the release's CUDA arch list (`sm80-sm90a`
for "8.0 9.0a"). A kiln release pins the SHA-256 of every manifest it may use, as
`"<version>/<tag>/<abi>": "<sha256>"` in release/pins.json (shipped with the kernel sources;
KILN_ARTIFACT_PINS names a file of more), and a manifest lists the SHA-256 of every file: neither a
file nor a manifest can be swapped by the repository, a mirror or a local directory.
KILN_VERIFY_CHECKSUMS=0 turns both checks off, with a warning on every use.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import download, env, manifest, sources
from .arch import Arch, ArchError, arch_list_tag, parse_arch_list, parse_arch_list_tag
from .log import logger
from .manifest import Manifest, ModuleEntry
from .workspace import Workspace

PINS = "release/pins.json"  # below the source root


class ArtifactError(RuntimeError):
    """An artifact that must be used cannot be: missing while offline, unverifiable, tampered."""


@dataclass(frozen=True)
class ReleaseId:
    """One manifest of the repository: a kiln version, an arch list tag, a Python ABI."""

    version: str
    tag: str
    abi: str

    @property
    def path(self) -> str:
        return f"{self.version}/{self.tag}/{self.abi}"

    def dir_in(self, root: Path) -> Path:
        return Path(root, self.version, self.tag, self.abi)

    def url_in(self, repository: str) -> str:
        return f"{repository.rstrip('/')}/{self.path}"

    def archs(self) -> tuple[Arch, ...] | None:
        """The tag's arch list; () for host; None for a tag that is neither."""
        if self.tag == "host":
            return ()
        try:
            return parse_arch_list_tag(self.tag.removeprefix(TRITON_TAG_PREFIX))
        except ArchError:
            return None

    @classmethod
    def of(cls, m: Manifest) -> ReleaseId:
        """The release a manifest describes: where its set lies in the repository layout, and
        the key of its pin."""
        return cls(m.kiln_version, tag_for(m.toolchain, parse_arch_list(m.arch_list)),
                   m.python_abi)

    @classmethod
    def parse(cls, path: str) -> ReleaseId:
        parts = path.split("/")
        if len(parts) != 3 or not all(parts) or ".." in parts:
            raise ArtifactError(f"{path!r} is not '<version>/<tag>/<python abi>'")
        return cls(*parts)


TRITON_TAG_PREFIX = "triton-"  # a triton release: "triton-sm80-sm90a" (cubins, no libraries)


def tag_for(toolchain: str, archs) -> str:
    if toolchain == "triton":
        return TRITON_TAG_PREFIX + arch_list_tag(archs)
    return "host" if toolchain == "host" else arch_list_tag(archs)


def _read_pins(path: Path, where: str) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ArtifactError(f"{where} {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in data.items()):
        raise ArtifactError(f"{where} {path} must map '<version>/<tag>/<abi>' to a SHA-256")
    for k in data:
        ReleaseId.parse(k)
    return data


def pins() -> dict[str, str]:
    """Every pinned manifest digest: the release's own, then KILN_ARTIFACT_PINS."""
    out = _read_pins(sources.source_root() / PINS, "the release pins")
    extra = env.get("KILN_ARTIFACT_PINS")
    if extra:
        if not Path(extra).is_file():
            raise ArtifactError(f"KILN_ARTIFACT_PINS={extra} does not exist")
        for k, v in _read_pins(Path(extra), "KILN_ARTIFACT_PINS").items():
            if out.get(k, v) != v:
                raise ArtifactError(f"KILN_ARTIFACT_PINS pins {k} to {v}, but this kiln release "
                                    f"pins it to {out[k]}; remove the conflicting entry")
            out[k] = v
    return out


def verifying() -> bool:
    return env.get("KILN_VERIFY_CHECKSUMS")


def check_manifest_digest(rid: ReleaseId, actual: str, where: str) -> None:
    """Refuse a manifest whose digest is not the pinned one (or warn, when not verifying)."""
    if not verifying():
        logger().warning("kiln: WARNING: KILN_VERIFY_CHECKSUMS=0: using manifest %s without "
                         "checking it against a pinned digest (a debugging aid only)", where)
        return
    pinned = pins().get(rid.path)
    if pinned is None:
        raise ArtifactError(
            f"cannot verify {where}: this kiln pins no digest for {rid.path}. Pin it (python -m "
            f"release pin, or a KILN_ARTIFACT_PINS file with {{\"{rid.path}\": \"{actual}\"}} "
            f"once you trust it), or use a release this kiln pins")
    if pinned != actual:
        raise ArtifactError(
            f"{where} has SHA-256 {actual}, but this kiln pins {rid.path} to {pinned}: the "
            f"manifest was replaced or corrupted; refusing it. Fetch it again from a trusted "
            f"repository.")


@functools.lru_cache(maxsize=64)
def _parse(path: str, mtime_ns: int, size: int) -> tuple[Manifest, str]:
    return manifest.read(Path(path))


def read_local(rid: ReleaseId, root: Path, where: str) -> Manifest | None:
    """The verified manifest of `rid` under `root`, or None when there is none."""
    path = rid.dir_in(root) / manifest.MANIFEST
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    m, digest = _parse(str(path), st.st_mtime_ns, st.st_size)
    check_manifest_digest(rid, digest, f"{where} {path}")
    if (m.kiln_version, m.python_abi) != (rid.version, rid.abi):
        raise ArtifactError(f"{where} {path} is for kiln {m.kiln_version} and {m.python_abi}, "
                            f"but it lies under {rid.path}; refusing the inconsistent directory")
    return m


def local_releases(root: Path, version: str, abi: str) -> list[ReleaseId]:
    """The releases of `version` and `abi` that have a manifest under `root`, sorted by tag."""
    base = Path(root, version)
    if not base.is_dir():
        return []
    return [ReleaseId(version, d.name, abi) for d in sorted(base.iterdir())
            if (d / abi / manifest.MANIFEST).is_file()]


def pinned_releases(version: str, abi: str) -> list[ReleaseId]:
    return sorted(r for r in map(ReleaseId.parse, pins()) if (r.version, r.abi) == (version, abi))


def cache_root() -> Path:
    return Workspace.current().downloads


def _manifest_item(rid: ReleaseId, repository: str, dest_root: Path) -> download.Item:
    pinned = pins().get(rid.path) if verifying() else None
    if verifying() and pinned is None:
        raise ArtifactError(
            f"cannot download {rid.url_in(repository)}/{manifest.MANIFEST}: this kiln pins no "
            f"digest for {rid.path}, so it could not be verified. Use a release this kiln pins, "
            f"or add the digest to a KILN_ARTIFACT_PINS file")
    return download.Item(f"{rid.url_in(repository)}/{manifest.MANIFEST}",
                         rid.dir_in(dest_root) / manifest.MANIFEST, pinned, None,
                         f"manifest {rid.path}", max_size=manifest.MAX_MANIFEST_BYTES)


def _file_item(rid: ReleaseId, entry: ModuleEntry, repository: str,
               dest_root: Path) -> download.Item:
    manifest.safe_relpath(entry.file, f"manifest {rid.path}")
    return download.Item(f"{rid.url_in(repository)}/{entry.file}",
                         rid.dir_in(dest_root).joinpath(*entry.file.split("/")),
                         entry.sha256 if verifying() else None, entry.size,
                         f"{entry.module} ({rid.path})")


def ensure_manifest(rid: ReleaseId, repository: str, dest_root: Path) -> Manifest:
    """The verified manifest of `rid` in `dest_root`, downloaded first if it is not there."""
    dest = rid.dir_in(dest_root)
    Workspace(dest_root).ensure(dest)
    download.fetch(_manifest_item(rid, repository, dest_root))
    m = read_local(rid, dest_root, "downloaded manifest")
    assert m is not None
    return m


def ensure_file(rid: ReleaseId, entry: ModuleEntry, repository: str, dest_root: Path) -> Path:
    """The verified file of `entry` in `dest_root`, downloaded first if it is not there."""
    item = _file_item(rid, entry, repository, dest_root)
    Workspace(dest_root).ensure(item.dest.parent)
    download.fetch(item)
    return item.dest


@dataclass(frozen=True)
class Prefetched:
    directory: Path
    downloaded: int
    present: int
    size: int


def prefetch(rid: ReleaseId, repository: str, dest_root: Path | None = None,
             jobs: int | None = None) -> Prefetched:
    """Download the manifest of `rid` and every file it lists into `dest_root` (default: the
    download cache), verified, at most `jobs` at a time: everything an offline machine needs."""
    if not repository:
        raise ArtifactError("no artifact repository to download from: set "
                            "KILN_ARTIFACT_REPOSITORY or pass --repository")
    if env.get("KILN_OFFLINE"):
        raise ArtifactError(f"KILN_OFFLINE=1 forbids downloading {rid.url_in(repository)}")
    dest_root = Path(dest_root or cache_root()).absolute()
    m = ensure_manifest(rid, repository, dest_root)
    items = [_file_item(rid, e, repository, dest_root) for e in m.modules]
    ws = Workspace(dest_root)
    for i in items:
        ws.ensure(i.dest.parent)
    results = download.fetch_all(items, jobs)
    return Prefetched(rid.dir_in(dest_root), sum(results), len(results) - sum(results),
                      sum(e.size for e in m.modules))
