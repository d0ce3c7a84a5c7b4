"""Building many modules at once, with the JIT's memory-bounded parallelism: shared by
`python -m kiln.codegen build` and `python -m release build`.

The job budget (-j, else runtime/resources.py's estimate from cores and free memory) is split
between modules built side by side; each module's ninja gets its share. Every module is attempted;
failures are reported together at the end.
"""

from __future__ import annotations

import concurrent.futures as futures
import sys
import threading
import time
from collections.abc import Callable

from kiln.runtime import jit, resources
from kiln.runtime.arch import ArchContext
from kiln.runtime.spec import CompileSpec
from kiln.runtime.workspace import Workspace


class BuildFailed(RuntimeError):
    pass


def build_all(specs: list[CompileSpec], ctx: ArchContext, *, toolchain: str, jobs: int = 0,
              force: bool = False, workspace: Workspace | None = None,
              say: Callable[[str], None] = lambda s: print(s, flush=True)) -> dict[str, str]:
    """Build every spec into the disk cache; {module: "built" | "cached"}. `jobs` 0: the
    estimate; `force`: every unit of every module recompiles. BuildFailed names the modules that
    failed after each one's error went to stderr."""
    if jobs < 0:
        raise ValueError(f"jobs must be 0 (the estimate from cores and free memory) or positive, "
                         f"got {jobs}")
    est = resources.estimate_jobs(toolchain)
    total_jobs = jobs or est.jobs
    workers = max(1, min(total_jobs, len(specs)))
    per_module = max(1, total_jobs // workers)
    say(f"{total_jobs} job(s) ({'-j' if jobs else est.reason})")
    results: dict[str, str] = {}
    running: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()

    def one(spec: CompileSpec) -> tuple[str, str, float]:
        start = time.monotonic()
        with lock:
            running[spec.name] = start
        try:
            status, _ = jit.build(spec, ctx, workspace=workspace, jobs=per_module, force=force,
                                  quiet=True)
            return spec.name, status, time.monotonic() - start
        finally:
            with lock:
                running.pop(spec.name, None)

    def ticker():
        while not done.wait(15):
            with lock:
                busy = ", ".join(f"{n} ({time.monotonic() - s:.0f}s)" for n, s in running.items())
            if busy:
                say(f"  still compiling: {busy}")

    threading.Thread(target=ticker, daemon=True).start()
    failures = []
    try:
        with futures.ThreadPoolExecutor(max_workers=workers) as pool:
            jobs_ = {pool.submit(one, s): s for s in specs}
            for i, fut in enumerate(futures.as_completed(jobs_), 1):
                spec = jobs_[fut]
                try:
                    name, status, secs = fut.result()
                    results[name] = status
                    say(f"[{i}/{len(specs)}] {status:<6} {name} ({secs:.1f}s)")
                except Exception as e:  # report every failure, then fail the command
                    results[spec.name] = "failed"
                    failures.append((spec.name, e))
                    say(f"[{i}/{len(specs)}] FAILED {spec.name}")
    finally:
        done.set()
    for name, e in failures:
        print(f"\n--- {name} ---\n{e}", file=sys.stderr)
    counts = {k: list(results.values()).count(k) for k in ("built", "cached", "failed")}
    say(f"summary: {counts['built']} built, {counts['cached']} cached, {counts['failed']} failed")
    if failures:
        raise BuildFailed(f"{len(failures)} of {len(specs)} module(s) failed to build: "
                          f"{', '.join(n for n, _ in failures)}")
    return results
