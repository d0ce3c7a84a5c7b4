"""FlashInfer's capability queries on kiln's APIs, answered from kiln's build graph.

FlashInfer 0.7 decorates many APIs with ``@backend_requirement`` / ``@supported_compute_capability``
(flashinfer/utils.py), which give each function queries that its tests and the serving engines
call before they choose a call:

    fn.is_compute_capability_supported(cc)     does any backend of fn run on compute capability cc
                                               (major * 10 + minor: 90 for the H100 / H200)?
    fn.is_backend_supported(backend, cc=None)  is `backend` one of fn's backend names (and, given
                                               cc, does it run there)? "auto" is no backend name.
    fn.has_backend(backend), fn.has_backend_choices()

kiln's answers come from the arch families each target declares in its BUILD.py
(kiln.utils.target_arch_families, kiln.runtime.arch.supports): a backend name is supported on cc
exactly when the kiln target it runs on has kernels for that compute capability. Nothing here is a
typed-in list of capabilities, so the answers cannot drift from what kiln builds. An API without
backend choices (FlashInfer's ``@backend_requirement({}, common_check=...)``) answers
is_compute_capability_supported from its target and, as FlashInfer's does, refuses
is_backend_supported with a ValueError.

    @backend_requirement("//ops/gemm:mm", MM_BACKENDS)   # FlashInfer's names, all run on :mm
    @logged_api(mutates=("out",))
    def mm_bf16(...):
        check_backend("kiln.mm_bf16", backend, MM_BACKENDS + ("auto",))

The decorator only sets attributes: it returns the function it was given (no wrapper, nothing on
the call path; put it outermost). The build graph is read on the first query, never at import.
`check_backend` is the one error for a backend name FlashInfer does not have: a ValueError listing
the accepted ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

__all__ = ["backend_requirement", "check_backend", "compute_capability_arch"]


def compute_capability_arch(cc: int):
    """FlashInfer's integer compute capability (major * 10 + minor, 90 for 9.0, 103 for 10.3) as a
    kiln Arch; a TypeError or ValueError for anything else."""
    from kiln.runtime.arch import Arch

    if isinstance(cc, bool) or not isinstance(cc, int):
        raise TypeError(f"a compute capability is an int (major * 10 + minor, e.g. 90), got {cc!r}")
    if cc < 10:
        raise ValueError(f"a compute capability is major * 10 + minor (e.g. 90 for 9.0), got {cc}")
    return Arch(cc // 10, cc % 10)


def _runs_on(label: str, cc: int) -> bool:
    from kiln.runtime.arch import supports
    from kiln.utils import target_arch_families

    return supports(target_arch_families(label), compute_capability_arch(cc))


def backend_requirement(label: str, backends: Iterable[str] | Mapping[str, str] = ()) -> Callable:
    """Give an API FlashInfer's capability queries (module docstring). `label` is the target the
    API runs on; `backends` FlashInfer's backend names for it (without "auto"), each running on
    `label`'s kernels, or a mapping name -> the label that name runs on. Empty: an API with no
    backend choices."""
    table = dict(backends) if isinstance(backends, Mapping) else dict.fromkeys(backends, label)

    def decorate(fn: Callable) -> Callable:
        name = getattr(fn, "__name__", "the API")

        def has_backend_choices() -> bool:
            return bool(table)

        def has_backend(backend: str) -> bool:
            return backend in table

        def is_backend_supported(backend: str, cc: int | None = None) -> bool:
            if not table:
                raise ValueError(f"Invalid is_backend_supported call: no backend choices for {name}")
            if backend not in table:
                return False
            return True if cc is None else _runs_on(table[backend], cc)

        def is_compute_capability_supported(cc: int) -> bool:
            labels = set(table.values()) or {label}
            return any(_runs_on(lb, cc) for lb in labels)

        fn.has_backend_choices = has_backend_choices
        fn.has_backend = has_backend
        fn.is_backend_supported = is_backend_supported
        fn.is_compute_capability_supported = is_compute_capability_supported
        fn.experimental_backends = frozenset()
        fn.__kiln_backends__ = tuple(table)
        return fn

    return decorate


def check_backend(api: str, backend: object, accepted: tuple[str, ...]) -> None:
    """The error for a backend name outside `accepted` (FlashInfer's names for the API)."""
    if backend not in accepted:
        raise ValueError(
            f"{api}: backend {backend!r} is not one of FlashInfer's backends for it: "
            f"{', '.join(repr(b) for b in accepted)} (each runs kiln's own kernels)"
        )
