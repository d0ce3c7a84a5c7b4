"""Every environment variable kiln reads, declared once: name, type, default, the values it may
take, whether it changes what a build produces, and what it does (docs/env.md is checked against
this table by a test).

The table is parsed once, as a whole: the first read of any variable parses and validates every
declared variable from os.environ, and later reads return the values of that parse. So a malformed
value is an error on every read, whatever variable the read asks for and whatever path it is on (a
warm cache that never looks at KILN_DISABLE_JIT still refuses KILN_DISABLE_JIT=maybe). `reload()`
forgets the parse: the next read parses the environment again (tests, and long-lived tools that
change os.environ). Nothing is read at import time.

Booleans accept 1/0/true/false/yes/no/on/off (any case); integers are checked against their range,
strings with a fixed set of values against that set (any case), and KILN_CUDA_ARCH_LIST must parse
as an arch list. Anything else is an error that names the variable and the value. Set but empty
means the default. A KILN_* variable that is not declared here (a typo such as KILN_DISABLE_JTI)
is warned about once per process; test-only variables start with KILN_TEST_ and are not.
"""

from __future__ import annotations

import difflib
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .record import Record


class EnvError(ValueError):
    """An environment variable holds a value kiln cannot use."""


class EnvWarning(UserWarning):
    """A KILN_* variable is set that kiln does not know (a typo?)."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "bool" | "int" | "str" | "path"
    default: Any
    doc: str
    # True when the value changes the compiled output; such knobs are part of the cache key.
    affects_build: bool = False
    minimum: int = 0  # "int": the smallest value allowed
    choices: tuple[str, ...] = ()  # "str": the values allowed (any case; "" is the default)
    what: str = "a valid value"  # "str" with choices: how messages call a value ("a level")
    # Further checks of a set value, after parsing: raises an EnvError naming the variable.
    check: Callable[[Any], None] | None = field(default=None, compare=False, repr=False)


def _check_arch_list(value: str) -> None:
    from .arch import check_env_arch_list  # arch.py imports this module

    check_env_arch_list(value)


def _check_api_loglevel(value: int) -> None:
    if value > 5:
        raise EnvError(f"KILN_LOGLEVEL={value} is not a level; use 0 (off), 1 (call names), 3 "
                       "(arguments and outputs) or 5 (also tensor statistics)")


_KNOBS = (
    Knob("KILN_WORKSPACE_BASE", "path", "~/.cache/kiln",
         "Root of the writable workspaces: generated sources, JIT artifacts, locks."),
    Knob("KILN_CUDA_ARCH_LIST", "str", "",
         "CUDA archs to compile for, e.g. '8.0 9.0a' or '8.0;9.0a' or 'sm_90a'. Empty: the "
         "detected GPUs.", check=_check_arch_list),
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
    Knob("KILN_JIT_ASAN", "bool", False,
         "Build host-toolchain modules with AddressSanitizer (-fsanitize=address): a debug build "
         "with its own cache key; loading one needs the ASan runtime preloaded.",
         affects_build=True),
    Knob("KILN_NO_CACHE", "bool", False,
         "Build into a temporary directory and load from there; nothing is reused or kept."),
    Knob("KILN_JIT_LOCK_TIMEOUT", "int", 1800,
         "Seconds to wait for another process's compile of the same module before failing."),
    Knob("KILN_JIT_LOGLEVEL", "str", "INFO",
         "Level of the 'kiln.jit' logger (compiles, cache misses): DEBUG, INFO, WARNING, ERROR.",
         choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), what="a level"),
    # API-call diagnostics (python/kiln/api_logging.py): read once, when kiln is imported.
    Knob("KILN_LOGLEVEL", "int", 0,
         "API logging: 0 off (no overhead), 1 call names, 3 arguments and outputs, 5 also "
         "tensor statistics. Independent of KILN_JIT_LOGLEVEL.", check=_check_api_loglevel),
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
         "tensors there and back. Never for production.", choices=("host", "cuda"),
         what="a backend"),
    Knob("MAX_JOBS", "int", 0,
         "Parallel compile jobs; 0 = min(cores, free memory / (nvcc threads x memory per job))."),
    Knob("KILN_NVCC_THREADS", "int", 1,
         "nvcc --threads per job (parallel gencode compilation); counted in the memory estimate."),
    Knob("KILN_NVCC", "path", "",
         "The nvcc to use. Empty: $CUDA_HOME/bin/nvcc, else nvcc on PATH."),
    Knob("CUDA_HOME", "path", "",
         "CUDA toolkit root (headers, libcudart_static). Empty: derived from nvcc's location."),
    Knob("KILN_VALIDATE_INDICES", "bool", False,
         "After every CUDA call that reads through indices, raise the index errors its kernels "
         "recorded at once (a device sync per call; for diagnosis). Default: kiln.check_errors() "
         "or a later plan() raises them."),
    Knob("KILN_COMM_TIMEOUT", "int", 60,
         "Seconds a kiln.comm collective waits for the other ranks before it raises a "
         "TimeoutError naming them (a rank that died or never called); CustomAllReduce(timeout=) "
         "overrides it.", minimum=1),
    Knob("KILN_PREFILL_FA3_STRICT", "bool", False,
         "Prefill with backend fa3 (or auto on a 9.0 GPU) fails, saying why, where it would fall "
         "back to fa2 (for tests of the sm90a kernel)."),
    # The GEMM autotuner (python/kiln/autotuner.py, docs/gemm.md).
    Knob("KILN_AUTOTUNE_CACHE", "path", "",
         "The GEMM autotuner's cache file: kiln.autotune() without cache= loads and saves it, and "
         "its tuned tactics serve GEMM calls outside any autotune context. Empty: none."),
    Knob("KILN_AUTOTUNE_TIMER", "str", "auto",
         "How the GEMM autotuner times tactics on a GPU: auto (CUDA events, %globaltimer where they "
         "fail), cuda_events or globaltimer.", choices=("auto", "cuda_events", "globaltimer"),
         what="a timer"),
    Knob("KILN_TACTIC_BLOCKLIST", "path", "",
         "A JSON file of GEMM tactics never to time or run (known to hang or crash on a stack), "
         "besides the package's own list."),
    Knob("CXX", "path", "",
         "The host C++ compiler. Empty: c++, else g++ on PATH."),
    # Precompiled modules and the artifact repository (docs/release.md).
    Knob("KILN_SKIP_VERSION_CHECK", "bool", False,
         "Load precompiled modules built for another kiln version, with a warning on every load; "
         "only for a deliberate, diagnosed mixed-version experiment."),
    Knob("KILN_ARTIFACT_DIR", "path", "",
         "A local directory in the artifact-repository layout, searched before installed packages, "
         "the download cache and any download."),
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
         "every use."),
    Knob("KILN_DOWNLOAD_JOBS", "int", 4,
         "Parallel downloads at most; 0 counts as 1."),
    Knob("KILN_DOWNLOAD_TIMEOUT", "int", 30,
         "Seconds a download may wait for the server (to connect, or for any data) before the "
         "attempt fails and is retried; 0 counts as 1."),
    Knob("KILN_DOWNLOAD_DEADLINE", "int", 600,
         "Seconds one file's download may take in all, retries included; then it fails and "
         "releases its lock.", minimum=1),
    Knob("KILN_DOWNLOAD_RETRIES", "int", 3,
         "Retries of a download after a transient failure (timeout, dropped connection, 5xx), with "
         "exponential backoff from 0.5 s."),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _KNOBS}

# KILN_* variables that kiln's scripts read (scripts/dev.sh, scripts/release_check.sh), never the
# library: known, so not warned about. Listed in docs/env.md.
SCRIPT_VARIABLES = {
    "KILN_VENV": "The virtual environment scripts/dev.sh creates and uses (default .venv).",
    "KILN_TORCH_SPEC": "What scripts/dev.sh installs when no torch is present (torch==2.13.0).",
}
TEST_PREFIX = "KILN_TEST_"  # variables of the test suite only

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE or value == "":
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean; use 1/0/true/false/yes/no/on/off")


def get_default(knob: Knob) -> Any:
    if knob.kind == "path" and knob.default:
        return os.path.expanduser(knob.default)
    return knob.default


def _parse(knob: Knob, raw: str | None) -> Any:
    """The value of `knob` when the environment holds `raw` (None: unset); EnvError if invalid."""
    name = knob.name
    if raw is None or raw.strip() == "":  # set but empty means the default
        return get_default(knob)
    if knob.kind == "bool":
        return parse_bool(name, raw)
    if knob.kind == "int":
        try:
            value = int(raw.strip())
        except ValueError:
            raise EnvError(f"{name}={raw!r} is not an integer") from None
        if value < knob.minimum:
            raise EnvError(f"{name}={raw!r} must be >= {knob.minimum}")
    elif knob.kind == "path":
        value = os.path.expanduser(raw.strip())
    else:
        value = raw.strip()
        if knob.choices:
            match = [c for c in knob.choices if c.lower() == value.lower()]
            if not match:
                allowed = " or ".join(repr(c) for c in knob.choices)
                raise EnvError(f"{name}={raw!r} is not {knob.what}; use {allowed}, or leave it "
                               "unset for the default")
            value = match[0]
    if knob.check is not None:
        knob.check(value)
    return value


class Snapshot(Record):
    """One parse of the environment: every declared variable's value, or why it is invalid:
    `values` the valid ones, `errors` the invalid ones, `raw` every declared variable that is set
    (as set), `unknown` the KILN_* variables that are set and not declared."""

    __slots__ = ("values", "errors", "raw", "unknown")

    def __init__(self, values: dict[str, Any], errors: dict[str, EnvError], raw: dict[str, str],
                 unknown: tuple[str, ...]):
        self._init(values, errors, raw, unknown)

    def value(self, name: str) -> Any:
        """The value of `name`; its own error if it is invalid (other variables' are ignored: for
        reports that show every variable, valid or not)."""
        if name in self.errors:
            raise self.errors[name]
        return self.values[name]

    def check(self) -> None:
        """Raise if any declared variable is invalid: its error, naming the others too."""
        if not self.errors:
            return
        first, *rest = self.errors.values()
        if not rest:
            raise first
        more = "; ".join(str(e) for e in rest)
        raise type(first)(f"{first}; also: {more}")


_snapshot: Snapshot | None = None
_lock = threading.Lock()
_warned: set[str] = set()


def _read() -> Snapshot:
    values: dict[str, Any] = {}
    errors: dict[str, EnvError] = {}
    raw: dict[str, str] = {}
    environ = dict(os.environ)
    for knob in _KNOBS:
        text = environ.get(knob.name)
        if text is not None:
            raw[knob.name] = text
        try:
            values[knob.name] = _parse(knob, text)
        except EnvError as e:
            errors[knob.name] = e
    unknown = tuple(sorted(n for n in environ if n.startswith("KILN_") and n not in KNOBS
                           and n not in SCRIPT_VARIABLES and not n.startswith(TEST_PREFIX)))
    return Snapshot(values, errors, raw, unknown)


def _warn_unknown(snap: Snapshot) -> None:
    for name in snap.unknown:
        if name in _warned:
            continue
        _warned.add(name)
        close = difflib.get_close_matches(name, list(KNOBS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(f"kiln: {name} is set but is not a kiln variable, so it does nothing"
                      f"{hint} (docs/env.md lists them all)", EnvWarning, stacklevel=4)


def snapshot() -> Snapshot:
    """The parse of the environment (made now if there is none yet). Never raises for a bad
    value: `check()` or `get()` does."""
    global _snapshot
    snap = _snapshot
    if snap is None:
        with _lock:
            if _snapshot is None:
                _snapshot = _read()
                _warn_unknown(_snapshot)
            snap = _snapshot
    return snap


def reload() -> None:
    """Forget the parsed environment: the next read parses (and validates) os.environ again. For
    tests and long-lived tools that change the environment after kiln first read it."""
    global _snapshot
    with _lock:
        _snapshot = None


def get(name: str) -> Any:
    """The value of a declared knob, parsed to its type (its default when unset). EnvError when
    any declared variable holds a value kiln cannot use."""
    snap = snapshot()
    if snap.errors:
        snap.check()
    return snap.values[KNOBS[name].name]


def build_affecting() -> dict[str, Any]:
    """The knobs that change compiled output, with their current values (part of the cache key)."""
    return {k.name: get(k.name) for k in _KNOBS if k.affects_build}


def non_default() -> dict[str, str]:
    """Every declared knob that is set to something other than its default (for reports)."""
    snap = snapshot()
    snap.check()
    return {name: text for name, text in snap.raw.items()
            if snap.values[name] != get_default(KNOBS[name])}
