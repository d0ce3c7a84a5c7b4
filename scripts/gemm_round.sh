#!/usr/bin/env bash
# The GEMM family's GPU round on the device machine (an H200, 16 cores), in one call of at most
# ~300 s: install kiln (and the peers carried in .peers/), the cold compile of one GEMM
# specialisation alone on every core, prebuild //ops:gemm, the GEMM GPU tests, the warm first call
# in a fresh process, and the GEMM benchmark routines with their torch peers side by side
# (FlashInfer after them, with the time left). Logs and results go to $OUT, six files at most:
#
#   steps.log        each step's start (s since the start), the GPU, and the summaries below
#   compile.json     cold compile (s, per module measured) and warm first call (ms, per API)
#   pytest_gpu.log   pytest -m gpu tests/ops/gemm (4 xdist workers when pytest-xdist imports)
#   gemm.jsonl       every benchmark record (kiln, torch, FlashInfer), each after a reference check
#   bench.log        the harness's tables and summaries, routine by routine
#   results.md       the Markdown table of gemm.jsonl
#
#   bash scripts/gemm_round.sh [pytest args, default tests/ops/gemm]
#
# SKIP_COLD=1 / SKIP_TESTS=1 / SKIP_WARM=1 / SKIP_BENCH=1 / SKIP_PEERS=1 leave a step out.
# COLD_MODULES (default "mm:bf16"; e.g. "mm:bf16 fp8:e4m3 grouped:bf16") picks what the cold
# compile measures. ROUTINES (default every GEMM routine) and SHAPES (default: each routine's
# committed definitions; e.g. "llama-3.1-8b-prefill") narrow the benchmarks; REPEATS (default 20)
# and TARGET_MS (default 1) size each measurement. DEADLINE (s after the start, default 290)
# bounds the benchmark steps: whatever finished is kept.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
DEADLINE=${DEADLINE:-290}
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { local l=$(( DEADLINE - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/steps.log"; }
note() { echo "$*" | tee -a "$OUT/steps.log"; }
ROUTINES=${ROUTINES:-"mm_bf16 bmm_bf16 bmm_fp8 gemm_fp8_nt_groupwise segment_gemm grouped_mm"}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/gemm_setup.log "${PEERS:-1}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"

# 1. Cold compile of one specialisation, alone, with every core: an empty workspace each time.
echo "{" >"$OUT/compile.json"
if [ -z "${SKIP_COLD:-}" ]; then
  step "cold compile: ${COLD_MODULES:-mm:bf16} (sm_90a, -j $(nproc))"
  rm -f /tmp/gemm_cold.jsonl
  for spec in ${COLD_MODULES:-mm:bf16}; do
    python3 benchmarks/compile_modules.py --label "//ops/gemm:${spec%%:*}" --set "dtype=${spec##*:}" \
      --toolchain cuda --arch-list 9.0a --jobs "$(nproc)" --out /tmp/gemm_cold.jsonl 2>&1 | tail -n 2 |
      tee -a "$OUT/steps.log" || status=1
  done
  echo "\"cold\": [$(paste -sd, /tmp/gemm_cold.jsonl 2>/dev/null)]," >>"$OUT/compile.json"
fi

# 2. Every GEMM module for this GPU, in parallel; the tests and benchmarks then load from the cache.
step "prebuild //ops:gemm (cuda, every dtype)"
python3 -m codegen build //ops:gemm --toolchain cuda >/tmp/gemm_prebuild.log 2>&1 || { status=1; tail -n 40 /tmp/gemm_prebuild.log; }
grep -E "built|summary" /tmp/gemm_prebuild.log | tee -a "$OUT/steps.log"

# FlashInfer compiles its GEMM modules on first use: warm them in the background during the tests.
warm_pid=
if [ -z "${SKIP_PEERS:-}" ] && [ -z "${SKIP_BENCH:-}" ] && [ "${have_peers:-0}" = 1 ]; then
  ( timeout "$(left)" python3 - >/tmp/gemm_warm_peers.log 2>&1 <<'PY'
import time

import torch

from benchmarks import definitions, harness
from benchmarks.routine import SetupContext
from benchmarks.routines import ROUTINES
from benchmarks.selection import select

dev, dtype = torch.device("cuda"), "bfloat16"
for name in ("mm_bf16", "bmm_bf16", "bmm_fp8", "gemm_fp8_nt_groupwise", "segment_gemm"):
    r = ROUTINES[name]
    d = definitions.load(name)[0]
    case = select(r, [d], ["small"])[0]
    inputs = r.template.build_inputs(case.axes, dtype, dev, seed=1, scalars=case.scalars)
    expected = r.template.run_reference(inputs)
    for b in r.backends:
        if b.name.startswith("flashinfer") and not b.available(dev, dtype):
            start = time.perf_counter()
            check = harness.check_backend(r.template, b, inputs, expected, SetupContext(dev, dtype, case.axes))
            print(f"{name} {b.name}: {check['status']} in {time.perf_counter() - start:.1f} s {check.get('message', '')}")
PY
  ) &
  warm_pid=$!
fi

# 3. The GPU tests of the family (small shapes: 4 workers share the GPU's memory with room to spare).
if [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  step "pytest -m gpu ${*:-tests/ops/gemm} ${workers[*]}"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q \
    -p no:cacheprovider "${workers[@]}" "${@:-tests/ops/gemm}" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi

# 4. The warm first call: a fresh process on the prebuilt workspace (import timed apart).
if [ -z "${SKIP_WARM:-}" ]; then
  step "warm first call (fresh processes, 3 each)"
  python3 - >>"$OUT/compile.json" 2>/tmp/gemm_warm.err <<'PY' || { status=1; cat /tmp/gemm_warm.err; }
import json, statistics, subprocess, sys

CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch, kiln
from kiln.runtime import jit
t1 = time.perf_counter()
api = sys.argv[1]
getattr(kiln, api)  # kiln's lazy import of the API module (kiln.gemm), timed apart
t1b = time.perf_counter()
d, bf = "cuda", torch.bfloat16
if api == "mm_bf16":
    a, b = torch.randn(16, 4096, device=d, dtype=bf), torch.randn(4096, 4096, device=d, dtype=bf).t()
    call = lambda: kiln.mm_bf16(a, b)
elif api == "bmm_fp8":
    A = torch.randn(1, 256, 4096, device=d).to(torch.float8_e4m3fn)
    B = torch.randn(1, 4096, 4096, device=d).to(torch.float8_e4m3fn).transpose(1, 2)
    s = torch.ones(1, device=d)
    call = lambda: kiln.bmm_fp8(A, B, s, s, bf)
else:
    x, w = torch.randn(512, 2048, device=d, dtype=bf), torch.randn(8, 3072, 2048, device=d, dtype=bf)
    offs = torch.arange(1, 9, device=d, dtype=torch.int32) * 64
    call = lambda: kiln.grouped_mm(x, w.transpose(1, 2), offs)
torch.cuda.synchronize()
t2 = time.perf_counter()
call()
torch.cuda.synchronize()
t3 = time.perf_counter()
call()
torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "api_import_ms": (t1b - t1) * 1e3, "first_call_ms": (t3 - t2) * 1e3, "second_call_ms": (t4 - t3) * 1e3,
                  "compiled": jit.stats.compiled, "disk_hits": jit.stats.disk_hits}))
'''
out = {}
for api in ("mm_bf16", "bmm_fp8", "grouped_mm"):
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD, api], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(3)]
    assert all(r["compiled"] == 0 for r in runs), runs
    out[api] = {"first_call_ms_median": statistics.median(r["first_call_ms"] for r in runs), "runs": runs}
    print(f"{api}: first call {out[api]['first_call_ms_median']:.1f} ms (median of 3; import "
          f"{statistics.median(r['import_s'] for r in runs):.2f} s and kiln.gemm "
          f"{statistics.median(r['api_import_ms'] for r in runs):.1f} ms apart)", file=sys.stderr)
print(f'"warm": {json.dumps(out)},')
PY
  cat /tmp/gemm_warm.err | tee -a "$OUT/steps.log"
fi
echo '"done": true}' >>"$OUT/compile.json"

if [ -n "$warm_pid" ]; then
  step "waiting for FlashInfer's JIT modules"
  wait "$warm_pid"; grep -v " - INFO - " /tmp/gemm_warm_peers.log | tail -n 8 | tee -a "$OUT/steps.log"
fi

# 5. Benchmarks: kiln and torch first, routine by routine, then FlashInfer with what time is left.
if [ -z "${SKIP_BENCH:-}" ]; then
  : >"$OUT/gemm.jsonl"
  shapes=(); for s in ${SHAPES:-}; do shapes+=(--shapes "$s"); done
  run_bench() {  # routine backends
    [ "$(left)" -gt 5 ] || { note "skipped $1 ($2): past the deadline"; return; }
    timeout "$(left)" python3 -m benchmarks run "$1" --backends "$2" "${shapes[@]}" --repeats "${REPEATS:-20}" \
      --target-ms "${TARGET_MS:-1}" --output /tmp/gemm_run.jsonl >>"$OUT/bench.log" 2>&1 || status=1
    cat /tmp/gemm_run.jsonl >>"$OUT/gemm.jsonl" 2>/dev/null
  }
  for r in $ROUTINES; do
    case $r in
      mm_bf16 | bmm_bf16) peers=kiln,torch ;;
      bmm_fp8) peers=kiln,torch_scaled_mm ;;
      gemm_fp8_nt_groupwise) peers=kiln,torch_dequant ;;
      segment_gemm) peers=kiln,torch_grouped_mm,torch_loop ;;
      grouped_mm) peers=kiln,torch_grouped_mm,torch_loop ;;
      *) note "unknown routine $r"; status=1; continue ;;
    esac
    step "benchmarks: $r ($peers)"
    run_bench "$r" "$peers"
  done
  if [ -z "${SKIP_PEERS:-}" ] && [ "${have_peers:-0}" = 1 ]; then
    for r in $ROUTINES; do
      [ "$r" = grouped_mm ] && continue  # no FlashInfer peer
      step "benchmarks: $r (flashinfer)"
      run_bench "$r" flashinfer
    done
  fi
  python3 -m benchmarks table --markdown "$OUT/gemm.jsonl" >"$OUT/results.md" 2>&1 || status=1
  python3 - "$OUT/gemm.jsonl" <<'PY' | tee -a "$OUT/steps.log"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {}
for r in recs:
    by.setdefault(r["status"], 0)
    by[r["status"]] += 1
print("benchmark records:", by)
for r in recs:
    if r["status"] == "failed":
        print("FAILED", r["routine"], r["backend"], r["axes"], (r.get("error") or "")[:200])
PY
fi

step "done (status $status)"
exit $status
