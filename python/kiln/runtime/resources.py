"""How many compile jobs to run at once without running out of memory.

    jobs = min(cores, available memory / (compiler threads per job x memory per thread))

MAX_JOBS overrides the result; KILN_NVCC_THREADS sets nvcc's --threads (parallel gencode passes).
The memory per thread is an estimate from measured peak RSS of kiln's heaviest units (a CUDA unit
with several arch targets, a pybind11 binding); `python -m kiln.codegen explain` prints the estimate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import env

GIB = 1 << 30
# Peak resident memory of one compiler thread, rounded up (docs/architecture.md, "Compile
# resources"): nvcc's cicc/ptxas on an attention unit ~1.2 GiB; g++ on a pybind11 unit ~0.5 GiB.
MEM_PER_THREAD = {"cuda": int(1.5 * GIB), "host": int(0.75 * GIB),
                  "triton": int(1.0 * GIB)}  # a triton child: its LLVM and one kernel at a time


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (bytes); a large number when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 60


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass(frozen=True)
class JobEstimate:
    jobs: int
    nvcc_threads: int
    reason: str


def estimate_jobs(toolchain: str = "cuda") -> JobEstimate:
    threads = max(1, env.get("KILN_NVCC_THREADS")) if toolchain == "cuda" else 1
    override = env.get("MAX_JOBS")
    if override:
        return JobEstimate(override, threads, f"MAX_JOBS={override}")
    n_cores = cores()
    mem = available_memory()
    per_job = threads * MEM_PER_THREAD[toolchain]
    by_memory = max(1, mem // per_job)
    jobs = max(1, min(n_cores, by_memory))
    reason = (
        f"min({n_cores} cores, {mem / GIB:.1f} GiB available / ({threads} thread(s) x "
        f"{MEM_PER_THREAD[toolchain] / GIB:.2f} GiB per {toolchain} thread) = {by_memory}) = {jobs}"
    )
    return JobEstimate(jobs, threads, reason)
