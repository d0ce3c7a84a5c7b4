"""The artifact repository against a real HTTP server on 127.0.0.1 started by each test
(nothing of the download code is mocked): a good download, a tampered file and manifest, a
truncated file, a dropped connection, 404, a slow server and the timeout, a mirror, offline mode,
concurrent downloaders, bounded parallelism, the local artifact directory, and prefetching."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import toy_spec
from precompiled_helpers import build_toy_release, host_release, write_pins

from kiln.runtime import artifacts, jit, precompiled
from kiln.runtime.artifacts import ArtifactError
from kiln.runtime.workspace import Workspace

NAMES = ("toy_module", "toy_two", "toy_three", "toy_four")


class Repository:
    """A directory served over HTTP, with per-path misbehaviour and request accounting."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: collections.Counter = collections.Counter()
        # path suffix -> "404" | "tamper" | "truncate" | "drop_once" | "slow" | "trickle"
        self.rules: dict[str, str] = {}
        self.delay = 0.0
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        repo = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with repo.lock:
                    repo.requests[self.path] += 1
                    count = repo.requests[self.path]
                    repo.active += 1
                    repo.max_active = max(repo.max_active, repo.active)
                try:
                    repo.serve(self, count)
                finally:
                    with repo.lock:
                        repo.active -= 1

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def rule(self, path: str) -> str | None:
        return next((r for suffix, r in self.rules.items() if path.endswith(suffix)), None)

    def serve(self, h: BaseHTTPRequestHandler, count: int) -> None:
        rule = self.rule(h.path)
        time.sleep(self.delay)
        if rule == "slow":
            time.sleep(5)
        f = self.root / h.path.lstrip("/")
        if rule == "404" or not f.is_file():
            h.send_error(404)
            return
        data = f.read_bytes()
        if rule == "tamper":
            at = data.find(b"GCC: (")
            at = at + 5 if at >= 0 else len(data) // 2
            data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
        if rule == "truncate":
            data = data[: len(data) // 2]
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if rule == "drop_once" and count == 1:
            h.wfile.write(data[: len(data) // 3])  # then the connection closes
            return
        if rule == "trickle":  # a byte every 20 ms: never idle for a whole timeout
            try:
                for i in range(len(data)):
                    h.wfile.write(data[i:i + 1])
                    time.sleep(0.02)
            except OSError:
                pass  # the client gave up
            return
        h.wfile.write(data)

    def file_requests(self) -> int:
        return sum(n for p, n in self.requests.items() if p.endswith(".so"))

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Four toy modules staged as the host release of this kiln version, under <root>/repo."""
    root = tmp_path_factory.mktemp("artifact-release")
    toy, staged = build_toy_release(root, NAMES)
    return toy, root / "repo", staged


@pytest.fixture
def env(release, tmp_path, kiln_env):
    """A fresh workspace (so an empty download cache), the release pinned, quick retries."""
    kiln_env.set("KILN_WORKSPACE_BASE", str(tmp_path / "ws"))
    kiln_env.set("KILN_ARTIFACT_PINS", str(write_pins(tmp_path / "pins.json", release[2])))
    kiln_env.set("KILN_DOWNLOAD_TIMEOUT", "1")
    kiln_env.set("KILN_DOWNLOAD_RETRIES", "1")
    kiln_env.set("KILN_DISABLE_JIT", "1")  # every module must come from the repository
    for knob in ("KILN_ARTIFACT_DIR", "KILN_ARTIFACT_REPOSITORY", "KILN_OFFLINE",
                 "KILN_VERIFY_CHECKSUMS"):
        kiln_env.unset(knob)
    jit.clear_memory_cache()
    precompiled.installed_packages.cache_clear()
    yield Workspace(tmp_path / "ws")
    jit.clear_memory_cache()


@pytest.fixture
def repo(release, env, kiln_env):
    r = Repository(release[1])
    kiln_env.set("KILN_ARTIFACT_REPOSITORY", r.url)
    yield r
    r.close()


def load(release, name="toy_module"):
    return jit.load(toy_spec(release[0], name=name))


def test_a_good_download_is_verified_cached_and_reused(release, repo, env):
    hits = jit.stats.precompiled_hits
    assert load(release).answer() == 42
    assert jit.stats.precompiled_hits == hits + 1
    assert repo.file_requests() == 1 and len(repo.requests) == 2  # the manifest and one module
    cached = host_release().dir_in(env.downloads)
    assert (cached / "manifest.json").is_file() and list(cached.glob("toy_module/*.so"))
    assert not list(cached.rglob("*.part"))  # nothing half-written left behind
    jit.clear_memory_cache()
    assert load(release).answer() == 42  # a new process would find it in the cache
    assert sum(repo.requests.values()) == 2


def test_a_file_url_repository_works_the_same(release, env, kiln_env):
    kiln_env.set("KILN_ARTIFACT_REPOSITORY", release[1].as_uri())
    assert load(release).answer() == 42


def test_a_tampered_file_is_refused_and_not_kept(release, repo, env):
    repo.rules[".so"] = "tamper"
    with pytest.raises(ArtifactError) as e:
        load(release)
    msg = str(e.value)
    assert "toy_module" in msg and repo.url in msg
    assert "(tampered or corrupt); refusing it" in msg
    assert not list(env.downloads.rglob("*.so")) and not list(env.downloads.rglob("*.part"))
    assert repo.file_requests() == 1  # a checksum mismatch is not retried


def test_a_tampered_manifest_is_refused_by_the_pin(release, repo, env):
    repo.rules["manifest.json"] = "tamper"
    with pytest.raises(ArtifactError, match=r"manifest .*expected .*\(tampered or corrupt\)"):
        load(release)
    assert repo.file_requests() == 0


def test_a_truncated_file_is_refused(release, repo, env):
    repo.rules[".so"] = "truncate"
    with pytest.raises(ArtifactError, match=r"has \d+ bytes, the manifest says \d+ \(truncated"):
        load(release)


def test_a_dropped_connection_is_retried(release, repo, env):
    repo.rules[".so"] = "drop_once"
    assert load(release).answer() == 42
    assert repo.file_requests() == 2


def test_404_is_a_hard_error_naming_the_url_and_not_retried(release, repo, env):
    repo.rules[".so"] = "404"
    with pytest.raises(ArtifactError) as e:
        load(release)
    assert "HTTP 404" in str(e.value) and f"{repo.url}/{host_release().path}/toy_module/" in str(e.value)
    assert repo.file_requests() == 1


def test_a_slow_server_times_out_after_the_retries_never_hangs(release, repo, env):
    repo.rules[".so"] = "slow"
    start = time.monotonic()
    with pytest.raises(ArtifactError, match=r"after 2 attempt\(s\).*(timed out|TimeoutError)"):
        load(release)
    assert time.monotonic() - start < 4.5  # 1 s timeout, 0.5 s backoff, 1 s timeout
    assert repo.file_requests() == 2


def test_a_trickling_server_hits_the_overall_deadline_and_releases_the_lock(release, repo, env,
                                                                            kiln_env):
    """The timeout bounded each read only: a server sending a byte a second kept a 228 KB
    download, and its lock, going for about 63 hours."""
    from kiln.runtime.lock import ModuleLock

    repo.rules[".so"] = "trickle"
    kiln_env.set(KILN_DOWNLOAD_DEADLINE="2", KILN_DOWNLOAD_TIMEOUT="1")
    start = time.monotonic()
    with pytest.raises(ArtifactError, match=r"gave up on .*toy_module.* after 2s \(\d+ of \d+ bytes "
                                            r"received\): KILN_DOWNLOAD_DEADLINE=2"):
        load(release)
    assert time.monotonic() - start < 4  # the deadline, plus at most one wait for data
    assert repo.file_requests() == 1  # never retried past the deadline
    locks = [ModuleLock(path, "the download") for path in env.downloads.rglob(".*.lock")]
    assert locks and all(lock.try_acquire() for lock in locks)  # nobody holds them
    for lock in locks:
        lock.release()
    assert not list(env.downloads.rglob("*.part")) and not list(env.downloads.rglob("*.so"))


def test_a_mirror_replaces_the_repository(release, env, kiln_env):
    primary, mirror = Repository(release[1]), Repository(release[1])
    try:
        kiln_env.set("KILN_ARTIFACT_REPOSITORY", mirror.url)
        assert load(release).answer() == 42
        assert sum(primary.requests.values()) == 0 and mirror.file_requests() == 1
    finally:
        primary.close()
        mirror.close()


def test_offline_a_missing_artifact_is_a_hard_error_naming_it(release, repo, env, kiln_env):
    kiln_env.set("KILN_OFFLINE", "1")
    kiln_env.unset("KILN_DISABLE_JIT")  # even with the JIT allowed: no silent fallback
    with pytest.raises(ArtifactError) as e:
        load(release)
    msg = str(e.value)
    assert "toy_module" in msg and "KILN_OFFLINE=1" in msg and str(env.downloads) in msg
    assert f"{repo.url}/{host_release().path}" in msg and "python -m kiln download" in msg
    assert sum(repo.requests.values()) == 0


def test_unreachable_network_is_a_hard_error_too(release, env, kiln_env):
    kiln_env.set("KILN_ARTIFACT_REPOSITORY", "http://127.0.0.1:9")  # nothing listens
    kiln_env.unset("KILN_DISABLE_JIT")
    kiln_env.set("KILN_DOWNLOAD_RETRIES", "0")
    with pytest.raises(ArtifactError, match="toy_module .*could not download .*after 1 attempt"):
        load(release)


def test_an_unpinned_release_is_never_downloaded(release, repo, env, kiln_env, tmp_path):
    (tmp_path / "empty-pins.json").write_text("{}")
    kiln_env.set("KILN_ARTIFACT_PINS", str(tmp_path / "empty-pins.json"))
    with pytest.raises(jit.JITDisabledError, match="this kiln pins no release"):
        load(release)
    assert sum(repo.requests.values()) == 0


def test_checksums_off_uses_unpinned_artifacts_with_a_warning_every_time(release, repo, env,
                                                                         kiln_env, tmp_path,
                                                                         caplog):
    import logging

    (tmp_path / "empty-pins.json").write_text("{}")
    kiln_env.set("KILN_ARTIFACT_PINS", str(tmp_path / "empty-pins.json"))
    kiln_env.set("KILN_VERIFY_CHECKSUMS", "0")
    logging.getLogger("kiln.jit").propagate = True
    try:
        with caplog.at_level(logging.WARNING, logger="kiln.jit"):
            for _ in range(2):
                assert load(release).answer() == 42
                jit.clear_memory_cache()
    finally:
        logging.getLogger("kiln.jit").propagate = False
    # One record may reach caplog through more than one handler (pytest versions differ).
    texts = [r.getMessage() for r in {id(r): r for r in caplog.records}.values()]
    assert sum("without checking its SHA-256" in t for t in texts) == 2
    assert sum("without checking it against a pinned digest" in t for t in texts) >= 2


def test_concurrent_downloaders_fetch_the_artifact_once(release, repo, env, tmp_path):
    go = tmp_path / "go"
    # kiln.runtime alone: it imports no torch (four processes on a two-core CI machine).
    script = (
        "import time, sys; from pathlib import Path\n"
        "from kiln.runtime import jit\n"
        "from kiln.runtime.spec import CompileSpec, Unit\n"
        f"toy = Path({str(release[0])!r})\n"
        "spec = CompileSpec(name='toy_module', uri='toy_module', toolchain='host',\n"
        "    units=(Unit('toy.cc', 'cxx'),), inputs=(toy / 'toy.cc',),\n"
        "    include_dirs=(str(toy / 'include'),), cxx_flags=('-O0', '-fPIC', '-fvisibility=hidden'),\n"
        "    label='//tests:toy')\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        "print(jit.load(spec).answer())\n"
    )
    repo.delay = 0.3  # keep the first download in flight while the others arrive
    environ = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=environ) for _ in range(4)]
    time.sleep(1.0)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "42"
    assert repo.file_requests() == 1
    assert sum(n for p, n in repo.requests.items() if p.endswith("manifest.json")) == 1


def test_prefetch_downloads_everything_bounded_and_then_works_offline(release, repo, env,
                                                                     kiln_env):
    repo.delay = 0.3
    kiln_env.set("KILN_DOWNLOAD_JOBS", "2")
    result = artifacts.prefetch(host_release(), repo.url)
    assert (result.downloaded, result.present) == (len(NAMES), 0)
    assert repo.max_active == 2  # four files, two at a time
    again = artifacts.prefetch(host_release(), repo.url)
    assert (again.downloaded, again.present) == (0, len(NAMES))
    kiln_env.set("KILN_OFFLINE", "1")
    assert all(load(release, n).answer() == 42 for n in NAMES)
    assert repo.file_requests() == len(NAMES)


def test_the_download_command_fills_an_artifact_dir_that_is_searched_first(release, repo, env,
                                                                           tmp_path, kiln_env):
    dest = tmp_path / "mirror"
    proc = subprocess.run([sys.executable, "-m", "kiln", "download", "--toolchain", "host",
                           "--dest", str(dest)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert f"{len(NAMES)} file(s) downloaded" in proc.stdout
    assert "downloading toy_module" in proc.stderr  # progress is shown
    served = sum(repo.requests.values())
    kiln_env.set("KILN_ARTIFACT_DIR", str(dest))
    assert load(release).answer() == 42
    assert sum(repo.requests.values()) == served  # the local directory came first


def test_a_tampered_artifact_dir_is_refused_like_a_download(release, repo, env, tmp_path,
                                                            kiln_env):
    artifacts.prefetch(host_release(), repo.url, tmp_path / "dir")
    lib = next(host_release().dir_in(tmp_path / "dir").glob("toy_module/*.so"))
    lib.write_bytes(lib.read_bytes()[:-1] + b"\1")
    kiln_env.set("KILN_ARTIFACT_DIR", str(tmp_path / "dir"))
    with pytest.raises(precompiled.PrecompiledError, match="corrupt or tampered"):
        load(release)


def test_download_command_errors_name_what_to_do(env, monkeypatch):
    proc = subprocess.run([sys.executable, "-m", "kiln", "download", "--toolchain", "host"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1
    assert "set KILN_ARTIFACT_REPOSITORY or pass --repository" in proc.stderr
