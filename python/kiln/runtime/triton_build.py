"""The triton toolchain's compile step: every kernel of a module, for every arch of its plan, to a
cubin and its launch metadata, in a child process.

    python -m kiln.runtime.triton_build <request.json>

The child imports triton and the module's kernel files (each with its own directory first on
sys.path, so a kernel may import a sibling helper), compiles each entry point with
`triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", cc, 32))` (no GPU
needed), and writes into the request's build directory:

    <entry>.sm<sm>.cubin   the SASS
    <entry>.sm<sm>.json    its launch metadata (kernel name, parameters, shared memory, warps,
                           stages, scratch sizes, the arch the cubin is for)
    <entry>.sm<sm>.ptx     the PTX (for `explain`/inspection only; never loaded)
    deps.json              every Python file the kernel files imported from kiln's sources or
                           their own directories (their digests go into the action key, as the
                           headers of an nvcc module do)

A child process keeps triton, its LLVM and the kernel modules out of the serving process (which
loads only the cubins, runtime/triton_module.py), and gives triton a private cache directory
inside the build directory, so triton's own cache never serves or hides a kiln build.

Arch: triton 3.6 compiles capability 9.0 as sm_90a (its wgmma and TMA lowering need it) and 8.x
as sm_8x; the launch metadata records the arch the PTX targets, read from the PTX itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

LAUNCH_FIELDS = (
    "name",
    "shared",
    "num_warps",
    "num_stages",
    "num_ctas",
    "global_scratch_size",
    "profile_scratch_size",
    "launch_pdl",
    "launch_cooperative_grid",
    "tmem_size",
    "maxnreg",
)
# The argument types a kiln launch can pack (runtime/triton_module.py): pointers, ints, floats.
ARG_TYPES = re.compile(
    r"^(\*(bf16|fp16|fp32|fp64|i8|i16|i32|i64|u8|fp8e4nv|fp8e5)|i32|i64|u32|"
    r"u64|fp32|constexpr)$"
)
_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.M)


class TritonCompileFailed(RuntimeError):
    def __init__(self, output: str, command: list[str]):
        self.output = output
        self.command = command
        super().__init__(output)


def stem(kernel_entry: str, sm: str) -> str:
    return f"{kernel_entry}.sm{sm}"


def run(request: dict, build_dir: Path, verbose: bool = False) -> None:
    """Run the child on `request` (written to build_dir/request.json); TritonCompileFailed with
    its output when it fails."""
    req = build_dir / "request.json"
    req.write_text(json.dumps(request, indent=1, sort_keys=True))
    cmd = [sys.executable, "-m", "kiln.runtime.triton_build", str(req)]
    child_env = dict(os.environ)
    child_env["TRITON_CACHE_DIR"] = str(build_dir / "triton-cache")
    # The child must import this very kiln (an editable checkout or an installed wheel).
    pkg_parent = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run(cmd, env=child_env, capture_output=not verbose, text=True)
    if out.returncode != 0:
        raise TritonCompileFailed(
            ((out.stdout or "") + (out.stderr or "")).strip() or f"exit status {out.returncode}", cmd
        )


def _load_unit(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    try:
        mspec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        mspec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def _ptx_arch(ptx: str) -> str:
    m = _TARGET.search(ptx)
    if not m:
        raise RuntimeError("triton's PTX names no .target")
    return m.group(1)[3:]  # "90a"


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    out = Path(request["build_dir"])
    before = set(sys.modules)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if triton.__version__ != request["triton_version"]:
        raise RuntimeError(
            f"the child imported triton {triton.__version__}, the plan was made "
            f"for {request['triton_version']}"
        )
    units = {
        name: _load_unit(Path(path), f"kiln_triton_src_{Path(path).stem}")
        for name, path in request["units"].items()
    }
    unit_dirs = tuple(str(Path(p).resolve().parent) + os.sep for p in request["units"].values())
    own = tuple(os.path.realpath(r) + os.sep for r in request["own_roots"])  # kiln's ops/
    # kiln's own ops/ files always count (also inside an installed wheel's kiln/_src); beside a
    # kernel file outside ops/ (a test's), installed packages do not: triton itself, in a virtual
    # environment that may lie there, is covered by the toolchain's identity, not by digests.
    installed = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    deps = set()
    for name in set(sys.modules) - before:
        f = getattr(sys.modules[name], "__file__", None)
        if not (f and f.endswith(".py")):
            continue
        f = os.path.realpath(f)
        beside = (
            f.startswith(unit_dirs)
            and not f.startswith(installed)
            and f"{os.sep}site-packages{os.sep}" not in f
        )
        if (f.startswith(own) or beside) and f not in request["units"].values():
            deps.add(f)
    for k in request["kernels"]:
        fn = getattr(units[k["unit"]], k["entry"], None)
        if fn is None or not hasattr(fn, "run"):
            raise RuntimeError(f"{k['unit']} defines no @triton.jit function {k['entry']}")
        declared = dict(k["signature"])
        if sorted(declared) != sorted(fn.arg_names):
            raise RuntimeError(
                f"{k['entry']} takes ({', '.join(fn.arg_names)}); its signature "
                f"declares ({', '.join(declared)})"
            )
        # "ty:16" (triton's AOT spelling): the argument is a multiple of 16 (a pointer: 16-byte
        # aligned), the divisibility the JIT would specialise on; the launcher checks it per call.
        signature = {a: declared[a].split(":")[0] for a in fn.arg_names}  # the function's order
        hints = {a: int(declared[a].split(":")[1]) for a in fn.arg_names if ":" in declared[a]}
        if any(h != 16 for h in hints.values()):
            raise RuntimeError(f"{k['entry']}: the only divisibility hint is ':16', got {hints}")
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in hints}
        for arch in request["archs"]:
            src = ASTSource(fn, signature=signature, constexprs=k["constexprs"], attrs=attrs)
            ck = triton.compile(
                src,
                target=GPUTarget("cuda", arch["capability"], 32),
                options={"num_warps": k["num_warps"], "num_stages": k["num_stages"]},
            )
            built_sm = _ptx_arch(ck.asm["ptx"])
            s = stem(k["name"], arch["sm"])
            (out / f"{s}.cubin").write_bytes(ck.asm["cubin"])
            (out / f"{s}.ptx").write_text(ck.asm["ptx"])
            md = ck.metadata
            launch = {f: getattr(md, f) for f in LAUNCH_FIELDS}
            launch.update(
                entry=k["entry"],
                arch=built_sm,
                requested_arch=arch["sm"],
                triton_version=triton.__version__,
                constexprs=k["constexprs"],
                params=[[a, t, hints.get(a, 1)] for a, t in signature.items() if t != "constexpr"],
            )
            (out / f"{s}.json").write_text(json.dumps(launch, indent=1, sort_keys=True))
    (out / "deps.json").write_text(json.dumps(sorted(deps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
