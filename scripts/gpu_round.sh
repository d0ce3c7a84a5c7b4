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
# SKIP_HOST_OVERHEAD=1 leaves out the per-call host cost (benchmarks/host_overhead.py).
#
# COMPILE_TABLE=1: cold compile of one specialisation of every attention module with -j (the cores),
# for this tree and for .baseline/ (an older tree carried in .baseline, if present), into
# $OUT/compile_table.jsonl. PACKAGE=1: the CUDA precompiled package of //ops/... for this GPU's
# arch, built from the prebuilt cache with kiln's own wheel, installed apart from the editable
# checkout (pip --target), and the GPU tests of norm and attention run from it outside the
# repository with KILN_DISABLE_JIT=1 (nothing may compile: the check fails otherwise); then
# PACKAGE_ONLY=1 leaves those tests out of the editable `pytest -m gpu` step. OVERHEAD=1: decode
# B64 L4096 and single prefill 8192 timed for this tree and .baseline/, alternately
# (benchmarks/bounds_overhead.py), into $OUT/overhead.jsonl.
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

if [ -n "${COMPILE_TABLE:-}" ]; then
  step "compile table (one specialisation per attention module, -j $(nproc))"
  arch=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}.{n}' + ('a' if (m, n) == (9, 0) else ''))")
  for tree in . .baseline; do
    [ -d "$tree/ops" ] || continue
    python3 benchmarks/compile_modules.py --root "$tree" --label //ops:attention --set dtype=bf16 \
      --set head_dim=128 --set soft_cap=false --arch-list "$arch" --out "$OUT/compile_table.jsonl" 2>&1 | tail -n 8
  done
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

workers=(); [ -n "${TEST_WORKERS:-}" ] && workers=(-n "$TEST_WORKERS")
if [ -n "${PACKAGE:-}" ]; then
  step "precompiled package: build for this GPU, install apart, GPU tests of norm and attention from it"
  # The device's own arch, as the prebuild used it (a target declaring sm90a still builds 9.0a):
  # every module then comes from the prebuilt cache.
  arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
  pkg=/tmp/kiln-pkg; rm -rf "$pkg"; mkdir -p "$pkg/dist"
  ( python3 -m release build --arch-list "$arch" //ops/... --out "$pkg/dist" &&
    python3 -m pip wheel -q --no-deps --no-build-isolation -w "$pkg/dist" . &&
    python3 -m pip install -q --no-deps --no-index --target "$pkg/site" "$pkg"/dist/*.whl ) >"$OUT/package.log" 2>&1 \
    || { status=1; tail -n 30 "$OUT/package.log"; }
  mkdir -p "$pkg/run" && cp -r tests pyproject.toml "$pkg/run/"
  ( cd "$pkg/run" && export PYTHONPATH="$pkg/site${PYTHONPATH:+:$PYTHONPATH}" &&
    python3 -c "import kiln, sys; assert '$pkg/site' in kiln.__file__, kiln.__file__" &&
    KILN_TEST_WORKSPACE="$pkg/test-ws" KILN_TEST_DISABLE_JIT=1 timeout "${TEST_TIMEOUT:-420}" \
      python3 -m pytest -m gpu -q -p no:cacheprovider "${workers[@]}" tests/ops/norm tests/ops/attention 2>&1 ) \
    | tee "$OUT/pytest_gpu_package.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if [ -e "$pkg/test-ws/artifacts" ] || [ -e "$pkg/test-ws/generated" ]; then
    echo "package: the tests compiled something; the precompiled package did not serve every module"; status=1
  fi
fi

if [ -z "${SKIP_GPU_TESTS:-}" ]; then
  ignore=(); [ -n "${PACKAGE_ONLY:-}" ] && ignore=(--ignore=tests/ops/norm --ignore=tests/ops/attention)
  step "pytest -m gpu ${ignore[*]} $*"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "${TEST_TIMEOUT:-420}" \
    python3 -m pytest -m gpu -q -p no:cacheprovider "${workers[@]}" "${ignore[@]}" "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "${OVERHEAD:-}" ] && [ -d .baseline/ops ]; then
  step "index-check overhead: this tree and .baseline, alternately"
  for round in 1 2; do
    for tree in . .baseline; do
      KILN_WORKSPACE_BASE=/tmp/kiln-ws-overhead-$(basename "$(realpath "$tree")") \
        timeout 240 python3 benchmarks/bounds_overhead.py --root "$tree" --out "$OUT/overhead.jsonl" 2>&1 | tail -n 2
    done
  done
fi

if [ -z "${SKIP_HOST_OVERHEAD:-}" ]; then
  # Per-call host cost of the small ops beside torch's eager op (docs/perf/host-overhead.md).
  step "host overhead: benchmarks/host_overhead.py --device cuda"
  timeout 120 python3 benchmarks/host_overhead.py --device cuda --out "$OUT/host_overhead.jsonl" 2>&1 | tail -n 6
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
