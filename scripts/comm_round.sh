#!/usr/bin/env bash
# The communication family's single-H200 round (one device call, at most ~200 s): install kiln,
# prebuild //ops:norm for this GPU (the fused fallback calls kiln.fused_add_rmsnorm), build and run
# the all-reduce kernels' self-test (tests/cuda/comm_selftest.cu: 2 and 4 ranks' buffers on this
# GPU, two processes through cudaIpc handles, a barrier timeout, kernel times), then
# `pytest -m gpu tests/ops/comm` (the self-test again under pytest, and two ranks of CustomAllReduce on
# this GPU through kiln's kernels over CUDA IPC) and the CPU tests of tests/ops/comm. No 2-GPU
# machine is lent: nothing here measures NVLink or compares with NCCL. Everything goes to $OUT,
# and into ONE $OUT/results.tgz (only a few files come back):
#
#   steps.log        each step's start (s since the start), the GPU, the summaries
#   selftest.log     the self-test's PASS/FAIL lines and its TIME lines (same-GPU kernel times)
#   pytest_gpu.log   pytest -m gpu tests/ops/comm (4 xdist workers when pytest-xdist imports)
#   pytest_cpu.log   the CPU tests of tests/ops/comm (host backend, 2-4 processes)
#   results.jsonl    one JSON line per self-test TIME line (algo, bytes, median_us, timing)
#
#   bash scripts/comm_round.sh
#
#   pytest_definitions.log  the committed definitions of fused_allreduce_add_rmsnorm on the GPU
#   bench.jsonl / bench.log the routine in a world of one rank (kiln fused vs all_reduce + norm)
#
# SKIP_CPU=1 / SKIP_BENCH=1 leave the CPU tests / the benchmark out. DEADLINE (s after the start, default 200) bounds every step
# after the install.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
# NVLink multicast stays off, in this shell and every process it starts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
t0=$(date +%s)
DEADLINE=${DEADLINE:-200}
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { local l=$(( DEADLINE - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/steps.log"; }
finish() {
  step "done (status $status)"
  (cd "$OUT" && tar czf results.tgz --exclude=results.tgz ./*.log ./*.jsonl 2>/dev/null)
  exit $status
}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,compute_mode --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/comm_setup.log 0
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"

step "prebuild //ops:comm and //ops:norm (cuda) in the background"
(timeout "$(left)" python3 -m codegen build //ops:comm --toolchain cuda -j 4 &&
  timeout "$(left)" python3 -m codegen build //ops:norm --toolchain cuda -j 4) >/tmp/comm_norm_build.log 2>&1 &
norm_pid=$!

step "build and run tests/cuda/comm_selftest.cu"
cc=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}' + ('a' if m == 9 else ''))")
if timeout "$(left)" nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DKILN_COMM_PROBE \
    "-gencode=arch=compute_$cc,code=sm_$cc" -I. tests/cuda/comm_selftest.cu -o /tmp/comm_selftest \
    >"$OUT/selftest.log" 2>&1; then
  timeout "$(( $(left) < 90 ? $(left) : 90 ))" /tmp/comm_selftest >>"$OUT/selftest.log" 2>&1 || status=1
else
  status=1
fi
grep -E "^(FAIL|ALL PASSED|FAILED)" "$OUT/selftest.log" | tee -a "$OUT/steps.log"
python3 - "$OUT/selftest.log" "$OUT/results.jsonl" <<'PY'
import json, re, sys
pat = re.compile(r"TIME (\S+) (\S+) (\d+) bytes W=(\d+) same GPU \((.*)\): ([\d.]+) us")
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        m = pat.search(line)
        if m:
            out.write(json.dumps({"algo": m[1], "dtype": m[2], "bytes": int(m[3]), "world": int(m[4]),
                                  "timing": m[5], "median_us": float(m[6]),
                                  "note": "all ranks on one GPU: HBM, not NVLink"}) + "\n")
PY

wait "$norm_pid" || { status=1; tail -n 20 /tmp/comm_norm_build.log; }
grep -E "summary" /tmp/comm_norm_build.log | tee -a "$OUT/steps.log"

workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
step "pytest -m gpu tests/ops/comm ${workers[*]}"
KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider \
  "${workers[@]}" tests/ops/comm 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest gpu: /' >>"$OUT/steps.log"

step "pytest -m gpu tests/trace/test_definitions_e2e.py -k fused_allreduce (a world of one rank)"
timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/trace/test_definitions_e2e.py \
  -k fused_allreduce 2>&1 | tee "$OUT/pytest_definitions.log" | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ -z "${SKIP_BENCH:-}" ] && [ "$(left)" -gt 30 ]; then
  step "benchmarks: fused_allreduce_add_rmsnorm, one rank (kiln, kiln_unfused)"
  timeout "$(( $(left) - 20 ))" python3 -m benchmarks run fused_allreduce_add_rmsnorm --backends kiln,kiln_unfused \
    --shapes llama-3.1-70b-decode:tokens=1 --shapes llama-3.1-70b-decode:tokens=128 --repeats 20 --target-ms 1 \
    --output "$OUT/bench.jsonl" </dev/null >"$OUT/bench.log" 2>&1 || status=1
  tail -n 12 "$OUT/bench.log" | tee -a "$OUT/steps.log"
fi

if [ -z "${SKIP_CPU:-}" ]; then
  step "pytest tests/ops/comm (CPU)"
  timeout "$(left)" python3 -m pytest -m "not gpu" -q -p no:cacheprovider tests/ops/comm 2>&1 \
    | tee "$OUT/pytest_cpu.log" | tail -n 5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_cpu.log" | sed 's/^/pytest cpu: /' >>"$OUT/steps.log"
fi
finish
