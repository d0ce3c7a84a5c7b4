"""A loaded triton module: its kernels' cubins (verified) and launch metadata, launched through
the CUDA driver API with no triton on the hot path.

`TritonModule.from_slot` reads a published cache slot (runtime/build.py) after the slot verified:
the launch metadata (the module's "library") and each cubin, whose bytes must match the SHA-256
the launch metadata records, or nothing is returned. `from_bundle` reads the one-file form that
release packages ship. Neither touches a GPU or imports triton: a CPU process can load and inspect
a module.

Launching: `module.kernel(entry)` is a `TritonKernel` launcher; `launcher(grid, *args,
stream=...)` picks the cubin for the current device's arch (runs_on; an "a" cubin only on its own
capability), loads it into the current CUDA context once (cuModuleLoadData, cuModuleGetFunction,
and the dynamic shared-memory opt-in above 48 KiB), and calls cuLaunchKernel with the arguments
packed in the order triton compiled them: the non-constexpr arguments, then the global and
profile scratch pointers (null: kernels that need scratch are refused at load). Pointers are
passed as integers (a tensor's data_ptr()), the caller (the op's Python API) having validated
shapes, dtypes and devices. The argument buffer (one 8-byte slot per argument) and the pointer
array cuLaunchKernel reads are built once per launcher; a call packs every value into it with one
struct.pack_into, which also refuses a value that does not fit its type (a ValueError naming the
argument, never a truncated launch), then makes one ctypes call (benchmarks/triton_overhead.py
measures it against an nvcc module of the same arity, and with --host-only the Python cost on a
machine with no GPU). An argument compiled with a ":16" hint is checked to be a multiple of 16
before the launch.

Contexts: `launcher(..., device=i)` (what kiln's ops pass: the tensors' device index) launches in
device i's primary context, the one torch and the CUDA runtime use, whatever the calling thread
has current. The primary context is retained once per device (cuDevicePrimaryCtxRetain, held for
the process's life); each call reads the current context (cuCtxGetCurrent, the launcher's lookup
key anyway) and, when it is not that one (a thread that never touched the GPU has none; another
device's), pushes the primary context for the module load and the launch and pops it after, so the
caller's current context, and so torch's current device, are left as they were. Without `device`
the launch goes to the current context, and a thread with none gets NoCudaContext.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from .arch import Arch, parse_arch, runs_on
from .key import file_digest

BUNDLE_FORMAT = 1
_CTYPES = {
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "fp32": ctypes.c_float,
}
# Each argument's struct code in its 8-byte slot ("=": standard sizes, no implicit padding);
# pointers are unsigned 64-bit integers (a tensor's data_ptr()).
_PACK = {"i32": "i4x", "u32": "I4x", "i64": "q", "u64": "Q", "fp32": "f4x"}
_POINTER_PACK = "Q"
_SLOT = 8
_SMEM_DEFAULT = 48 * 1024
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class TritonLoadError(RuntimeError):
    """A triton module's files do not verify, or one of its kernels cannot be launched here."""


class CudaDriverError(RuntimeError):
    pass


class NoCudaContext(CudaDriverError):
    """The calling thread has no current CUDA context (it never touched the device)."""


@dataclass(frozen=True)
class Cubin:
    """One compiled kernel for one arch: its SASS and launch metadata."""

    entry: str
    arch: Arch
    data: bytes
    launch: dict  # runtime/triton_build.py LAUNCH_FIELDS, params, arch, cubin name and digest

    @property
    def name(self) -> str:
        return self.launch["name"]

    @functools.cached_property
    def shared(self) -> int:
        return int(self.launch["shared"])

    @functools.cached_property
    def block(self) -> int:
        return 32 * int(self.launch["num_warps"])

    def resources(self) -> dict:
        """What `inspect` shows: kernel name, shared memory, warps, stages, size."""
        return {
            "name": self.entry,  # its name in the module
            "kernel": self.name,  # the @triton.jit function's
            "arch": str(self.arch),
            "shared_bytes": self.shared,
            "num_warps": self.launch["num_warps"],
            "num_stages": self.launch["num_stages"],
            "cubin_bytes": len(self.data),
            "cubin_sha256": self.launch["cubin_sha256"],
        }


def _check_launchable(c: Cubin, where: str) -> None:
    if c.launch.get("global_scratch_size") or c.launch.get("profile_scratch_size"):
        raise TritonLoadError(
            f"{where}: kernel {c.entry} needs triton global/profile scratch "
            "memory, which kiln's launcher does not allocate"
        )
    if (
        int(c.launch.get("num_ctas", 1)) != 1
        or c.launch.get("launch_cooperative_grid")
        or c.launch.get("launch_pdl")
    ):
        raise TritonLoadError(
            f"{where}: kernel {c.entry} needs clusters, a cooperative grid or "
            "PDL, which kiln's launcher does not support"
        )
    for name, ty, *_ in c.launch["params"]:
        if not ty.startswith("*") and ty not in _CTYPES:
            raise TritonLoadError(
                f"{where}: kernel {c.entry} argument {name} has type {ty}, "
                f"which kiln cannot pack (pointers and {', '.join(_CTYPES)})"
            )


class TritonModule:
    """The kernels of one triton module; see the module docstring."""

    def __init__(self, name: str, cubins: list[Cubin], where: str):
        self.name = name
        self.where = where
        self.cubins: dict[str, list[Cubin]] = {}
        for c in cubins:
            _check_launchable(c, where)
            self.cubins.setdefault(c.entry, []).append(c)
        self._launchers: dict[str, TritonKernel] = {}

    @property
    def entries(self) -> list[str]:
        return sorted(self.cubins)

    def kernel(self, entry: str) -> TritonKernel:
        launcher = self._launchers.get(entry)
        if launcher is None:
            if entry not in self.cubins:
                raise KeyError(f"{self.name} has no kernel {entry!r}; it has {self.entries}")
            launcher = self._launchers.setdefault(entry, TritonKernel(self, entry))
        return launcher

    def resources(self) -> list[dict]:
        return [c.resources() for e in self.entries for c in self.cubins[e]]

    @classmethod
    def from_library(cls, name: str, library: dict, read, where: str) -> TritonModule:
        """From the launch metadata `library` and `read(cubin file name) -> bytes`; each cubin's
        bytes are checked against the digest the (verified) launch metadata records."""
        cubins = []
        for entry, per_arch in sorted(library["kernels"].items()):
            for arch, launch in sorted(per_arch.items()):
                data = read(launch["cubin"])
                if (
                    len(data) != launch["cubin_size"]
                    or hashlib.sha256(data).hexdigest() != launch["cubin_sha256"]
                ):
                    raise TritonLoadError(
                        f"{where}: {launch['cubin']} does not match the digest "
                        "its launch metadata records (corrupt or replaced)"
                    )
                cubins.append(Cubin(entry, parse_arch(arch), data, launch))
        return cls(name, cubins, where)

    @classmethod
    def from_slot(cls, name: str, key_dir: Path, library_file: str) -> TritonModule:
        path = Path(key_dir) / library_file
        library = json.loads(path.read_bytes())
        return cls.from_library(name, library, lambda f: (Path(key_dir) / f).read_bytes(), str(path))

    @classmethod
    def from_bundle(cls, name: str, path: Path) -> TritonModule:
        """The one-file form of a release package: {"format", "library", "cubins": {file: hex}}."""
        d = json.loads(Path(path).read_bytes())
        if d.get("format") != BUNDLE_FORMAT or d.get("library", {}).get("module") != name:
            raise TritonLoadError(f"{path} is not a triton bundle of {name}")
        cubins = d["cubins"]
        return cls.from_library(name, d["library"], lambda f: bytes.fromhex(cubins[f]), str(path))


def bundle(key_dir: Path, library_file: str) -> bytes:
    """The one-file form of the published module in `key_dir` (for release packages)."""
    library = json.loads((Path(key_dir) / library_file).read_bytes())
    cubins = {}
    for per_arch in library["kernels"].values():
        for launch in per_arch.values():
            f = launch["cubin"]
            if file_digest(Path(key_dir) / f) != launch["cubin_sha256"]:
                raise TritonLoadError(f"{key_dir / f} does not match its recorded digest")
            cubins[f] = (Path(key_dir) / f).read_bytes().hex()
    return json.dumps(
        {"format": BUNDLE_FORMAT, "library": library, "cubins": cubins}, sort_keys=True
    ).encode()


# ---- the driver ---------------------------------------------------------------------------------

_driver = None
_driver_lock = threading.Lock()


def driver() -> ctypes.CDLL:
    global _driver
    with _driver_lock:
        if _driver is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaDriverError(
                    f"the CUDA driver (libcuda.so.1) is not available: {e}; "
                    "a triton kernel needs a GPU (its CPU backend is the host "
                    "toolchain's)"
                ) from None
            lib.cuLaunchKernel.argtypes = [
                ctypes.c_void_p,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
            ]
            lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
            lib.cuModuleGetFunction.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_void_p,
                ctypes.c_char_p,
            ]
            lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
            lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
            lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
            lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
            # cuda.h maps these names to their _v2 entry points; the unversioned symbols keep the
            # pre-CUDA 4 rule that a context is current in one thread at a time, so pushing the
            # primary context (current in torch's threads) fails with CUDA_ERROR_INVALID_CONTEXT.
            lib.cuCtxPushCurrent = lib.cuCtxPushCurrent_v2
            lib.cuCtxPopCurrent = lib.cuCtxPopCurrent_v2
            lib.cuCtxPushCurrent.argtypes = [ctypes.c_void_p]
            lib.cuCtxPopCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            _driver = lib
    return _driver


def check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        try:
            driver().cuGetErrorName(rc, ctypes.byref(name))
        except Exception:  # noqa: BLE001 - the error name is a courtesy
            pass
        raise CudaDriverError(f"{what} failed: CUDA error {rc} ({(name.value or b'?').decode()})")


def _current_context() -> tuple[int, Arch]:
    lib = driver()
    ctx = ctypes.c_void_p()
    check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        raise NoCudaContext(
            "no current CUDA context in this thread: launch with device=<index> (kiln's ops do: "
            "the tensors' device's primary context is bound for the call) or make a context current"
        )
    dev = ctypes.c_int()
    check(lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev.value), "cuDeviceGetAttribute")
    check(lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev.value), "cuDeviceGetAttribute")
    return ctx.value, Arch(major.value, minor.value)


_primaries: dict[int, int] = {}  # device ordinal -> its primary context, retained once
_primary_lock = threading.Lock()


def primary_context(device: int) -> int:
    """Device `device`'s primary context (the CUDA runtime's and torch's), retained on first use
    and kept for the life of the process (torch holds it too)."""
    got = _primaries.get(device)
    if got is None:
        with _primary_lock:
            got = _primaries.get(device)
            if got is None:
                lib = driver()
                check(lib.cuInit(0), "cuInit")
                dev, ctx = ctypes.c_int(), ctypes.c_void_p()
                check(lib.cuDeviceGet(ctypes.byref(dev), device), f"cuDeviceGet({device})")
                check(
                    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                    f"cuDevicePrimaryCtxRetain(device {device})",
                )
                if not ctx.value:
                    raise CudaDriverError(f"cuDevicePrimaryCtxRetain(device {device}) gave no context")
                got = _primaries[device] = ctx.value
    return got


class _Bound:
    """`with _Bound(ctx):` makes `ctx` the calling thread's current context and restores the
    previous one (none included) on exit."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: int):
        self.ctx = ctx

    def __enter__(self) -> None:
        check(driver().cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")

    def __exit__(self, *exc) -> None:
        popped = ctypes.c_void_p()
        check(driver().cuCtxPopCurrent(ctypes.byref(popped)), "cuCtxPopCurrent")


class TritonKernel:
    """Launches one entry point of a TritonModule (see the module docstring)."""

    def __init__(self, module: TritonModule, entry: str):
        self.module = module
        self.entry = entry
        self._functions: dict[int, tuple[int, Cubin]] = {}  # context -> (CUfunction, cubin)
        self._mutex = threading.Lock()
        self._call_lock = threading.Lock()  # the argument buffer is shared by calls
        params = module.cubins[entry][0].launch["params"]
        self.params = [p[0] for p in params]
        self._types = [p[1] for p in params]
        # (index, name, multiple) of the arguments compiled as multiples of 16 (":16").
        self._aligned = [(i, p[0], p[2]) for i, p in enumerate(params) if len(p) > 2 and p[2] > 1]
        # The specialisation's tl.constexpr values (tile sizes a caller's grid depends on).
        self.constexprs: dict = dict(module.cubins[entry][0].launch.get("constexprs", {}))
        self._n = len(params)
        # The argument buffer: slot i (8 bytes at 8 i) holds argument i, then the global and
        # profile scratch pointers (null: never packed, the buffer starts zeroed).
        self._pack = struct.Struct(
            "=" + "".join(_POINTER_PACK if ty.startswith("*") else _PACK[ty] for ty in self._types)
        )
        self._buffer = (ctypes.c_char * (_SLOT * (self._n + 2)))()
        base = ctypes.addressof(self._buffer)
        self._argv = (ctypes.c_void_p * (self._n + 2))(*[base + _SLOT * i for i in range(self._n + 2)])

    def cubin_for(self, arch: Arch) -> Cubin:
        fits = [c for c in self.module.cubins[self.entry] if runs_on(c.arch, arch)]
        if not fits:
            have = ", ".join(str(c.arch) for c in self.module.cubins[self.entry])
            raise TritonLoadError(
                f"{self.module.name}: kernel {self.entry} has cubins for [{have}], "
                f"none of which runs on this device (compute capability "
                f"{arch.cc}); build it for this device's arch"
            )
        return max(fits, key=lambda c: (c.arch.suffix == "a", c.arch.minor))

    def function(self) -> tuple[int, Cubin]:
        ctx, arch = _current_context()
        with self._mutex:
            got = self._functions.get(ctx)
            if got is None:
                cubin = self.cubin_for(arch)
                lib = driver()
                mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
                check(
                    lib.cuModuleLoadData(ctypes.byref(mod), cubin.data),
                    f"cuModuleLoadData({cubin.launch['cubin']})",
                )
                check(
                    lib.cuModuleGetFunction(ctypes.byref(fn), mod, cubin.name.encode()),
                    f"cuModuleGetFunction({cubin.name})",
                )
                if cubin.shared > _SMEM_DEFAULT:
                    check(
                        lib.cuFuncSetAttribute(
                            fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, cubin.shared
                        ),
                        f"opting {cubin.name} into {cubin.shared} bytes of shared memory",
                    )
                got = self._functions[ctx] = (fn.value, cubin)
        return got

    def __call__(self, grid: tuple[int, ...], *args, stream: int = 0, device: int | None = None) -> None:
        """Launch on `grid` ((x,), (x, y) or (x, y, z)) with `args` in the kernel's parameter
        order (pointers as integers) on CUDA stream handle `stream` (a stream of `device`'s
        primary context, as torch's are), in device `device`'s primary context (None: the
        calling thread's current context; see the module docstring). An argument compiled as a
        multiple of 16 (":16" in its signature) that is not one, or a value its type cannot hold,
        is a ValueError, never a launch."""
        if len(args) != self._n:
            raise TypeError(
                f"{self.entry} takes {self._n} arguments ({', '.join(self.params)}), got {len(args)}"
            )
        for i, name, multiple in self._aligned:
            if args[i] % multiple:
                raise ValueError(
                    f"{self.entry}: argument {name} = {args[i]} must be a multiple of {multiple} (the "
                    "kernel was compiled assuming it); the caller must pick an unaligned variant"
                )
        ctx = _ctx_cached()
        if device is not None:
            primary = _primaries.get(device) or primary_context(device)
            if ctx != primary:  # none current (a thread that never touched the GPU), or another
                with _Bound(primary):
                    self(grid, *args, stream=stream, device=None)
                return
        fn, cubin = self._functions.get(ctx) or self.function()
        dims = len(grid)
        if dims == 2:
            (gx, gy), gz = grid, 1
        elif dims == 1:
            (gx,), gy, gz = grid, 1, 1
        elif dims == 3:
            gx, gy, gz = grid
        else:
            raise ValueError(f"{self.entry}: grid must have 1, 2 or 3 dimensions, got {tuple(grid)}")
        if gx <= 0 or gy <= 0 or gz <= 0:
            return  # an empty grid launches nothing (cuLaunchKernel would refuse it)
        launch = _fast.get("launch") or _bind_launch()
        with self._call_lock:
            try:
                self._pack.pack_into(self._buffer, 0, *args)
            except (struct.error, OverflowError):  # (OverflowError: a float past fp32's range)
                self._refuse_unpackable(args)
                raise
            rc = launch(fn, gx, gy, gz, cubin.block, 1, 1, cubin.shared, stream, self._argv, None)
        if rc != 0:
            check(rc, f"cuLaunchKernel({cubin.name})")

    def _refuse_unpackable(self, args) -> None:
        for name, ty, value in zip(self.params, self._types, args, strict=True):
            code = _POINTER_PACK if ty.startswith("*") else _PACK[ty]
            try:
                struct.pack("=" + code, value)
            except (struct.error, OverflowError) as e:
                raise ValueError(
                    f"{self.entry}: argument {name} = {value!r} does not fit its type {ty} ({e})"
                ) from None


_tls = threading.local()  # per thread: the buffer cuCtxGetCurrent writes (ctypes drops the GIL)


_fast: dict = {}  # the two driver entry points of the hot path, bound once


def _bind_launch():
    fn = _fast["launch"] = driver().cuLaunchKernel
    return fn


def _ctx_cached() -> int:
    """The current context's handle (one driver call; the launcher's per-call lookup key)."""
    fn = _fast.get("ctx")
    if fn is None:
        fn = _fast["ctx"] = driver().cuCtxGetCurrent
    try:
        handle, ref = _tls.ctx
    except AttributeError:
        handle = ctypes.c_void_p()
        ref = ctypes.byref(handle)
        _tls.ctx = (handle, ref)
    fn(ref)
    return handle.value or 0
