#!/usr/bin/env bash
# FlashInfer's re-created tests (tests/flashinfer) on the device machine, in one call: install kiln,
# run them under `pytest -m gpu` in pytest-xdist workers with a junit XML, summarise the run per
# module (scripts/flashinfer_compat.py: $OUT/h200.json, committed as tests/flashinfer/results/
# h200.json), then kiln's own GPU tests named in EXTRA_TESTS. Everything lands in $OUT/results.tgz.
#
#   bash scripts/flashinfer_round.sh [pytest args, default: tests/flashinfer]
#
# TEST_WORKERS (default 8) xdist workers; pytest's --sample N / MODULE=N (tests/conftest.py) keeps
# every N-th case of each test for a quick round, per module if asked; EXTRA_TESTS="tests/ops/norm ..." kiln's own GPU tests
# after the re-created ones (EXTRA_WORKERS, default TEST_WORKERS); FI_SECONDS caps the re-created
# tests' step, leaving the rest of the deadline to EXTRA_TESTS; DEADLINE (s, default 540)
# bounds every step, so whatever finished is kept. The JIT cache is $KILN_WORKSPACE_BASE (a warm
# machine keeps it between calls). The summary records each module's sample rate, whether the step
# stopped at its time limit, and ROUND_COMMIT (the commit the tree is; default the checkout's HEAD,
# which on the device machine is the tool's own commit of the copied tree).
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=540 . scripts/round_common.sh
. scripts/device_setup.sh
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 \
  | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
install_kiln_and_peers "$OUT/setup.log" 0
export KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE
workers=${TEST_WORKERS:-8}
args=("$@"); [ ${#args[@]} -eq 0 ] && args=(tests/flashinfer)

step "pytest -m gpu ${args[*]} ($workers workers)"
# SIGINT at the deadline: pytest stops and still writes the junit XML of what finished.
budget=$(left); [ -n "${FI_SECONDS:-}" ] && [ "$FI_SECONDS" -lt "$budget" ] && budget=$FI_SECONDS
timeout -s INT -k 30 "$budget" python3 -m pytest -m gpu "${args[@]}" -n "$workers" -q -p no:cacheprovider \
  --durations=25 --junitxml="$OUT/flashinfer_gpu.xml" >"$OUT/pytest_flashinfer.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
stopped=(); [ $rc -eq 124 ] && stopped=(--stopped)
tail -n 30 "$OUT/pytest_flashinfer.log"
if [ -s "$OUT/flashinfer_gpu.xml" ]; then
  python3 scripts/flashinfer_compat.py summarise "$OUT/flashinfer_gpu.xml" --device h200 \
    "${stopped[@]}" ${ROUND_COMMIT:+--commit "$ROUND_COMMIT"} --out "$OUT/h200.json" | tee -a "$OUT/steps.log"
fi

if [ -n "${EXTRA_TESTS:-}" ]; then
  step "pytest -m gpu $EXTRA_TESTS"
  # shellcheck disable=SC2086  # a list of paths and -k filters
  timeout -s INT -k 30 "$(left)" python3 -m pytest -m gpu $EXTRA_TESTS -n "${EXTRA_WORKERS:-$workers}" -q \
    -p no:cacheprovider >"$OUT/pytest_extra.log" 2>&1 || status=1
  tail -n 30 "$OUT/pytest_extra.log"
fi
step "done (status $status)"
exit $status
