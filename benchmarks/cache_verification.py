"""What verifying a disk-cache slot costs on the warm path: the first load of a module in a fresh
process, whose slot was built earlier.

Each module is built once into the workspace (CUDA modules cross-compiled for --arch-list, no GPU
needed), then loaded by --runs fresh processes. Each process times, with time.perf_counter:

  plan      build.plan: input digests, compiler identity, key (the same on every kiln version)
  verify    the first jit.verify (jit.check on a kiln without it): everything that is checked
            before a load (directories, metadata, the library's size and SHA-256, headers)
  load      dlopen and module init of the verified library
and, after those, the parts of verify on their own (the page cache is warm for all of them):
  digest    SHA-256 of the library alone
  metadata  reading and validating metadata.json alone
  deps      checking every recorded header alone
  again     a second verify in the same process (the library's digest is memoised)

Run it for this checkout and for another (--kiln <checkout>, e.g. one of the commit before the
verification work) to get the extra cost: the difference of the verify medians.

    python benchmarks/cache_verification.py --workspace /tmp/kiln-bench-ws --runs 15
    python benchmarks/cache_verification.py --kiln /tmp/kiln-main --workspace /tmp/kiln-main-ws
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# (label, params, toolchain, arch list): the largest modules this machine can build.
MODULES = (
    ("//ops:attention", {"dtype": "bf16", "head_dim": 128, "soft_cap": False}, "cuda", "9.0a"),
    ("//ops:attention", {"dtype": "bf16", "head_dim": 128, "soft_cap": False}, "host", ""),
    ("//ops:norm", {"dtype": "f32"}, "host", ""),
)

SETUP = r"""
import json, sys
from kiln.codegen.specs import module_spec
from kiln.runtime import build, jit
from kiln.runtime.arch import ArchContext, parse_arch_list
label, params, toolchain, archs = json.loads(sys.argv[1])
ctx = ArchContext(parse_arch_list(archs), "bench") if archs else ArchContext((), "host")
spec = module_spec(label, params, toolchain)
"""

BUILD = SETUP + r"""
status, p = jit.build(spec, ctx, quiet=True)
print(json.dumps({"status": status, "module": p.describe()}))
"""

MEASURE = SETUP + r"""
import time
from kiln.runtime import key, metadata
t0 = time.perf_counter()
p = build.plan(spec, ctx)
t1 = time.perf_counter()
verify = getattr(jit, "verify", None)
if verify is not None:
    entry = verify(p)
    md, reason = entry.md, entry.reason
else:  # a kiln before verified loads
    md, reason = jit.check(p)
t2 = time.perf_counter()
assert reason is None, reason
jit._load_published(p, md, p.key_dir)
t3 = time.perf_counter()
lib = p.key_dir / md.library
key.file_digest(lib)
t4 = time.perf_counter()
metadata.read(p.key_dir)
t5 = time.perf_counter()
assert not any(d.changed() for d in md.deps)
t6 = time.perf_counter()
(verify or jit.check)(p)
t7 = time.perf_counter()
ms = lambda a, b: round((b - a) * 1e3, 4)
print(json.dumps({"plan": ms(t0, t1), "verify": ms(t1, t2), "load": ms(t2, t3),
                  "digest": ms(t3, t4), "metadata": ms(t4, t5), "deps": ms(t5, t6),
                  "again": ms(t6, t7), "library_bytes": lib.stat().st_size,
                  "metadata_bytes": (p.key_dir / "metadata.json").stat().st_size,
                  "headers": len(md.deps), "module": p.describe()}))
"""


def _child(code: str, module: tuple, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(module)], capture_output=True,
                          text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{module}: child failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", required=True, help="KILN_WORKSPACE_BASE to build into and load from")
    ap.add_argument("--runs", type=int, default=15, help="fresh processes per module")
    ap.add_argument("--kiln", help="another kiln checkout to measure (its python/ goes first on "
                                   "PYTHONPATH)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    env = dict(os.environ, KILN_WORKSPACE_BASE=str(Path(args.workspace).absolute()))
    if args.kiln:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.kiln, "python").absolute()),
                                             env.get("PYTHONPATH", "")])
    results = []
    for module in MODULES:
        built = _child(BUILD, module, env)
        runs = [_child(MEASURE, module, env) for _ in range(args.runs)]
        row = {"module": built["module"], "runs": args.runs, "library_bytes": runs[0]["library_bytes"],
               "metadata_bytes": runs[0]["metadata_bytes"], "headers": runs[0]["headers"]}
        for part in ("plan", "verify", "load", "digest", "metadata", "deps", "again"):
            values = [r[part] for r in runs]
            row[part] = {"median_ms": round(statistics.median(values), 3),
                         "min_ms": round(min(values), 3), "max_ms": round(max(values), 3)}
        results.append(row)
        print(f"{row['module']:<64} {row['library_bytes'] / 1e6:6.2f} MB  verify "
              f"{row['verify']['median_ms']:.3f} ms (digest {row['digest']['median_ms']:.3f}, "
              f"metadata {row['metadata']['median_ms']:.3f}, headers {row['deps']['median_ms']:.3f}"
              f"; again {row['again']['median_ms']:.3f}); plan {row['plan']['median_ms']:.1f}, "
              f"load {row['load']['median_ms']:.1f} ms", flush=True)
    out = {"kiln": args.kiln or str(Path(__file__).resolve().parents[1]), "cores": os.cpu_count(),
           "timing": "time.perf_counter in a fresh process per run; median, min, max of --runs",
           "modules": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
