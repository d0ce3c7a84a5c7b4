"""Every environment variable kiln reads, declared once: name, type, default, whether it changes
what a build produces, and what it does (docs/env.md is checked against this table by a test).

Values are read from os.environ on every call (cheap) so tests and long-lived processes see
changes; nothing is read at import time. Booleans accept 1/0/true/false/yes/no/on/off (any case);
anything else is an error that names the variable and the value. Set but empty means the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


class EnvError(ValueError):
    """An environment variable holds a value kiln cannot use."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "bool" | "int" | "str" | "path"
    default: Any
    doc: str
    # True when the value changes the compiled output; such knobs are part of the cache key.
    affects_build: bool = False


_KNOBS = (
    Knob("KILN_WORKSPACE_BASE", "path", "~/.cache/kiln",
         "Root of the writable workspaces: generated sources, JIT artifacts, locks."),
    Knob("KILN_CUDA_ARCH_LIST", "str", "",
         "CUDA archs to compile for, e.g. '8.0 9.0a' or '8.0;9.0a' or 'sm_90a'. Empty: the "
         "detected GPUs."),
    Knob("KILN_DISABLE_JIT", "bool", False,
         "Never compile: a module must come from the in-process, precompiled or disk cache, else "
         "a clear error names it."),
    Knob("KILN_JIT_VERBOSE", "bool", False,
         "Stream the compiler's output while building. Does not change the build."),
    Knob("KILN_JIT_DEBUG", "bool", False,
         "Debug build (-O0 -g, device -G): a separate build with its own cache key.",
         affects_build=True),
    Knob("KILN_JIT_LINEINFO", "bool", False,
         "Add -lineinfo to device code for profilers and sanitizers (own cache key).",
         affects_build=True),
    Knob("KILN_NO_CACHE", "bool", False,
         "Build into a temporary directory and load from there; nothing is reused or kept."),
    Knob("KILN_JIT_LOCK_TIMEOUT", "int", 1800,
         "Seconds to wait for another process's compile of the same module before failing."),
    Knob("KILN_JIT_LOGLEVEL", "str", "INFO",
         "Level of the 'kiln.jit' logger (compiles, cache misses): DEBUG, INFO, WARNING, ERROR."),
    # API-call diagnostics (python/kiln/api_logging.py): read once, when kiln is imported.
    Knob("KILN_LOGLEVEL", "int", 0,
         "API logging: 0 off (no overhead), 1 call names, 3 arguments and outputs, 5 also "
         "tensor statistics. Independent of KILN_JIT_LOGLEVEL."),
    Knob("KILN_LOGDEST", "str", "stderr",
         "Where API-log records go: stdout, stderr, or a file path ('%p' becomes the process id)."),
    Knob("KILN_DUMP", "bool", False,
         "Dump each logged call's input tensors (before) and outputs (after) to KILN_DUMP_DIR."),
    Knob("KILN_DUMP_DIR", "path", "",
         "The dedicated directory for dumps (created 0700); required by KILN_DUMP=1."),
    Knob("KILN_DUMP_MAX_COUNT", "int", 1000,
         "At most this many calls are dumped per process."),
    Knob("KILN_DUMP_MAX_BYTES", "int", 10 * 2**30,
         "At most this many bytes of tensor data are dumped per process."),
    Knob("KILN_DUMP_INCLUDE", "str", "",
         "Comma-separated fnmatch patterns of API names that are dumped and logged in detail "
         "(level >= 3); empty: all."),
    Knob("KILN_DUMP_EXCLUDE", "str", "",
         "Comma-separated fnmatch patterns of API names that are never dumped nor logged in detail."),
    Knob("KILN_FORCE_BACKEND", "str", "",
         "Diagnostic control: run every kiln call on this backend ('host' or 'cuda'), copying "
         "tensors there and back. Never for production."),
    Knob("MAX_JOBS", "int", 0,
         "Parallel compile jobs; 0 = min(cores, free memory / (nvcc threads x memory per job))."),
    Knob("KILN_NVCC_THREADS", "int", 1,
         "nvcc --threads per job (parallel gencode compilation); counted in the memory estimate."),
    Knob("KILN_NVCC", "path", "",
         "The nvcc to use. Empty: $CUDA_HOME/bin/nvcc, else nvcc on PATH."),
    Knob("CUDA_HOME", "path", "",
         "CUDA toolkit root (headers, libcudart_static). Empty: derived from nvcc's location."),
    Knob("KILN_VALIDATE_INDICES", "bool", False,
         "Check paged-KV page indices against the cache size on every run (a device sync; for "
         "diagnosis)."),
    Knob("KILN_PREFILL_FA3_STRICT", "bool", False,
         "Prefill with backend fa3 (or auto on a 9.0 GPU) fails, saying why, where it would fall "
         "back to fa2 (for tests of the sm90a kernel)."),
    Knob("CXX", "path", "",
         "The host C++ compiler. Empty: c++, else g++ on PATH."),
    # Precompiled modules and the artifact repository (docs/release.md).
    Knob("KILN_SKIP_VERSION_CHECK", "bool", False,
         "Load precompiled modules built for another kiln version, with a warning on every load; "
         "only for a deliberate, diagnosed mixed-version experiment (R5.15)."),
    Knob("KILN_ARTIFACT_DIR", "path", "",
         "A local directory in the artifact-repository layout, searched before installed packages, "
         "the download cache and any download (R7.6)."),
    Knob("KILN_ARTIFACT_REPOSITORY", "str", "",
         "Base URL (https://, http:// or file://) of the artifact repository to download "
         "precompiled modules from. Empty: nothing is ever downloaded."),
    Knob("KILN_ARTIFACT_PINS", "path", "",
         "A JSON file of extra pinned manifest digests ('<version>/<tag>/<abi>': sha256), for "
         "releases this kiln does not pin itself (a private mirror's own builds)."),
    Knob("KILN_OFFLINE", "bool", False,
         "Never download: an artifact that would have to be downloaded is a hard error naming it "
         "and where it was looked for."),
    Knob("KILN_VERIFY_CHECKSUMS", "bool", True,
         "Verify manifest pins and file SHA-256 sums. 0 is a debugging aid only and warns on "
         "every use (R7.4)."),
    Knob("KILN_DOWNLOAD_JOBS", "int", 4,
         "Parallel downloads at most (R7.5); 0 counts as 1."),
    Knob("KILN_DOWNLOAD_TIMEOUT", "int", 30,
         "Seconds a download may wait for the server (to connect, or between two reads) before the "
         "attempt fails and is retried."),
    Knob("KILN_DOWNLOAD_RETRIES", "int", 3,
         "Retries of a download after a transient failure (timeout, dropped connection, 5xx), with "
         "exponential backoff from 0.5 s."),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _KNOBS}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE or value == "":
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean; use 1/0/true/false/yes/no/on/off")


def get(name: str) -> Any:
    """The current value of a declared knob, parsed to its type (its default when unset)."""
    knob = KNOBS[name]
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":  # set but empty means the default
        return os.path.expanduser(knob.default) if knob.kind == "path" and knob.default else (
            knob.default)
    if knob.kind == "bool":
        return parse_bool(name, raw)
    if knob.kind == "int":
        try:
            value = int(raw.strip())
        except ValueError:
            raise EnvError(f"{name}={raw!r} is not an integer") from None
        if value < 0:
            raise EnvError(f"{name}={raw!r} must be >= 0")
        return value
    if knob.kind == "path":
        return os.path.expanduser(raw.strip())
    return raw.strip()


def build_affecting() -> dict[str, Any]:
    """The knobs that change compiled output, with their current values (part of the cache key)."""
    return {k.name: get(k.name) for k in _KNOBS if k.affects_build}


def non_default() -> dict[str, str]:
    """Every declared knob that is set to something other than its default (for reports)."""
    out = {}
    for knob in _KNOBS:
        raw = os.environ.get(knob.name)
        if raw is not None and get(knob.name) != get_default(knob):
            out[knob.name] = raw
    return out


def get_default(knob: Knob) -> Any:
    if knob.kind == "path" and knob.default:
        return os.path.expanduser(knob.default)
    return knob.default
