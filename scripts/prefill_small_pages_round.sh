#!/usr/bin/env bash
# The GPU round of the sm90a prefill kernel's gather producer (pages under 16 tokens, odd page
# sizes, strides TMA rejects; docs/perf/prefill-sm90.md), in one device call of at most ~230 s:
# install kiln, build the prefill modules for 9.0a (and the framework-free self-test beside them),
# the new GPU tests first, then the existing prefill, index-error and sanitizer GPU tests (all
# under pytest -m gpu -n 4; the fa3 cases with KILN_PREFILL_FA3_STRICT=1 inside the tests), then
# the small-page benchmark (fa2 / fa3 / auto, strict, so fa3 cannot silently be fa2). Every log
# and JSON file goes into ONE tarball, $OUT/results.tgz, written even when a step hangs:
#
#   steps.log            each step's start (s since the start) and its summary line
#   gpu.txt              nvidia-smi's view of the GPU
#   selftest.log         tests/cuda/prefill_sm90_selftest.cu (max error and its position per case)
#   prebuild.log         python -m codegen build of the modules
#   pytest_new.log       tests/ops/attention/test_prefill_small_pages.py
#   pytest_prefill.log   test_prefill.py, test_index_errors.py, test_sanitizer.py
#   small_pages.jsonl    python -m benchmarks.prefill_backends --cases small-pages (records)
#   small_pages.md       its table
#
#   cd <repo> && SKIP_PEERS=1 bash scripts/prefill_small_pages_round.sh
#
# DEADLINE (s after the start, default 225) bounds every step; BENCH_RESERVE (default 55) is kept
# for the benchmark when the tests run long. SKIP_SELFTEST / SKIP_TESTS / SKIP_BENCH=1 leave a step
# out; SKIP_PEERS=1 installs no FlashInfer (its JIT takes minutes; this round does not use it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
LOG=/tmp/small-pages-logs
mkdir -p "$OUT" "$LOG"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
DEADLINE=${DEADLINE:-225}
BENCH_RESERVE=${BENCH_RESERVE:-55}
elapsed() { echo $(($(date +%s) - t0)); }
left() { local l=$((DEADLINE - $(elapsed) - ${1:-0})); [ "$l" -gt 1 ] && echo "$l" || echo 1; }
step() { echo "== [$(elapsed) s] $*" | tee -a "$LOG/steps.log"; }
finish() {
  step "done (status $status)"
  tar -czf "$OUT/results.tgz" -C "$LOG" . 2>/dev/null
}
trap finish EXIT

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
  >"$LOG/gpu.txt" 2>&1
step "install"
. scripts/device_setup.sh
peers=1
[ -n "${SKIP_PEERS:-}" ] && peers=0
install_kiln_and_peers /tmp/small_pages_setup.log "$peers"

if [ -z "${SKIP_SELFTEST:-}" ]; then  # compiles beside the prebuild, runs after it
  nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
    tests/cuda/prefill_sm90_selftest.cu -o /tmp/sm90_selftest >"$LOG/selftest.log" 2>&1 &
  selftest_pid=$!
fi

step "prebuild //ops/attention:prefill for 9.0a (the tests and the benchmark load from the cache)"
timeout "$(left)" python3 -m codegen build //ops/attention:prefill --toolchain cuda --arch-list 9.0a -j 16 \
  >"$LOG/prebuild.log" 2>&1 || status=1
grep -E "summary|failed" "$LOG/prebuild.log" | tee -a "$LOG/steps.log"
# The other attention targets the index-error and sanitizer tests load, built while the new tests run.
timeout "$(left)" python3 -m codegen build //ops:attention --toolchain cuda -j 8 >>"$LOG/prebuild.log" 2>&1 &
rest_pid=$!

if [ -n "${selftest_pid:-}" ]; then
  step "self-test (tests/cuda/prefill_sm90_selftest.cu)"
  if wait "$selftest_pid"; then
    timeout "$(left)" /tmp/sm90_selftest >>"$LOG/selftest.log" 2>&1 || status=1
  else
    status=1
  fi
  grep -E "FAIL|fail|gather|all ok|TFLOP" "$LOG/selftest.log" | head -n 20 | tee -a "$LOG/steps.log"
fi

workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
run_tests() {  # log, files...
  local log=$1
  shift
  step "pytest -m gpu $* ${workers[*]}"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left "$BENCH_RESERVE")" python3 -m pytest -m gpu -q \
    -p no:cacheprovider "${workers[@]}" "$@" >"$LOG/$log" 2>&1 || status=1
  tail -n 1 "$LOG/$log" | sed 's/^/pytest: /' | tee -a "$LOG/steps.log"
}
if [ -z "${SKIP_TESTS:-}" ]; then
  run_tests pytest_new.log tests/ops/attention/test_prefill_small_pages.py
  wait "$rest_pid" || status=1
  grep -E "summary" "$LOG/prebuild.log" | tail -n 1 | tee -a "$LOG/steps.log"
  run_tests pytest_prefill.log tests/ops/attention/test_prefill.py tests/ops/attention/test_index_errors.py \
    tests/ops/attention/test_sanitizer.py
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  step "benchmark: python -m benchmarks.prefill_backends --cases small-pages (KILN_PREFILL_FA3_STRICT=1)"
  KILN_PREFILL_FA3_STRICT=1 timeout "$(left)" python3 -m benchmarks.prefill_backends --cases small-pages \
    --output "$LOG/small_pages.jsonl" >"$LOG/small_pages.md" 2>"$LOG/small_pages.err" || status=1
  cat "$LOG/small_pages.md" | tee -a "$LOG/steps.log"
  tail -n 3 "$LOG/small_pages.err" | tee -a "$LOG/steps.log"
fi
exit $status
