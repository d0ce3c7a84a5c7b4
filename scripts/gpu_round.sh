#!/usr/bin/env bash
# One GPU round on the device machine, in one call: install kiln (editable, no deps), run the GPU
# tests, the benchmarks and the compile-time measurement, and leave logs and results in $OUT.
#
#   bash scripts/gpu_round.sh [pytest args...]
#
# SKIP_COMPILE_TIME=1 / SKIP_GPU_TESTS=1 / SKIP_HARNESS=1 / SKIP_GRAPH_BENCH=1 leave out the
# steps that did not change.
#
# Peers carried as wheels in .peers/ are installed for the benchmarks: FlashInfer (a backend) and
# cupti-python (CUPTI kernel timing; without it the harness times with CUDA events).
# Harness results: $OUT/results.jsonl (eager) and $OUT/results_graph.jsonl (CUDA graphs), their
# tables in bench.log / bench_graph.log and results.md, and results.png when matplotlib imports.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if ls .peers/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl >>"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a
fi

echo "== prebuild every module for this GPU (parallel; the tests then load from the cache)"
python3 -m codegen build //ops/... >"$OUT/prebuild.log" 2>&1 || { status=1; tail -n 40 "$OUT/prebuild.log"; }
tail -n 2 "$OUT/prebuild.log"

if [ -z "${SKIP_COMPILE_TIME:-}" ]; then
  echo "== compile time"
  python3 benchmarks/compile_time.py --device cuda --out "$OUT/compile_time.json" >"$OUT/compile_time.log" 2>&1 || status=1
  tail -n 30 "$OUT/compile_time.log"
fi

if [ -z "${SKIP_GPU_TESTS:-}" ]; then
  echo "== pytest -m gpu"
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -z "${SKIP_HARNESS:-}" ]; then
  # Every routine at every committed definition's workloads, each backend checked first.
  echo "== benchmarks: python -m benchmarks run all (eager)"
  python3 -m benchmarks run all --output "$OUT/results.jsonl" >"$OUT/bench.log" 2>&1 || status=1
  tail -n 12 "$OUT/bench.log"
  files=("$OUT/results.jsonl")
  if [ -z "${SKIP_GRAPH_BENCH:-}" ]; then
    # GRAPH_ROUTINES (default all): the routines worth replaying in CUDA graphs this round.
    echo "== benchmarks: python -m benchmarks run ${GRAPH_ROUTINES:-all} --cuda-graph"
    : >"$OUT/results_graph.jsonl"
    for r in ${GRAPH_ROUTINES:-all}; do
      python3 -m benchmarks run "$r" --cuda-graph --output "$OUT/graph_$r.jsonl" >>"$OUT/bench_graph.log" 2>&1 || status=1
      cat "$OUT/graph_$r.jsonl" >>"$OUT/results_graph.jsonl" 2>/dev/null; rm -f "$OUT/graph_$r.jsonl"
    done
    tail -n 12 "$OUT/bench_graph.log"
    files+=("$OUT/results_graph.jsonl")
  fi
  python3 -m benchmarks table --markdown "${files[@]}" >"$OUT/results.md" 2>&1 || status=1
  python3 -m benchmarks plot "${files[@]}" -o "$OUT/results.png" 2>&1 | tail -n 2
fi

exit $status
