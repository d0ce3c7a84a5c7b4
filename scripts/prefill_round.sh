#!/usr/bin/env bash
# The prefill kernels' GPU round on the device machine, in one call of at most ~230 s: install
# kiln, build the prefill modules for 9.0a (and the framework-free sm90a self-test beside them),
# the prefill GPU tests (fa2, and fa3 under KILN_PREFILL_FA3_STRICT=1 inside the tests), the
# index-error and the prefill compute-sanitizer tests, then the benchmarks: the harness's single
# prefill (8192 and 2048 tokens) and batch paged prefill (16 x 2048, page 16) for kiln (auto),
# fa2, fa3 and SDPA, and the page-size sweep (fa2 / fa3 / auto). Every log and JSON file goes into
# ONE tarball, $OUT/results.tgz, written even when a step hangs (scripts/round_common.sh):
#
#   steps.log            each step's start (s since the start) and its summary line
#   gpu.txt              nvidia-smi's view of the GPU
#   selftest.log         tests/cuda/prefill_sm90_selftest.cu: every case against a float64
#                        reference; timings of the issue shape, the KV producers and the grids
#   selftest_baseline.log  the same of an earlier tree, when .baseline/ holds its ops/ and
#                        tests/cuda/ (carried beside the tree; not part of it)
#   prebuild.log         python -m codegen build of the modules
#   pytest_prefill.log   test_prefill.py, test_prefill_small_pages.py
#   pytest_checks.log    test_index_errors.py, the prefill cases of test_sanitizer.py
#   single_prefill.jsonl, batch_prefill.jsonl   python -m benchmarks run (records)
#   bench.log            the harness's tables
#   sweep.jsonl, sweep.md                       python -m benchmarks.prefill_backends --cases small-pages
#
#   cd <repo> && bash scripts/prefill_round.sh
#
# DEADLINE (s after the start, default 230) bounds every step; BENCH_RESERVE (default 70) is kept
# for the benchmarks when the tests run long. SKIP_SELFTEST / SKIP_TESTS / SKIP_BENCH / SKIP_SWEEP=1
# leave a step out; PEERS=1 also installs FlashInfer from .peers/ (its fa3 JIT takes minutes);
# VARIANTS=1 also builds the fa2 variants' modules (custom mask, RoPE, ALiBi) and runs
# test_prefill_variants.py (give it DEADLINE=540: 60 more modules).
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=230 . scripts/round_common.sh
BENCH_RESERVE=${BENCH_RESERVE:-70}
left_for() { local l=$(($(left) - $1)); [ "$l" -gt 1 ] && echo "$l" || echo 1; }  # left, less a reserve

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
  >"$OUT/gpu.txt" 2>&1
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/prefill_setup.log "${PEERS:-0}"

if [ -z "${SKIP_SELFTEST:-}" ]; then  # compiles beside the prebuild, runs after it
  nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
    tests/cuda/prefill_sm90_selftest.cu -o /tmp/sm90_selftest >"$OUT/selftest.log" 2>&1 &
  selftest_pid=$!
  # An earlier tree's self-test (its ops/ and tests/cuda/ carried in .baseline/), run in the same
  # call: the same shapes timed on the kernel before and after a change.
  if [ -f .baseline/tests/cuda/prefill_sm90_selftest.cu ]; then
    (cd .baseline && nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
      tests/cuda/prefill_sm90_selftest.cu -o /tmp/sm90_selftest_baseline) >"$OUT/selftest_baseline.log" 2>&1 &
    baseline_pid=$!
  fi
fi

step "prebuild //ops/attention:prefill for 9.0a (the tests and the benchmarks load from the cache)"
# The plain modules; the variants' (custom mask, RoPE, ALiBi: 60 more) only with VARIANTS=1.
timeout "$(left)" python3 -m codegen build //ops/attention:prefill --toolchain cuda --arch-list 9.0a -j 16 \
  --set custom_mask=false --set pos_encoding=none >"$OUT/prebuild.log" 2>&1 || status=1
if [ -n "${VARIANTS:-}" ]; then
  for variant in "--set custom_mask=true" "--set custom_mask=false --set pos_encoding=rope,alibi"; do
    # shellcheck disable=SC2086  # two --set options
    timeout "$(left)" python3 -m codegen build //ops/attention:prefill --toolchain cuda --arch-list 9.0a -j 16 \
      $variant >>"$OUT/prebuild.log" 2>&1 || status=1
  done
fi
grep -E "summary|failed" "$OUT/prebuild.log" | tee -a "$OUT/steps.log"
# The other attention targets the index-error and sanitizer tests load, built while the prefill tests run.
(for t in //ops/attention:decode //ops/attention:cascade //ops/attention:page //ops/attention:positions; do
  timeout "$(left)" python3 -m codegen build "$t" --toolchain cuda -j 8 || exit 1
done) >>"$OUT/prebuild.log" 2>&1 &
rest_pid=$!

if [ -n "${selftest_pid:-}" ]; then
  step "self-test (tests/cuda/prefill_sm90_selftest.cu)"
  if wait "$selftest_pid"; then
    timeout "$(left_for "$BENCH_RESERVE")" /tmp/sm90_selftest >>"$OUT/selftest.log" 2>&1 || status=1
  else
    status=1
  fi
  grep -E "FAIL|fail|DIFFER|all ok|TFLOP|identical" "$OUT/selftest.log" | head -n 40 | tee -a "$OUT/steps.log"
  if [ -n "${baseline_pid:-}" ] && wait "$baseline_pid"; then
    step "self-test of .baseline/ (the earlier tree)"
    timeout "$(left_for "$BENCH_RESERVE")" /tmp/sm90_selftest_baseline >>"$OUT/selftest_baseline.log" 2>&1
    grep -E "all ok|FAIL|TFLOP" "$OUT/selftest_baseline.log" | head -n 20 | tee -a "$OUT/steps.log"
  fi
fi

workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
run_tests() {  # log, pytest arguments...
  local log=$1
  shift
  step "pytest -m gpu $* ${workers[*]}"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left_for "$BENCH_RESERVE")" python3 -m pytest -m gpu -q \
    -p no:cacheprovider "${workers[@]}" "$@" >"$OUT/$log" 2>&1 || status=1
  tail -n 1 "$OUT/$log" | sed 's/^/pytest: /' | tee -a "$OUT/steps.log"
}
if [ -z "${SKIP_TESTS:-}" ]; then
  variants=()
  [ -n "${VARIANTS:-}" ] && variants=(tests/ops/attention/test_prefill_variants.py)
  run_tests pytest_prefill.log tests/ops/attention/test_prefill.py tests/ops/attention/test_prefill_small_pages.py \
    "${variants[@]}"
  wait "$rest_pid" || status=1
  grep -E "summary" "$OUT/prebuild.log" | tail -n 1 | tee -a "$OUT/steps.log"
  run_tests pytest_checks.log tests/ops/attention/test_index_errors.py tests/ops/attention/test_sanitizer.py -k \
    "prefill or index"
else
  wait "$rest_pid" || status=1
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  backends=kiln,kiln_fa2,kiln_fa3,torch_sdpa
  [ "${have_peers:-0}" = 1 ] && backends+=,flashinfer
  for routine in single_prefill batch_prefill; do
    shapes=(--shapes llama-3.1-8b-prefill:batch_size=16,qo_len=2048)
    [ "$routine" = single_prefill ] && shapes=(--shapes llama-3.1-8b-prefill:qo_len=8192 --shapes
      llama-3.1-8b-prefill:qo_len=2048)
    step "benchmarks: $routine ${shapes[*]} ($backends; KILN_PREFILL_FA3_STRICT=1)"
    KILN_PREFILL_FA3_STRICT=1 timeout "$(left_for 40)" python3 -m benchmarks run "$routine" --backends "$backends" \
      "${shapes[@]}" --output "$OUT/$routine.jsonl" >>"$OUT/bench.log" 2>&1 || status=1
    tail -n 14 "$OUT/bench.log" | tee -a "$OUT/steps.log"
  done
fi

if [ -z "${SKIP_SWEEP:-}" ]; then
  step "sweep: python -m benchmarks.prefill_backends --cases small-pages (KILN_PREFILL_FA3_STRICT=1)"
  KILN_PREFILL_FA3_STRICT=1 timeout "$(left)" python3 -m benchmarks.prefill_backends --cases small-pages \
    --output "$OUT/sweep.jsonl" >"$OUT/sweep.md" 2>"$OUT/sweep.err" || status=1
  tee -a "$OUT/steps.log" <"$OUT/sweep.md"
  tail -n 3 "$OUT/sweep.err" | tee -a "$OUT/steps.log"
fi
step "done (status $status)"
exit $status
