"""From a target's specialisation to the runtime's CompileSpec, for one toolchain.

The spec carries the compile units of that toolchain plus the binding, the flags of WORKSPACE.py's
toolchain entry (its debug variant under KILN_JIT_DEBUG=1, its AddressSanitizer flags for compile
and link under KILN_JIT_ASAN=1, host toolchain only) followed by the target's own, the
include path (source root, pybind11), the arch families, and a `generate` callback that renders
the specialisation into its generated directory.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kiln.runtime import env
from kiln.runtime.arch import ArchFamily
from kiln.runtime.spec import CompileSpec, TritonKernel, Unit

from . import render
from .dispatch import Specialisation, specialisation
from .graph import Graph, load_graph
from .rules import Target

_LANG = {".cu": "cuda", ".cc": "cxx", ".cpp": "cxx", ".cxx": "cxx"}


class ToolchainUnavailable(ValueError):
    pass


@functools.lru_cache(maxsize=1)
def _pybind11_include() -> str:
    import pybind11

    return pybind11.get_include()


def arch_families(graph: Graph, target: Target) -> tuple[ArchFamily, ...]:
    fams = graph.workspace["ARCH_FAMILIES"]
    out = []
    for name in target.archs:
        base = name[:-1] if name.endswith("a") else name
        out.append(ArchFamily(base, tuple(fams[base]["archs"]), arch_specific=name.endswith("a")))
    return tuple(out)


def unit_files(graph: Graph, target: Target, toolchain: str) -> list[Path]:
    """The toolchain's compile units copied from the source tree: the target's own and, unless it is
    generated from the entries (render.binding_unit), its binding."""
    srcs = target.srcs if toolchain == "cuda" else target.host_srcs
    files = [target.package_dir / s for s in srcs]
    if target.binding:
        files.append(graph.root / target.binding)
    names = [f.name for f in files] + ([render.binding_unit(target)] if target.entries else [])
    if len(set(names)) != len(names):
        raise ValueError(f"{target.label}: compile units {names} must have distinct file names")
    for f in files:
        if f.suffix not in _LANG:
            raise ValueError(f"{target.label}: {f} is not a compile unit (.cu, .cc, .cpp)")
        if not f.is_file():
            raise FileNotFoundError(f"{target.label}: compile unit {f} does not exist")
    return files


def _substitute(value, params: dict[str, str], types: dict[str, str]):
    """A BUILD file's triton_kernel value at one specialisation: "{axis}" becomes the axis value
    (in the signature: its triton type, WORKSPACE.py TRITON_TYPES); a number stays a number."""
    if not isinstance(value, str):
        return value
    out = value.format(**params)
    return int(out) if out.isdigit() else out


def triton_spec(spec: Specialisation, graph: Graph) -> CompileSpec:
    """The triton toolchain's spec: the target's triton_srcs read in place (nothing is rendered),
    its entry points at this specialisation, and its arch families."""
    target = spec.target
    types = graph.workspace["TRITON_TYPES"]
    params = dict(spec.params)
    typed = {a: types.get(v, v) for a, v in params.items()}
    files = [target.package_dir / f for f in target.triton_srcs]
    for f in files:
        if f.suffix != ".py" or not f.is_file():
            raise FileNotFoundError(f"{target.label}: triton source {f} is not a .py file")
    kernels = tuple(
        TritonKernel(k.entry, k.unit,
                     tuple((a, _substitute(t, typed, types)) for a, t in k.signature),
                     tuple((a, _substitute(v, params, types)) for a, v in k.constexprs),
                     k.num_warps, k.num_stages, k.name)
        for k in target.triton_kernels)
    return CompileSpec(
        name=spec.module_name("triton"), uri=spec.uri, toolchain="triton",
        units=tuple(Unit(f.name, "triton") for f in files),
        inputs=tuple(files), params=spec.params,
        arch_families=arch_families(graph, target), label=target.label, kernels=kernels,
    )


def compile_spec(spec: Specialisation, toolchain: str, graph: Graph | None = None) -> CompileSpec:
    graph = graph or load_graph()
    target = spec.target
    if toolchain not in target.toolchains:
        raise ToolchainUnavailable(
            f"{target.label} has no {toolchain} implementation; it builds with "
            f"{', '.join(target.toolchains)}"
        )
    if toolchain == "triton":
        return triton_spec(spec, graph)
    tc = graph.workspace["TOOLCHAINS"][toolchain]
    debug = env.get("KILN_JIT_DEBUG")
    # AddressSanitizer: WORKSPACE.py declares asan_flags for the host toolchain only, so a CUDA
    # module (its host-compiled binding included) stays unsanitised; compute-sanitizer covers it.
    asan = tuple(tc.get("asan_flags", ())) if env.get("KILN_JIT_ASAN") else ()
    files = unit_files(graph, target, toolchain)
    units = tuple(Unit(f.name, _LANG[f.suffix]) for f in files)
    if target.entries:
        units += (Unit(render.binding_unit(target), "cxx"),)
    # The binding and host units are C++ for the host compiler; only .cu files go to nvcc.
    tables = graph.workspace.get("AXIS_TABLES", {})

    def generate(out_dir: Path) -> None:
        render.render(spec, tables, files, out_dir)

    return CompileSpec(
        name=spec.module_name(toolchain),
        uri=spec.uri,
        toolchain=toolchain,
        units=units,
        inputs=tuple([*render.template_inputs(spec), *files]),
        params=spec.params,
        include_dirs=(str(graph.root), _pybind11_include(),
                      *(str(graph.root / d) for d in target.include_dirs)),
        cxx_flags=(*tc["debug_cxx_flags" if debug else "cxx_flags"], *asan, *target.cflags),
        cuda_flags=(*tc.get("debug_cuda_flags" if debug else "cuda_flags", ()), *target.cuda_flags)
        if toolchain == "cuda" else (),
        ldflags=(*tc.get("ldflags", ()), *asan, *target.ldflags),
        arch_families=arch_families(graph, target) if toolchain == "cuda" else (),
        label=target.label,
        generate=generate,
    )


def module_spec(label: str, params: dict, toolchain: str) -> CompileSpec:
    """The CompileSpec of `label` at `params` for `toolchain` (the Python API's entry point)."""
    graph = load_graph()
    return compile_spec(specialisation(graph.target(label), params), toolchain, graph)
