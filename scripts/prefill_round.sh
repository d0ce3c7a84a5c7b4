#!/usr/bin/env bash
# The prefill kernels' GPU round on the device machine, in one call: install kiln (and the peers
# carried in .peers/), the framework-free sm90a self-test, prebuild //ops:attention, the prefill
# GPU tests (fa2, and fa3 strict), and the issue's two benchmark shapes against SDPA and
# FlashInfer. Results, test and self-test logs go to $OUT (steps.log has each step's wall time).
#
#   bash scripts/prefill_round.sh [pytest args, default tests/ops/attention/test_prefill.py]
#
# SKIP_SELFTEST=1 / SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_SWEEP=1 leave a step out; BENCH_ROUTINES
# (default "single_prefill batch_prefill") picks the harness benchmarks; PEERS=0 leaves FlashInfer
# out. The sweep is benchmarks/prefill_backends.py (fa2 vs fa3 vs auto over head dims, masks,
# lengths and page sizes). At most 8 files come back from a device call, so the setup and
# benchmark logs stay in /tmp (their tails are printed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
step() { echo "== [$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/steps.log"; }

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/setup.log "${PEERS:-1}"
backends_single=kiln,kiln_fa2,kiln_fa3,torch_sdpa
backends_batch=kiln,kiln_fa2,kiln_fa3,torch_sdpa
if [ "$have_peers" = 1 ]; then
  backends_single+=,flashinfer_fa3
  backends_batch+=,flashinfer
fi

if [ -z "${SKIP_SELFTEST:-}" ]; then
  step "self-test (tests/cuda/prefill_sm90_selftest.cu)"
  nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
    tests/cuda/prefill_sm90_selftest.cu -o /tmp/sm90_selftest >"$OUT/selftest.log" 2>&1 &&
    timeout 120 /tmp/sm90_selftest >>"$OUT/selftest.log" 2>&1 || status=1
  grep -c " ok$" "$OUT/selftest.log"; grep -E "FAIL|failed|timing|TFLOP" "$OUT/selftest.log" | head -n 20
fi

step "prebuild //ops:attention"
python3 -m codegen build //ops:attention >>/tmp/setup.log 2>&1 || { status=1; tail -n 40 /tmp/setup.log; }

if [ -z "${SKIP_TESTS:-}" ]; then
  step "pytest -m gpu ${*:-tests/ops/attention/test_prefill.py}"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -q -x \
    -p no:cacheprovider "${@:-tests/ops/attention/test_prefill.py}" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  for routine in ${BENCH_ROUTINES:-single_prefill batch_prefill}; do
    case $routine in
      single_prefill) shape=llama-3.1-8b-prefill:qo_len=8192 backends=$backends_single ;;
      batch_prefill) shape=llama-3.1-8b-prefill:batch_size=16,qo_len=2048 backends=$backends_batch ;;
      *) echo "unknown routine $routine"; status=1; continue ;;
    esac
    step "benchmarks: $routine $shape ($backends)"
    timeout "${BENCH_TIMEOUT:-300}" python3 -m benchmarks run "$routine" --backends "$backends" --shapes "$shape" \
      --output "$OUT/$routine.jsonl" >"/tmp/$routine.log" 2>&1 || status=1
    tail -n 12 "/tmp/$routine.log"
  done
fi

if [ -z "${SKIP_SWEEP:-}" ]; then
  step "sweep: python -m benchmarks.prefill_backends"
  timeout "${SWEEP_TIMEOUT:-300}" python3 -m benchmarks.prefill_backends --output "$OUT/backends.jsonl" \
    >"$OUT/backends.md" 2>/tmp/backends.err || { status=1; tail -n 20 /tmp/backends.err; }
  cat "$OUT/backends.md"
fi

step "done (status $status)"
exit $status
