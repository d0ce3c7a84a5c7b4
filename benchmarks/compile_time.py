"""Cold compile and warm load of a kiln module, each in a fresh process.

cold: an empty workspace; the first kiln.rmsnorm call compiles the module (nvcc + g++ + link),
      publishes it and loads it.
warm: a new process on the same workspace; the first call validates the cached artifact's
      metadata and loads it (no compiler runs).
Times are wall clock of the first call (synchronised), measured inside the child process; the
import of torch and kiln is timed separately. The children run with Python's byte-code cache on
(PYTHONDONTWRITEBYTECODE removed), as an installed package does: the cold run writes kiln's .pyc
files, and each run reports whether kiln.norm came from one ("bytecode"). Without byte-code the
first call also compiles every kiln module it imports from source.

    python benchmarks/compile_time.py --device cuda --out compile_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time, sys
t0 = time.perf_counter()
import torch, kiln
from kiln.runtime import jit
t1 = time.perf_counter()
dev = sys.argv[1]
x = torch.randn(64, 4096, device=dev).bfloat16(); w = torch.randn(4096, device=dev).bfloat16()
if dev == "cuda": torch.cuda.synchronize()
t2 = time.perf_counter()
kiln.rmsnorm(x, w)
if dev == "cuda": torch.cuda.synchronize()
t3 = time.perf_counter()
import os, kiln.norm
print(json.dumps({"import_s": t1 - t0, "first_call_s": t3 - t2, "compiled": jit.stats.compiled,
                  "disk_hits": jit.stats.disk_hits,
                  "bytecode": bool(kiln.norm.__cached__ and os.path.exists(kiln.norm.__cached__))}))
"""


def run(device: str, ws: str) -> dict:
    # as an installed package runs: with byte-code (the first run writes what is missing)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["KILN_WORKSPACE_BASE"] = ws
    proc = subprocess.run([sys.executable, "-c", CHILD, device], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as ws:
        cold = run(args.device, ws)
        warm = [run(args.device, ws) for _ in range(3)]
    assert cold["compiled"] == 1 and all(w["compiled"] == 0 and w["disk_hits"] == 1 for w in warm)
    result = {"module": f"norm_dtype_bf16_{'cuda' if args.device == 'cuda' else 'host'}",
              "device": args.device, "cores": os.cpu_count(), "cold": cold, "warm": warm,
              "timing": "wall clock of the first call in a fresh process (synchronised)"}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
