#!/usr/bin/env bash
# One GPU round on the device machine, in one call: install kiln (editable, no deps), run the GPU
# tests, the benchmarks and the compile-time measurement, and leave logs and results in $OUT.
#
#   bash scripts/gpu_round.sh [pytest args...]
#
# SKIP_COMPILE_TIME=1 / SKIP_GPU_TESTS=1 / SKIP_HARNESS=1 / SKIP_GRAPH_BENCH=1 leave out the
# steps that did not change; SKIP_PREBUILD=1 too (a warm machine already holds the modules).
# PREBUILD_SET="head_dim=128 soft_cap=false" prebuilds only those specialisations (--set per word;
# default every module of //ops/...); the tests use the same cache (KILN_TEST_WORKSPACE).
# TEST_TIMEOUT (s, default 420) bounds the tests, TEST_WORKERS=N runs them in N pytest-xdist
# processes. WARM_PEERS=1 builds the peers' JIT modules (FlashInfer) in the background while the
# tests run, so the benchmarks do not wait for them (logged in setup.log); WARM_ROUTINES="a b"
# limits that to those routines.
# ROUTINES (default all): what the eager `run` covers, `all` or a comma-separated list in order;
# GRAPH_ROUTINES (default all) likewise for --cuda-graph. DEADLINE (s after the start, default
# none) stops each benchmark run there; its JSON lines keep every result that finished.
# SKIP_RENDER=1 leaves results.md / results.png to be made from the JSON lines elsewhere.
#
# Peers carried as wheels in .peers/ are installed for the benchmarks: FlashInfer (a backend) and
# cupti-python (CUPTI kernel timing; without it the harness times with CUDA events).
# Harness results: $OUT/results.jsonl (eager) and $OUT/results_graph.jsonl (CUDA graphs), their
# tables in bench.log / bench_graph.log and results.md, and results.png when matplotlib imports.
# steps.log records each step's wall time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/steps.log"; }
# seconds left before DEADLINE, at least 1 (a large number without one)
left() {
  if [ -z "${DEADLINE:-}" ]; then echo 100000; return; fi
  local l=$(( DEADLINE - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 1
}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
step "install"
. scripts/device_setup.sh
install_kiln_and_peers "$OUT/setup.log"

if [ -z "${SKIP_PREBUILD:-}" ]; then
  sets=(); for s in ${PREBUILD_SET:-}; do sets+=(--set "$s"); done
  step "prebuild //ops/... ${PREBUILD_SET:-} (parallel; the tests and benchmarks then load from the cache)"
  python3 -m codegen build //ops/... "${sets[@]}" >>"$OUT/setup.log" 2>&1 || { status=1; tail -n 40 "$OUT/setup.log"; }
  tail -n 2 "$OUT/setup.log"
fi

if [ -z "${SKIP_COMPILE_TIME:-}" ]; then
  step "compile time"
  python3 benchmarks/compile_time.py --device cuda --out "$OUT/compile_time.json" >"$OUT/compile_time.log" 2>&1 || status=1
  tail -n 30 "$OUT/compile_time.log"
fi

warm_pid=
if [ -n "${WARM_PEERS:-}" ] && [ -z "${SKIP_HARNESS:-}" ]; then
  # One small check per definition and peer backend: builds the JIT modules the run will load.
  timeout "$(left)" python3 - >"$OUT/warm_peers.log" 2>&1 <<'PY' &
import os
import time

import torch

from benchmarks import definitions, harness
from benchmarks.routine import SetupContext
from benchmarks.routines import ROUTINES
from benchmarks.selection import select

dev, dtype = torch.device("cuda"), "bfloat16"
only = [n for n in os.environ.get("WARM_ROUTINES", "").replace(",", " ").split() if n]
for name, r in ROUTINES.items():
    if only and name not in only:
        continue
    peers = [b for b in r.backends if b.name.startswith("flashinfer")]
    if not peers or dtype not in r.template.dtypes:
        continue
    for d in definitions.load(name):
        case = select(r, [d], ["small"])[0]
        inputs = r.template.build_inputs(case.axes, dtype, dev, seed=1, scalars=case.scalars)
        expected = r.template.run_reference(inputs)
        for b in peers:
            if b.available(dev, dtype):
                continue
            start = time.perf_counter()
            check = harness.check_backend(r.template, b, inputs, expected, SetupContext(dev, dtype, case.axes))
            print(f"{name} {d.example} {b.name}: {check['status']} in {time.perf_counter() - start:.1f} s")
PY
  warm_pid=$!
fi

if [ -z "${SKIP_GPU_TESTS:-}" ]; then
  step "pytest -m gpu $*"
  workers=(); [ -n "${TEST_WORKERS:-}" ] && workers=(-n "$TEST_WORKERS")
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "${TEST_TIMEOUT:-420}" \
    python3 -m pytest -m gpu -q -p no:cacheprovider "${workers[@]}" "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "$warm_pid" ]; then
  step "waiting for the peers' JIT modules"
  wait "$warm_pid"; grep -v " - INFO - " "$OUT/warm_peers.log" | tail -n 20
  cat "$OUT/warm_peers.log" >>"$OUT/setup.log"; rm -f "$OUT/warm_peers.log"
fi

if [ -z "${SKIP_HARNESS:-}" ]; then
  # Every routine at every committed definition's workloads, each backend checked first.
  step "benchmarks: python -m benchmarks run ${ROUTINES:-all} (eager)"
  timeout "$(left)" python3 -m benchmarks run "${ROUTINES:-all}" --output "$OUT/results.jsonl" >"$OUT/bench.log" 2>&1 || status=1
  tail -n 12 "$OUT/bench.log"
  files=("$OUT/results.jsonl")
  if [ -z "${SKIP_GRAPH_BENCH:-}" ] && [ "$(left)" -gt 30 ]; then
    # GRAPH_ROUTINES (default all): the routines worth replaying in CUDA graphs this round.
    graph=$(echo "${GRAPH_ROUTINES:-all}" | tr ' ' ',')
    step "benchmarks: python -m benchmarks run $graph --cuda-graph"
    timeout "$(left)" python3 -m benchmarks run "$graph" --cuda-graph --output "$OUT/results_graph.jsonl" >"$OUT/bench_graph.log" 2>&1 || status=1
    tail -n 12 "$OUT/bench_graph.log"
    files+=("$OUT/results_graph.jsonl")
  fi
  if [ -z "${SKIP_RENDER:-}" ]; then
    python3 -m benchmarks table --markdown "${files[@]}" >"$OUT/results.md" 2>&1 || status=1
    python3 -m benchmarks plot "${files[@]}" -o "$OUT/results.png" 2>&1 | tail -n 2
  fi
fi

step "done (status $status)"
exit $status
