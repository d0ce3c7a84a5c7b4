#!/usr/bin/env bash
# Decode's GPU round on the device machine (an H200, 16 cores), in one call of at most ~240 s:
# install kiln (and the peers carried in .peers/ unless PEERS=0), prebuild the decode and append
# modules (bf16 and f16 queries, 16-bit and e4m3 caches, every head_dim) for this GPU, the
# attention GPU tests that cover decode, append and cascade (fp8 included, compute-sanitizer's
# cases too), then benchmarks/decode_fp8.py: kiln's bf16 and fp8 caches and torch's SDPA side by
# side, eager and CUDA graphs, and FlashInfer's with what time is left. Logs and results go to
# $OUT and into ONE $OUT/results.tgz:
#
#   steps.log         each step's start (s since the start), the GPU, and the summaries below
#   selftest.log      tests/cuda/decode_selftest.cu: correctness cases against a float64 reference,
#                     then the issue's shapes timed (eager and CUDA graph) and reference-checked
#   selftest_baseline.log  the same of an earlier tree, when .baseline/ holds its ops/ (carried
#                     beside the tree; not part of it): two kernel versions on the same inputs
#   ncu_{now,baseline}.txt  with NCU=1: Nsight Compute's details of the decode launches of the
#                     self-test's profile mode (batch 64 x 4096 and 1 x 4096, bf16 and fp8 caches)
#   pytest_gpu.log    pytest -m gpu of the decode/append tests (4 xdist workers)
#   decode_fp8.jsonl  every decode benchmark record, each after a reference check
#   prefill_fp8.jsonl benchmarks/prefill_fp8.py: paged prefill over the fp8 cache's staged copy
#   bench.log         the benchmark's progress and errors
#
#   bash scripts/decode_round.sh [pytest args]
#
# SKIP_SELFTEST=1 / SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_PEERS=1 leave a step out; NCU=1 adds the
# Nsight Compute step; WORKLOADS (default "64x4096
# 256x2048 1x4096 1x32768") picks the decode shapes, MIN_CHUNKS (e.g. "256 128") times kiln at
# each split-KV minimum chunk. DEADLINE (s after the start, default 230)
# bounds every step after the install: whatever finished is kept.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=230 . scripts/round_common.sh
WORKLOADS=${WORKLOADS:-"64x4096 256x2048 1x4096 1x32768"}
TESTS=(tests/ops/attention/test_fp8_kv.py tests/ops/attention/test_decode.py
       tests/ops/attention/test_merge_and_page.py tests/ops/attention/test_sanitizer.py
       tests/ops/attention/test_index_errors.py tests/ops/attention/test_compile.py
       tests/ops/attention/test_cascade_attention.py)

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
# The self-test (and an earlier tree's, from .baseline/) compiles while kiln installs.
# VARIANTS="name:-DFLAG=1 ..." also builds this tree's self-test with those flags (kernel
# experiments), benchmarked after the others into selftest_<name>.log.
selftest_build() {  # tree, binary, log, [nvcc flags]
  (cd "$1" && nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -I. ${4:-} \
    "$OLDPWD/tests/cuda/decode_selftest.cu" -o "$2") >"$3" 2>&1
}
variant_pids=() variant_names=()
if [ -z "${SKIP_SELFTEST:-}" ]; then
  selftest_build . /tmp/decode_selftest "$OUT/selftest.log" &
  selftest_pid=$!
  for v in ${VARIANTS:-}; do
    selftest_build . "/tmp/decode_selftest_${v%%:*}" "$OUT/selftest_${v%%:*}.log" "${v#*:}" &
    variant_pids+=($!) variant_names+=("${v%%:*}")
  done
  if [ -d .baseline/ops ]; then
    selftest_build .baseline /tmp/decode_selftest_baseline "$OUT/selftest_baseline.log" &
    baseline_pid=$!
  fi
fi
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/decode_setup.log "$([ -n "${SKIP_PEERS:-}" ] && echo 0 || echo "${PEERS:-1}")"

step "prebuild //ops/attention:decode and :page (cuda; the prefill modules the tests use build on first use)"
for t in //ops/attention:decode //ops/attention:page; do
  timeout "$(left)" python3 -m codegen build "$t" --toolchain cuda -j 16 >/tmp/decode_prebuild.log 2>&1 \
    || { status=1; tail -n 40 /tmp/decode_prebuild.log; }
  grep -E "summary" /tmp/decode_prebuild.log | sed "s|^|$t: |" | tee -a "$OUT/steps.log"
done

if [ -n "${selftest_pid:-}" ]; then
  # Each tree's check, then the two benchmarks interleaved (now, baseline, now), so drift shows.
  runs=(now)
  [ -n "${baseline_pid:-}" ] && wait "$baseline_pid" && runs=(now baseline now)
  for i in "${!variant_pids[@]}"; do
    wait "${variant_pids[$i]}" && runs+=("${variant_names[$i]}")
  done
  if wait "$selftest_pid"; then
    step "self-test: check"
    timeout "$(left)" /tmp/decode_selftest check >>"$OUT/selftest.log" 2>&1 || status=1
    grep -E "^FAIL|^check:" "$OUT/selftest.log" | tee -a "$OUT/steps.log"
    for run in "${runs[@]}"; do
      bin=/tmp/decode_selftest log=$OUT/selftest.log
      [ "$run" = now ] || bin=/tmp/decode_selftest_$run log=$OUT/selftest_$run.log
      step "self-test bench: $run"
      timeout "$(left)" "$bin" bench >>"$log" 2>&1 || status=1
      grep -E "^(bf16|fp8 ) " "$log" | grep -v "us)" | tail -n 8 | tee -a "$OUT/steps.log"
    done
    if [ -n "${NCU:-}" ]; then
      for run in "${runs[@]:0:2}"; do
        bin=/tmp/decode_selftest
        [ "$run" = now ] || bin=/tmp/decode_selftest_$run
        step "ncu: $run (self-test profile mode)"
        timeout "$(left)" ncu --clock-control none --kernel-name regex:decode_paged --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
          --section SchedulerStats --section ComputeWorkloadAnalysis "$bin" profile >"$OUT/ncu_$run.txt" 2>&1 || status=1
        grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy" \
          "$OUT/ncu_$run.txt" | tee -a "$OUT/steps.log"
      done
    fi
  else
    status=1
    tail -n 20 "$OUT/selftest.log"
  fi
fi

if [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  step "pytest -m gpu ${*:-${TESTS[*]}} ${workers[*]}"
  # shellcheck disable=SC2086
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider \
    "${workers[@]}" ${*:-${TESTS[*]}} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  summary() {
    python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(r['workload'], r['backend'], r['kv_cache'], r.get('min_chunk') or '', 'graph' if r['cuda_graph'] else 'eager',
          round(r['median_us'], 1), 'us', round(r['tb_per_s'], 2), 'TB/s')
" "$1" 2>/dev/null | tee -a "$OUT/steps.log"
  }
  step "benchmarks/decode_fp8.py ($WORKLOADS)"
  # shellcheck disable=SC2086
  timeout "$(left)" python3 benchmarks/decode_fp8.py --workloads $WORKLOADS ${MIN_CHUNKS:+--min-chunk $MIN_CHUNKS} \
    --out "$OUT/decode_fp8.jsonl" \
    </dev/null >>"$OUT/bench.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench.log"; }
  summary "$OUT/decode_fp8.jsonl"
  if [ "$(left)" -gt 20 ]; then
    step "benchmarks/prefill_fp8.py"
    timeout "$(left)" python3 benchmarks/prefill_fp8.py --out "$OUT/prefill_fp8.jsonl" </dev/null >>"$OUT/bench.log" 2>&1 \
      || { status=1; tail -n 20 "$OUT/bench.log"; }
    python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(r['workload'], r['kv_cache'], round(r['median_us'], 1), 'us', round(r['tflops']), 'TFLOP/s')
" "$OUT/prefill_fp8.jsonl" 2>/dev/null | tee -a "$OUT/steps.log"
  fi
  if [ -z "${SKIP_PEERS:-}" ] && [ "${have_peers:-0}" = 1 ] && [ "$(left)" -gt 20 ]; then
    step "benchmarks/decode_fp8.py --peers (FlashInfer's JIT builds on first use: may be cut off)"
    timeout "$(left)" python3 benchmarks/decode_fp8.py --peers --workloads 64x4096 1x4096 \
      --out "$OUT/decode_fp8_peers.jsonl" </dev/null >>"$OUT/bench.log" 2>&1 || note "peers run incomplete"
    summary "$OUT/decode_fp8_peers.jsonl"
  fi
fi

step "done (status $status)"
exit $status
