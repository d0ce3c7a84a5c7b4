"""CUDA architectures: parsing arch lists, detecting devices, and the arch context.

An arch list names compute capabilities: "8.0 9.0a", "8.0;9.0a", "sm_90a", "90a", "9.0+PTX".
The arch context combines the detected devices with the explicitly requested list; before a module
is compiled it is restricted to the families its target supports, and it is a clear error when
none remains. kiln never adds archs of another family on its own (no implicit PTX fallback).
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass

from . import env
from .record import Record


class ArchError(ValueError):
    """An arch list cannot be parsed, or no requested arch is supported by a target."""


class ArchListError(ArchError, env.EnvError):
    """KILN_CUDA_ARCH_LIST holds something that is not an arch list (an ArchError and an EnvError:
    the environment table refuses it on every path, not only where CUDA archs are needed)."""


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "" generic, "a" arch-specific (wgmma...), "f" family-specific
    ptx: bool = False  # also embed PTX for this arch (only when asked for, "+PTX")

    @property
    def cc(self) -> str:
        """The compute capability, "9.0"."""
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        """nvcc's spelling, "90a"."""
        return f"{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.cc}{self.suffix}" + ("+PTX" if self.ptx else "")

    def gencode(self) -> str:
        codes = f"sm_{self.sm}" + (f",compute_{self.sm}" if self.ptx else "")
        return f"-gencode=arch=compute_{self.sm},code=[{codes}]"

    def with_suffix(self, suffix: str) -> Arch:
        return Arch(self.major, self.minor, suffix, self.ptx)


_DOTTED = re.compile(r"^(\d+)\.(\d)([af]?)$")
_COMPACT = re.compile(r"^(?:sm_?|compute_?)?(\d+)(\d)([af]?)$")


def parse_arch(text: str) -> Arch:
    raw = text.strip()
    body, ptx = raw, False
    if body.upper().endswith("+PTX"):
        body, ptx = body[:-4], True
    m = _DOTTED.match(body) or _COMPACT.match(body.lower())
    if not m:
        raise ArchError(
            f"cannot parse CUDA arch {raw!r}; write it as '9.0', '9.0a', 'sm_90a' or '9.0+PTX'"
        )
    return Arch(int(m.group(1)), int(m.group(2)), m.group(3), ptx)


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """Parse "8.0 9.0a", "8.0;9.0a", "8.0,9.0a"; sorted, duplicates removed."""
    items = [t for t in re.split(r"[\s;,]+", text.strip()) if t]
    return tuple(sorted({parse_arch(t) for t in items}))


def check_env_arch_list(raw: str) -> None:
    """The check the environment table runs on KILN_CUDA_ARCH_LIST."""
    try:
        parse_arch_list(raw)
    except ArchError as e:
        raise ArchListError(f"KILN_CUDA_ARCH_LIST={raw!r}: {e}") from e


def format_arch_list(archs) -> str:
    return " ".join(str(a) for a in archs)


def arch_list_tag(archs) -> str:
    """The arch list as a path component of the artifact repository: "8.0 9.0a" -> "sm80-sm90a"."""
    return "-".join(f"sm{a.sm}" + ("+ptx" if a.ptx else "") for a in sorted(set(archs)))


def parse_arch_list_tag(tag: str) -> tuple[Arch, ...]:
    """The inverse of arch_list_tag; ArchError for anything else."""
    if not tag.startswith("sm"):
        raise ArchError(f"{tag!r} is not an arch list tag such as 'sm80-sm90a'")
    return parse_arch_list(tag.replace("-", " "))


def runs_on(built: Arch, device: Arch) -> bool:
    """Can SASS compiled for `built` run on a device of compute capability `device`?

    Generic SASS runs on the same and later minor versions of its major (8.0 code on 8.6 and 8.9);
    family-specific ("f") code likewise within its family; arch-specific ("a") code only on its own
    compute capability (CUDA C++ Programming Guide, "Binary Compatibility")."""
    if built.major != device.major:
        return False
    if built.suffix == "a":
        return built.minor == device.minor
    return built.minor <= device.minor


def uncovered(built: tuple[Arch, ...], wanted: tuple[Arch, ...]) -> list[Arch]:
    """The archs in `wanted` that a module compiled for `built` cannot serve. A wanted "a" arch
    (a target that needs 9.0a features) needs "a" code; a wanted "+PTX" needs that PTX."""
    missing = []
    for w in wanted:
        ok = any(runs_on(b, w) and (w.suffix != "a" or b.suffix == "a")
                 and (not w.ptx or (b.ptx and b.cc == w.cc)) for b in built)
        if not ok:
            missing.append(w)
    return missing


class ArchFamily(Record):
    """A family a target supports: its name, the compute capabilities in it, and whether the target
    needs the arch-specific ("a") variant there."""

    __slots__ = ("name", "archs", "arch_specific")

    def __init__(self, name: str, archs: tuple[str, ...], arch_specific: bool = False):
        self._init(name, archs, arch_specific)

    def __str__(self) -> str:
        return f"{self.name}{'a' if self.arch_specific else ''} ({' '.join(self.archs)})"

    def contains(self, arch: Arch) -> bool:
        return arch.cc in self.archs


class Device(Record):
    __slots__ = ("index", "name", "arch")

    def __init__(self, index: int, name: str, arch: Arch):
        self._init(index, name, arch)


@functools.lru_cache(maxsize=1)
def detect_devices() -> tuple[Device, ...]:
    """The visible CUDA devices, through the driver API (no framework, no runtime library).

    Returns () when there is no driver or no device. Cached for the life of the process.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ()
    if lib.cuInit(0) != 0:
        return ()
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    devices = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
        lib.cuDeviceGetName(name, 256, dev)
        devices.append(Device(i, name.value.decode(errors="replace"), Arch(major.value, minor.value)))
    return tuple(devices)


def driver_version() -> str | None:
    """The CUDA driver's version ("13.0"), through the driver API; None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


class ArchContext(Record):
    """What CUDA modules are compiled for: the requested archs and where that request came from
    (`source`: human-readable, quoted in errors)."""

    __slots__ = ("requested", "source")

    def __init__(self, requested: tuple[Arch, ...], source: str):
        self._init(requested, source)

    @classmethod
    def current(cls, arch_list: str | None = None) -> ArchContext:
        """An explicit list (CLI --arch-list) wins, then KILN_CUDA_ARCH_LIST, then the devices."""
        if arch_list:
            return cls(parse_arch_list(arch_list), f"--arch-list {arch_list!r}")
        env_list = env.get("KILN_CUDA_ARCH_LIST")
        if env_list:
            return cls(parse_arch_list(env_list), f"KILN_CUDA_ARCH_LIST={env_list!r}")
        devices = detect_devices()
        archs = tuple(sorted({d.arch for d in devices}))
        names = ", ".join(f"{d.name} ({d.arch})" for d in devices) or "none"
        return cls(archs, f"detected devices: {names}")

    def restrict(self, families: tuple[ArchFamily, ...], what: str) -> tuple[Arch, ...]:
        """The requested archs that `what` supports, each in the variant its family needs.

        Raises ArchError naming the arch list in force and the supported families when none is left.
        """
        if not self.requested:
            raise ArchError(
                f"no CUDA arch to build {what} for: no CUDA device was detected and no arch list "
                "was given; set KILN_CUDA_ARCH_LIST (e.g. '9.0a') or pass --arch-list"
            )
        chosen = []
        for arch in self.requested:
            family = next((f for f in families if f.contains(arch)), None)
            if family is None:
                continue
            if family.arch_specific and arch.suffix == "":
                arch = arch.with_suffix("a")
            chosen.append(arch)
        if not chosen:
            supported = ", ".join(str(f) for f in families) or "none"
            raise ArchError(
                f"{what} supports none of the requested CUDA archs "
                f"[{format_arch_list(self.requested)}] ({self.source}); it supports the families "
                f"{supported}. Request a supported arch, or run it on the CPU backend."
            )
        return tuple(sorted(set(chosen)))


def supports(families: tuple[ArchFamily, ...], arch: Arch) -> bool:
    return any(f.contains(arch) for f in families)
