"""Downloading files from the artifact repository, for `file://`, `http://` and `https://`.

Every download is
  - atomic: written to a temporary file beside its destination, verified (size and SHA-256), then
    renamed into place, so a reader never sees a partial or unverified file;
  - locked: one flock per destination; the file is re-checked after taking it, so processes that
    want the same artifact download it once;
  - bounded: KILN_DOWNLOAD_DEADLINE bounds the whole download of one file, retries and backoff
    included (a server that trickles a byte a second is given up on, and the lock released, when
    it passes); KILN_DOWNLOAD_TIMEOUT bounds each wait for the server (to connect, or for any
    data); no more bytes than expected are read; KILN_DOWNLOAD_JOBS bounds parallel downloads;
  - retried with exponential backoff on transient failures (timeouts, dropped or refused
    connections, HTTP 5xx, 408 and 429), KILN_DOWNLOAD_RETRIES times; permanent ones (404, a
    checksum mismatch, a file that is too short or too long) fail at once;
  - shown: a progress line on a terminal, a log line when it starts and ends otherwise.
Checksums are verified unless KILN_VERIFY_CHECKSUMS=0, which warns on every such download.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import env
from .key import file_digest
from .lock import ModuleLock
from .log import logger
from .sources import kiln_version

BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
CHUNK = 1 << 16


class DownloadError(RuntimeError):
    """A download failed for good; the message names the artifact, the URL and why."""


class ChecksumError(DownloadError):
    """The bytes downloaded are not the bytes the manifest (or the pin) promised."""


class DeadlineError(DownloadError):
    """A download did not complete within KILN_DOWNLOAD_DEADLINE."""


class _Transient(Exception):
    """A failure that may pass: the attempt is retried."""


@dataclass(frozen=True)
class Item:
    url: str
    dest: Path
    sha256: str | None  # None: not verified (KILN_VERIFY_CHECKSUMS=0)
    size: int | None  # None: unknown (a manifest); otherwise exactly this many bytes
    what: str  # how messages name it
    max_size: int = 1 << 34  # read no more than this when the size is unknown


def problem(path: Path, sha256: str | None, size: int | None) -> str | None:
    """Why the file at `path` is not the one expected, or None when it is."""
    try:
        actual_size = path.stat().st_size
    except FileNotFoundError:
        return f"{path} does not exist"
    if size is not None and actual_size != size:
        return f"{path} has {actual_size} bytes, the manifest says {size}"
    if sha256 is not None:
        actual = file_digest(path)
        if actual != sha256:
            return f"{path} has SHA-256 {actual}, expected {sha256}"
    return None


class _Progress:
    """A progress line on a terminal; start and end log lines otherwise."""

    def __init__(self, item: Item):
        self.item = item
        self.tty = sys.stderr.isatty()
        self.start = time.monotonic()
        self.last = 0.0

    def begin(self) -> None:
        size = f" ({self.item.size / 1e6:.1f} MB)" if self.item.size else ""
        logger().info("kiln: downloading %s%s from %s", self.item.what, size, self.item.url)

    def update(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.tty or now - self.last < 0.2:
            return
        self.last = now
        pct = f"{100 * done / total:5.1f}% " if total else ""
        sys.stderr.write(f"\rkiln: {self.item.what}: {pct}{done / 1e6:.1f} MB")
        sys.stderr.flush()

    def end(self, done: int) -> None:
        if self.tty:
            sys.stderr.write("\r")
        logger().info("kiln: downloaded %s (%.1f MB in %.1fs)", self.item.what, done / 1e6,
                      time.monotonic() - self.start)


def _deadline_error(item: Item, deadline_s: float, done: int | None = None,
                    total: int | None = None) -> DeadlineError:
    got = f" ({done} of {total or '?'} bytes received)" if done is not None else ""
    return DeadlineError(f"{item.what}: gave up on {item.url} after {deadline_s:.0f}s"
                         f"{got}: KILN_DOWNLOAD_DEADLINE={deadline_s:.0f} bounds a download, "
                         "retries included. Check the network or the repository, or raise it for a "
                         "slow link")


def _attempt(item: Item, tmp: Path, timeout: float, deadline: float, deadline_s: float) -> None:
    """One download of `item` into `tmp`, giving up at `deadline` (time.monotonic()); _Transient
    or DownloadError when it fails. Each read returns what one receive brings (read1), so the
    deadline is checked at least every `timeout` seconds however slowly the data comes."""
    progress = _Progress(item)
    request = urllib.request.Request(item.url, headers={"User-Agent": f"kiln/{kiln_version()}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            header = resp.headers.get("Content-Length")
            announced = int(header) if header and header.isdigit() else None
            limit = item.size if item.size is not None else item.max_size
            if announced is not None and announced > limit:
                raise DownloadError(f"{item.what}: {item.url} announces {announced} bytes, more "
                                    f"than the {limit} expected")
            progress.begin()
            done = 0
            h = hashlib.sha256()
            read = getattr(resp, "read1", resp.read)
            with open(tmp, "wb") as f:
                while chunk := read(CHUNK):
                    if time.monotonic() > deadline:
                        raise _deadline_error(item, deadline_s, done, item.size or announced)
                    done += len(chunk)
                    if done > limit:
                        raise DownloadError(f"{item.what}: {item.url} sent more than the {limit} "
                                            "bytes expected")
                    h.update(chunk)
                    f.write(chunk)
                    progress.update(done, item.size or announced)
                f.flush()
                os.fsync(f.fileno())
    except urllib.error.HTTPError as e:
        if e.code >= 500 or e.code in (408, 429):
            raise _Transient(f"HTTP {e.code} {e.reason}") from None
        raise DownloadError(f"{item.what}: {item.url} answered HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise DownloadError(f"{item.what}: {item.url} cannot be read ({e.reason})") from None
        raise _Transient(f"{e.reason}") from None
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        raise _Transient(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
    if announced is not None and done < announced:
        raise _Transient(f"the connection closed after {done} of {announced} bytes")
    progress.end(done)
    if item.size is not None and done != item.size:
        raise ChecksumError(f"{item.what}: {item.url} has {done} bytes, the manifest says "
                            f"{item.size} (truncated or replaced); refusing it")
    if item.sha256 is not None and h.hexdigest() != item.sha256:
        raise ChecksumError(f"{item.what}: {item.url} has SHA-256 {h.hexdigest()}, expected "
                            f"{item.sha256} (tampered or corrupt); refusing it")


def fetch(item: Item) -> bool:
    """Make `item.dest` the verified file behind `item.url`. True when it was downloaded now,
    False when it was already there (from an earlier run or a concurrent process)."""
    if env.get("KILN_OFFLINE"):
        raise DownloadError(f"{item.what}: KILN_OFFLINE=1 forbids downloading {item.url}")
    if item.sha256 is None:
        logger().warning("kiln: WARNING: KILN_VERIFY_CHECKSUMS=0: %s from %s is not verified "
                         "against a checksum (a debugging aid only)", item.what, item.url)
    dest = Path(item.dest)
    if problem(dest, item.sha256, item.size) is None:
        return False
    with ModuleLock(dest.with_name(f".{dest.name}.lock"), item.what, doing="downloading"):
        if problem(dest, item.sha256, item.size) is None:
            return False  # another process downloaded it while we waited
        timeout = max(1, env.get("KILN_DOWNLOAD_TIMEOUT"))
        deadline_s = env.get("KILN_DOWNLOAD_DEADLINE")
        deadline = time.monotonic() + deadline_s
        retries = env.get("KILN_DOWNLOAD_RETRIES")
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        last = ""
        try:
            for attempt in range(retries + 1):
                if attempt:
                    delay = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (attempt - 1))
                    if time.monotonic() + delay >= deadline:
                        raise _deadline_error(item, deadline_s)
                    logger().warning("kiln: downloading %s failed (%s); retry %d of %d in %.1fs",
                                     item.what, last, attempt, retries, delay)
                    time.sleep(delay)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _deadline_error(item, deadline_s)
                try:
                    _attempt(item, tmp, min(timeout, remaining), deadline, deadline_s)
                except _Transient as e:
                    last = str(e)
                    continue
                os.chmod(tmp, 0o600)
                os.replace(tmp, dest)
                return True
        finally:
            tmp.unlink(missing_ok=True)
    raise DownloadError(f"{item.what}: could not download {item.url} after {retries + 1} "
                        f"attempt(s): {last}")


def fetch_all(items: list[Item], jobs: int | None = None) -> list[bool]:
    """fetch() every item, at most `jobs` (default KILN_DOWNLOAD_JOBS) at a time. Every item is
    attempted; the first failure is raised afterwards, with how many others failed."""
    jobs = max(1, jobs or env.get("KILN_DOWNLOAD_JOBS"))
    results: list[bool] = []
    errors: list[Exception] = []
    with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for fut in [pool.submit(fetch, i) for i in items]:
            try:
                results.append(fut.result())
            except Exception as e:  # collect all, report after every download has finished
                errors.append(e)
    if errors:
        more = f" (and {len(errors) - 1} more failure(s))" if len(errors) > 1 else ""
        raise DownloadError(f"{errors[0]}{more}") from errors[0]
    return results
