"""Turning a CompileSpec into a build plan (flags, keys), and compiling and publishing it.

A plan is pure: computing it reads the spec's input files and the compilers' identity, and writes
nothing. It needs no compiler: when one is missing, the plan still has its portable key (which
finds precompiled modules) and records the problem, and only checking the disk cache or compiling
fails on it. `compile_plan` renders the sources into the generated workspace, writes the manifest,
runs ninja and publishes the library atomically: the library under a new name (temp + rename),
then metadata.json as the commit marker. A triton module (runtime/triton_build.py) is planned and
published the same way; only its compile step differs (triton in a child process instead of
ninja) and what it publishes (one cubin per kernel and arch, and their launch metadata as its
"library").
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import cache, env, metadata, sources
from .arch import Arch, ArchContext
from .files import write_atomic, write_if_different
from .key import KEY_FORMAT, Dep, action_key, collect_deps, file_digest, spec_key
from .log import logger
from .spec import CompileSpec
from .toolchain import Compiler, ToolchainError, cuda_home, cuda_lib_dir, host_compiler, nvcc, triton
from .workspace import Workspace


class CompileError(RuntimeError):
    """A module failed to compile. The message holds the compiler's own output and the command."""

    def __init__(self, module: str, output: str, build_dir: Path, label: str = "",
                 tool: str = "ninja"):
        self.module = module
        self.output = output
        self.build_dir = build_dir
        tail = output if len(output) < 20000 else "...\n" + output[-20000:]
        where = ("the FAILED line above is the command that failed" if tool == "ninja" else
                 "the command above ran triton's compiler on the request.json beside it")
        super().__init__(
            f"kiln: compiling {module} failed.\n{tail.rstrip()}\n"
            f"({tool}, in {build_dir}: {where}; "
            f"KILN_JIT_VERBOSE=1 streams the compiler output; "
            f"'python -m kiln.codegen explain {label or '<label>'}' prints every command and the "
            f"key)"
        )


class BuildWriteError(RuntimeError):
    """Writing a module's sources, build files or published files failed (a full disk, a file-size
    limit, a read-only workspace). Nothing was published: the next use builds it again."""

    def __init__(self, module: str, error: OSError):
        self.module = module
        where = f" {error.filename}" if error.filename else ""
        super().__init__(
            f"kiln: building {module} failed writing{where}: {error.strerror or error} (a full "
            f"disk or a file-size limit?). Nothing was published; the next use builds it again."
        )


@dataclass(frozen=True)
class BuildPlan:
    spec: CompileSpec
    workspace: Workspace
    archs: tuple[Arch, ...]
    cxx: Compiler | None  # None when toolchain_problem says why
    nvcc: Compiler | None
    cxx_flags: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    key_parts: dict
    spec_key: str
    gen_dir: Path
    portable_parts: dict
    portable_key: str
    toolchain_problem: str | None = None  # a compiler is missing: nothing can be checked or built

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def module_dir(self) -> Path:
        return self.workspace.module_dir(self.spec.name)

    @property
    def key_dir(self) -> Path:
        return self.workspace.key_dir(self.spec.name, self.spec_key)

    @property
    def output(self) -> str:
        return f"{self.spec.name}.so"

    def describe(self) -> str:
        """"norm_dtype_bf16_cuda [cuda sm_90a]", "norm_dtype_bf16_host [host]"."""
        if not self.archs:
            return f"{self.spec.name} [{self.spec.toolchain}]"
        return f"{self.spec.name} [{self.spec.toolchain} {','.join('sm_' + a.sm for a in self.archs)}]"


def _input_digests(spec: CompileSpec) -> dict[str, str]:
    """{portable name (absolute path for a file outside kiln): SHA-256} of the spec's inputs."""
    out = {}
    for p in spec.inputs:
        p = Path(p).resolve()
        out[sources.portable_name(p) or str(p)] = file_digest(p)
    return out


def _gen_key(spec: CompileSpec, inputs: dict[str, str]) -> str:
    """The key of the generated directory: what the generated files are made from, nothing else."""
    units = [[u.name, u.lang] for u in spec.units]
    return spec_key({"params": dict(spec.params), "inputs": inputs, "units": units})


def generated_dir(spec: CompileSpec, workspace: Workspace | None = None) -> Path:
    """Where `spec`'s sources are generated; needs no compiler and no arch."""
    workspace = workspace or Workspace.current()
    return workspace.gen_dir(spec.uri, _gen_key(spec, _input_digests(spec)))


def _tools(spec: CompileSpec) -> tuple[Compiler, Compiler | None, str | None]:
    """The host compiler, nvcc and the CUDA library directory a spec needs; ToolchainError when
    one is missing."""
    if spec.toolchain == "triton":
        return triton(), None, None
    cxx = host_compiler()
    if spec.toolchain != "cuda":
        return cxx, None, None
    nv = nvcc()
    return cxx, nv, cuda_lib_dir(cuda_home(nv.path))


def portable_parts(spec: CompileSpec, inputs: dict[str, str], defines: list[str]) -> dict:
    """The key parts that are the same on every machine that builds `spec` (docs/release.md):
    no compiler identity, no absolute path, no archs."""
    cxx_flags = [*spec.cxx_flags, *defines]
    cuda_flags: list[str] = []
    if spec.toolchain == "cuda":
        cuda_flags = [*spec.cuda_flags, *defines]
        if env.get("KILN_JIT_LINEINFO") and not env.get("KILN_JIT_DEBUG"):
            cuda_flags.append("-lineinfo")
        cxx_flags.append("-DKILN_WITH_CUDA=1")
    return {
        "format": KEY_FORMAT,
        "kiln_version": sources.kiln_version(),
        "module": spec.name,
        "uri": spec.uri,
        "params": dict(spec.params),
        "toolchain": spec.toolchain,
        "flags": {"cxx": cxx_flags, "cuda": cuda_flags, "link": list(spec.ldflags)},
        # Include directories of kiln's own (others belong to the toolchain's identity).
        "include_dirs": [n for n in map(sources.portable_name, spec.include_dirs) if n],
        "python_abi": sources.python_abi(),
        "inputs": inputs,
        "units": [[u.name, u.lang] for u in spec.units],
        "env": env.build_affecting(),
        **({"kernels": [k.to_json() for k in spec.kernels]} if spec.kernels else {}),
    }


def triton_archs(archs: tuple[Arch, ...]) -> tuple[Arch, ...]:
    """What triton 3.6 emits for each requested arch: capability 9.0 and later as the
    arch-specific variant (sm_90a, sm_100a: its wgmma/TMA and tcgen05 lowerings), 8.x as is; never
    PTX (a triton module is SASS only)."""
    return tuple(sorted({Arch(a.major, a.minor, "a" if a.major >= 9 else a.suffix)
                         for a in archs}))


def plan(spec: CompileSpec, arch_ctx: ArchContext | None = None,
         workspace: Workspace | None = None) -> BuildPlan:
    """The exact flags and the keys of `spec` for the arch list in force. Writes nothing, and
    needs no compiler (a missing one is recorded in `toolchain_problem`)."""
    workspace = workspace or Workspace.current()
    debug = env.get("KILN_JIT_DEBUG")
    inputs = _input_digests(spec)
    gen_dir = workspace.gen_dir(spec.uri, _gen_key(spec, inputs))
    archs: tuple[Arch, ...] = ()
    if spec.toolchain in ("cuda", "triton"):
        archs = (arch_ctx or ArchContext.current()).restrict(spec.arch_families, spec.what)
    if spec.toolchain == "triton":
        archs = triton_archs(archs)
    problem = None
    try:
        cxx, nv, cuda_lib = _tools(spec)
    except ToolchainError as e:
        cxx, nv, cuda_lib, problem = None, None, None, str(e)
    includes = [f"-I{gen_dir}"] + [f"-I{d}" for d in spec.include_dirs]
    defines = [f"-DKILN_MODULE_NAME={spec.name}"]
    # Only the host compiler builds Python-facing units; nvcc never needs Python's headers.
    py_includes = [f"-isystem{d}" for d in sources.python_include_dirs()]
    cxx_flags = [*spec.cxx_flags, *includes, *py_includes, *defines]
    cuda_flags: list[str] = []
    link_flags = [*spec.ldflags]
    if spec.toolchain == "cuda":
        ccbin = [f"-ccbin={cxx.path}"] if cxx else []
        cuda_flags = [*spec.cuda_flags, *ccbin, *(a.gencode() for a in archs), *includes, *defines]
        if env.get("KILN_JIT_LINEINFO") and not debug:
            cuda_flags.append("-lineinfo")
        cxx_flags.append("-DKILN_WITH_CUDA=1")
        link_flags = ([f"-L{cuda_lib}"] if cuda_lib else []) + link_flags
    if spec.toolchain == "triton":
        cxx_flags, link_flags = [], []
    if problem is None and spec.toolchain == "triton":
        toolchain = {"name": "triton", "triton": cxx.identity()}
    elif problem is None:
        toolchain = {"name": spec.toolchain, "cxx": cxx.identity(),
                     **({"nvcc": nv.identity()} if nv else {})}
    else:
        toolchain = {"name": spec.toolchain, "unavailable": problem}
    parts = {
        "format": KEY_FORMAT,
        "kiln_version": sources.kiln_version(),
        "module": spec.name,
        "uri": spec.uri,
        "params": dict(spec.params),
        "toolchain": toolchain,
        "archs": [str(a) for a in archs],
        "flags": {"cxx": cxx_flags, "cuda": cuda_flags, "link": link_flags},
        "python_abi": sources.python_abi(),
        "inputs": inputs,
        "units": [[u.name, u.lang] for u in spec.units],
        "env": env.build_affecting(),
        **({"kernels": [k.to_json() for k in spec.kernels]} if spec.kernels else {}),
    }
    portable = portable_parts(spec, inputs, defines)
    return BuildPlan(spec, workspace, archs, cxx, nv, tuple(cxx_flags), tuple(cuda_flags),
                     tuple(link_flags), parts, spec_key(parts), gen_dir, portable,
                     spec_key(portable), problem)


def generate_sources(spec: CompileSpec, gen_dir: Path, workspace: Workspace) -> Path:
    """Render `spec`'s sources into `gen_dir` (a directory of the generated workspace)."""
    workspace.ensure(gen_dir)
    if spec.generate is not None:
        spec.generate(gen_dir)
    missing = [u.name for u in spec.units if not (gen_dir / u.name).is_file()]
    if missing:
        raise RuntimeError(f"{spec.what}: generating sources did not produce {missing} in {gen_dir}")
    return gen_dir


def write_manifest(p: BuildPlan, build_dir: Path) -> Path:
    from . import ninja, resources  # the compile side, imported when something compiles

    if p.toolchain_problem:
        raise ToolchainError(f"no build manifest for {p.describe()}: {p.toolchain_problem}")
    threads = resources.estimate_jobs(p.spec.toolchain).nvcc_threads
    cuda_flags = list(p.cuda_flags) + ([f"--threads={threads}"] if threads > 1 else [])
    text = ninja.manifest(
        cxx=p.cxx.path, nvcc=p.nvcc.path if p.nvcc else None, cxx_flags=p.cxx_flags,
        cuda_flags=cuda_flags, link_flags=p.link_flags,
        units=[(u.name, u.lang, u.obj) for u in p.spec.units], gen_dir=p.gen_dir,
        output=p.output,
    )
    write_if_different(build_dir / "build.ninja", text)
    return build_dir / "build.ninja"


def compile_plan(p: BuildPlan, *, key_dir: Path | None = None, jobs: int | None = None,
                 quiet: bool = False) -> metadata.Metadata:
    """Generate, compile and publish `p` into `key_dir` (default: its cache slot). Caller holds
    the module lock when `key_dir` is shared, and has prepared the slot (runtime/cache.py: a build
    directory is either empty or verified). A write that fails (a full disk) is BuildWriteError
    and publishes nothing."""
    if p.toolchain_problem:
        raise ToolchainError(f"cannot compile {p.describe()}: {p.toolchain_problem}")
    try:
        return _compile(p, key_dir or p.key_dir, jobs, quiet)
    except OSError as e:
        raise BuildWriteError(p.describe(), e) from e


def _compile(p: BuildPlan, key_dir: Path, jobs: int | None, quiet: bool) -> metadata.Metadata:
    from . import ninja, resources

    if p.spec.toolchain == "triton":
        return _compile_triton(p, key_dir, quiet)
    log = logger()
    key_dir = p.workspace.ensure(key_dir)
    gen_dir = generate_sources(p.spec, p.gen_dir, p.workspace)
    build_dir = p.workspace.ensure(key_dir / "build")
    write_manifest(p, build_dir)
    est = resources.estimate_jobs(p.spec.toolchain)
    n_jobs = jobs or min(est.jobs, len(p.spec.units))
    if not quiet:
        log.info("kiln: compiling %s (first use; cached afterwards)", p.describe())
    start = time.monotonic()
    try:
        ninja.run(build_dir, n_jobs, env.get("KILN_JIT_VERBOSE"),
                  on_tick=None if quiet else
                  lambda s: log.info("kiln: still compiling %s (%.0fs)", p.describe(), s))
    except ninja.NinjaFailed as e:
        raise CompileError(p.describe(), e.output, build_dir, p.spec.label) from None
    elapsed = time.monotonic() - start
    deps = collect_deps([build_dir / (u.obj + ".d") for u in p.spec.units], (gen_dir,))
    akey = action_key(p.spec_key, deps)
    lib_name = metadata.library_name(p.spec.name, akey, sources.extension_suffix())
    outputs = cache.output_digests(
        build_dir, [n for u in p.spec.units for n in (u.obj, u.obj + ".d")] + [p.output])
    lib_sha, lib_size = outputs[p.output][1], outputs[p.output][0]
    write_atomic(key_dir / lib_name, (build_dir / p.output).read_bytes(), mode=0o700)
    if file_digest(key_dir / lib_name) != lib_sha:  # the copy is what was built, or nothing
        raise OSError(f"the copy of {build_dir / p.output} in {key_dir} differs from it")
    md = metadata.Metadata(
        module=p.spec.name, uri=p.spec.uri, label=p.spec.label,
        kiln_version=p.key_parts["kiln_version"], python_abi=p.key_parts["python_abi"],
        spec_key=p.spec_key, action_key=akey, library=lib_name, library_sha256=lib_sha,
        library_size=lib_size, archs=[str(a) for a in p.archs],
        toolchain=p.key_parts["toolchain"], key_parts=p.key_parts, deps=deps,
        commands=ninja.commands(build_dir), built_at=time.time(), build_seconds=round(elapsed, 3),
        outputs=outputs,
    )
    metadata.write(key_dir, md)  # the commit marker, last
    for old in key_dir.glob(f"{p.spec.name}.*{sources.extension_suffix()}"):
        if old.name != lib_name:
            old.unlink(missing_ok=True)  # an older build of this slot; loaded copies stay mapped
    if not quiet:
        log.info("kiln: compiled %s in %.1fs", p.describe(), elapsed)
    return md


def triton_commands(p: BuildPlan) -> list[str]:
    """What compiling a triton plan runs: the child's command line, then one triton.compile per
    kernel and arch (for `explain`)."""
    from . import triton_build

    out = [f"python -m kiln.runtime.triton_build {p.key_dir / 'build' / 'request.json'}"
           f"  (TRITON_CACHE_DIR={p.key_dir / 'build' / 'triton-cache'})"]
    for k in p.spec.kernels:
        consts = ", ".join(f"{a}={v}" for a, v in k.constexprs)
        for a in p.archs:
            out.append(f"  {k.key}: triton.compile(ASTSource({k.unit}:{k.entry}, constexprs={{{consts}}}), "
                       f"GPUTarget('cuda', {a.major * 10 + a.minor}, 32), num_warps={k.num_warps}, "
                       f"num_stages={k.num_stages}) -> {triton_build.stem(k.key, a.sm)}.cubin")
    return out


def _compile_triton(p: BuildPlan, key_dir: Path, quiet: bool) -> metadata.Metadata:
    """Compile every kernel of a triton module for every arch of `p` (runtime/triton_build.py)
    and publish: each cubin under a name of its action key, then the launch metadata of all of
    them (the module's "library"), then metadata.json, the commit marker, last."""
    from . import triton_build

    log = logger()
    key_dir = p.workspace.ensure(key_dir)
    build_dir = key_dir / "build"
    if build_dir.exists():  # a triton build starts from nothing: no output is reused
        shutil.rmtree(build_dir)
    build_dir = p.workspace.ensure(build_dir)
    units = {u.name: str(Path(f).resolve()) for u in p.spec.units for f in p.spec.inputs
             if Path(f).name == u.name}
    missing = [u.name for u in p.spec.units if u.name not in units]
    if missing:
        raise RuntimeError(f"{p.spec.what}: triton units {missing} are not among its inputs")
    request = {
        "build_dir": str(build_dir), "units": units, "own_roots": [str(sources.source_root() / "ops")],
        "kernels": [k.to_json() for k in p.spec.kernels],
        "archs": [{"sm": a.sm, "capability": a.major * 10 + a.minor} for a in p.archs],
        "triton_version": p.key_parts["toolchain"]["triton"]["version"],
    }
    if not quiet:
        log.info("kiln: compiling %s (first use; cached afterwards)", p.describe())
    start = time.monotonic()
    try:
        triton_build.run(request, build_dir, env.get("KILN_JIT_VERBOSE"))
    except triton_build.TritonCompileFailed as e:
        raise CompileError(p.describe(), e.output + "\n(command: " + " ".join(e.command) + ")",
                           build_dir, p.spec.label, tool="triton") from None
    elapsed = time.monotonic() - start
    deps = [Dep.of(f) for f in json.loads((build_dir / "deps.json").read_text())]
    akey = action_key(p.spec_key, deps)
    lib_name = metadata.library_name(p.spec.name, akey, metadata.TRITON_SUFFIX)
    outputs: dict[str, list] = {}
    kernels: dict[str, dict] = {}
    for k in p.spec.kernels:
        for a in p.archs:
            stem = triton_build.stem(k.key, a.sm)
            data = (build_dir / f"{stem}.cubin").read_bytes()
            launch = json.loads((build_dir / f"{stem}.json").read_text())
            name = f"{p.spec.name}.{akey[:16]}.{stem}.cubin"
            write_atomic(key_dir / name, data, mode=0o600)
            sha = file_digest(key_dir / name)
            if sha != file_digest(build_dir / f"{stem}.cubin"):
                raise OSError(f"the copy of {build_dir / stem}.cubin in {key_dir} differs from it")
            outputs[name] = [len(data), sha]
            launch.update(cubin=name, cubin_sha256=sha, cubin_size=len(data))
            kernels.setdefault(k.key, {})[str(a)] = launch
    library = json.dumps({"module": p.spec.name, "action_key": akey, "kernels": kernels},
                         indent=1, sort_keys=True)
    write_atomic(key_dir / lib_name, library, mode=0o600)
    lib_sha = file_digest(key_dir / lib_name)
    outputs[lib_name] = [(key_dir / lib_name).stat().st_size, lib_sha]
    md = metadata.Metadata(
        module=p.spec.name, uri=p.spec.uri, label=p.spec.label,
        kiln_version=p.key_parts["kiln_version"], python_abi=p.key_parts["python_abi"],
        spec_key=p.spec_key, action_key=akey, library=lib_name, library_sha256=lib_sha,
        library_size=outputs[lib_name][0], archs=[str(a) for a in p.archs],
        toolchain=p.key_parts["toolchain"], key_parts=p.key_parts, deps=deps,
        commands=[" ".join(["python", "-m", "kiln.runtime.triton_build",
                            str(build_dir / "request.json")])],
        built_at=time.time(), build_seconds=round(elapsed, 3), outputs=outputs,
    )
    metadata.write(key_dir, md)  # the commit marker, last
    for old in key_dir.glob(f"{p.spec.name}.*"):
        if old.name not in outputs:
            old.unlink(missing_ok=True)  # an older build of this slot; loaded copies stay in memory
    if not quiet:
        log.info("kiln: compiled %s in %.1fs", p.describe(), elapsed)
    return md
