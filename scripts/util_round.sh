#!/usr/bin/env bash
# The utility families' GPU round on the device machine (an H200, 16 cores), in one call of at most
# ~200 s: install kiln (and the peers carried in .peers/), prebuild the utility targets for this
# GPU, their GPU tests, then their benchmark routines with torch and FlashInfer side by side. Logs
# and results go to $OUT:
#
#   steps.log        each step's start (s since the start), the GPU, and the summaries below
#   pytest_gpu.log   pytest -m gpu over the families' tests (4 xdist workers when pytest-xdist imports)
#   util.jsonl       every benchmark record (kiln, torch, FlashInfer), each after a reference check
#   bench.log        the harness's tables and summaries, routine by routine
#   results.md       the Markdown table of util.jsonl
#
#   bash scripts/util_round.sh [pytest args, default: the families' test folders]
#
# SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_PEERS=1 leave a step out; TARGETS narrows the prebuild.
# ROUTINES (default: every utility routine) and SHAPES (default: 1, 64 and 8192 tokens of
# Llama-3.1-8B; --shapes values) narrow the benchmarks; REPEATS (default 20) and TARGET_MS
# (default 1) size each measurement. DEADLINE (s after the start, default 200) bounds every step
# after the install: whatever finished is kept.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
DEADLINE=${DEADLINE:-200}
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { local l=$(( DEADLINE - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/steps.log"; }
note() { echo "$*" | tee -a "$OUT/steps.log"; }
TARGETS=${TARGETS:-"//ops:activation //ops:rope //ops:norm //ops:quantization"}
TESTS="tests/ops/activation tests/ops/rope tests/ops/norm/test_layernorm.py tests/ops/quantization"
ROUTINES=${ROUTINES:-"silu_and_mul gelu_and_mul gelu_tanh_and_mul apply_rope_with_cos_sin_cache_inplace \
apply_rope_pos_ids_inplace apply_llama31_rope apply_rope layernorm per_token_group_quant_fp8 scaled_fp8_quant"}
# The issue's shapes: 1 and 64 tokens (decode) and 8192 (prefill) of Llama-3.1-8B.
DEFAULT_SHAPES="llama-3.1-8b-decode:tokens=1 llama-3.1-8b-decode:tokens=64 llama-3.1-8b-prefill:tokens=8192"
INDPTR_SHAPES="llama-3.1-8b-decode:tokens=1,batch_size=1 llama-3.1-8b-decode:tokens=64,batch_size=64 \
llama-3.1-8b-prefill:tokens=8192,batch_size=8"
shapes_for() {  # routine -> the --shapes values (SHAPES overrides every routine's)
  if [ -n "${SHAPES:-}" ]; then echo "$SHAPES"; return; fi
  case $1 in
    apply_rope | apply_rope_inplace | apply_llama31_rope | apply_llama31_rope_inplace) echo "$INDPTR_SHAPES" ;;
    layernorm) echo "llama-3.1-8b-decode:tokens=1 llama-3.1-8b-prefill:tokens=8192 tokens=16384,hidden=8192" ;;
    *) echo "$DEFAULT_SHAPES" ;;
  esac
}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/util_setup.log "${PEERS:-1}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"

# 1. Every module of the families for this GPU (11 modules: the four targets built side by side, 4
#    compile jobs each); the tests and benchmarks then load them from the cache.
step "prebuild $TARGETS (cuda, every dtype)"
pids=()
for t in $TARGETS; do
  log=/tmp/util_prebuild_${t##*:}.log
  timeout "$(left)" python3 -m codegen build "$t" --toolchain cuda -j 4 >"$log" 2>&1 &
  pids+=("$!")
done
for i in "${!pids[@]}"; do
  t=$(echo $TARGETS | cut -d' ' -f$((i + 1)))
  wait "${pids[$i]}" || { status=1; tail -n 40 "/tmp/util_prebuild_${t##*:}.log"; }
  grep -E "built|summary" "/tmp/util_prebuild_${t##*:}.log" | tee -a "$OUT/steps.log"
done

# 2. The GPU tests (small shapes: 4 workers share the GPU's memory with room to spare).
if [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  # shellcheck disable=SC2086
  step "pytest -m gpu ${*:-$TESTS} ${workers[*]}"
  # shellcheck disable=SC2086
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider \
    "${workers[@]}" ${*:-$TESTS} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi

# 3. Benchmarks: kiln and torch, then FlashInfer with what time is left. Routines sharing their
#    shapes run in one process (each start imports torch: seconds).
if [ -z "${SKIP_BENCH:-}" ]; then
  : >"$OUT/util.jsonl"
  run_bench() {  # comma-separated routines, backends, shapes
    [ -n "$1" ] || return
    [ "$(left)" -gt 5 ] || { note "skipped $1 ($2): past the deadline"; return; }
    step "benchmarks: $1 ($2)"
    local shapes=(); for s in $3; do shapes+=(--shapes "$s"); done
    timeout "$(left)" python3 -m benchmarks run "$1" --backends "$2" "${shapes[@]}" --repeats "${REPEATS:-20}" \
      --target-ms "${TARGET_MS:-1}" --output /tmp/util_run.jsonl </dev/null >>"$OUT/bench.log" 2>&1 || status=1
    cat /tmp/util_run.jsonl >>"$OUT/util.jsonl" 2>/dev/null
  }
  groups() {  # backends: one line per shape group, "routines|shapes"
    local plain="" indptr="" ln=""
    for r in $ROUTINES; do
      case $1:$r in
        flashinfer:per_token_group_quant_fp8 | flashinfer:scaled_fp8_quant) ;;  # no FlashInfer peer
        *:apply_rope | *:apply_rope_inplace | *:apply_llama31_rope | *:apply_llama31_rope_inplace)
          indptr=${indptr:+$indptr,}$r ;;
        *:layernorm) ln=$r ;;
        *) plain=${plain:+$plain,}$r ;;
      esac
    done
    echo "$plain|$(shapes_for "$plain")"
    echo "$indptr|$(shapes_for apply_rope)"
    echo "$ln|$(shapes_for layernorm)"
  }
  while IFS='|' read -r rs sh; do run_bench "$rs" kiln,torch "$sh"; done < <(groups kiln)
  if [ -z "${SKIP_PEERS:-}" ] && [ "${have_peers:-0}" = 1 ]; then
    while IFS='|' read -r rs sh; do run_bench "$rs" flashinfer "$sh"; done < <(groups flashinfer)
  fi
  python3 -m benchmarks table --markdown "$OUT/util.jsonl" >"$OUT/results.md" 2>&1 || status=1
  python3 - "$OUT/util.jsonl" <<'PY' | tee -a "$OUT/steps.log"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {}
for r in recs:
    by[r["status"]] = by.get(r["status"], 0) + 1
print("benchmark records:", by)
for r in recs:
    if r["status"] == "failed":
        print("FAILED", r["routine"], r["backend"], r["axes"], (r.get("error") or "")[:200])
PY
fi

step "done (status $status)"
exit $status
