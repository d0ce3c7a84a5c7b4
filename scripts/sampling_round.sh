#!/usr/bin/env bash
# The sampling family's GPU round on the device machine (an H200, 16 cores), in one call of at most
# ~240 s: install kiln, a cold build of //ops:sampling for this GPU (its time is the
# compile-time target), the family's GPU tests, then the benchmark routines against torch's
# samplers (FlashInfer only with FLASHINFER=1: its sampling JIT ran past 290 s on this machine).
# Everything lands in $OUT and is packed into ONE $OUT/results.tgz:
#
#   steps.log        each step's start (s since the start), the GPU, the build time, summaries
#   build.log        the cold build of every //ops:sampling module (cuda)
#   pytest_gpu.log   pytest -m gpu over tests/ops/sampling and the sampling definitions
#   sampling.jsonl   every benchmark record, each after a reference check
#   bench.log        the harness's tables, routine by routine
#   results.md       the Markdown table of sampling.jsonl
#
#   bash scripts/sampling_round.sh
#
# SOFTMAX_ONLY=1: softmax alone (its tests, its kernel's resource usage, float32 and bfloat16 at every
# batch of its definition), then the host overhead per call on CUDA (benchmarks/host_overhead.py,
# with the rmsnorm and softmax breakdowns) into $OUT/host_overhead.jsonl, and the first call of
# kiln.rmsnorm in fresh processes, cold and warm (benchmarks/compile_time.py) into
# $OUT/compile_time.json. With FLASHINFER=1 FlashInfer's sampling module
# compiles in the background from the start (at most FLASHINFER_WARM_S, default 300 s), and the
# FlashInfer backend runs last if it finished.
# SKIP_TESTS=1 / SKIP_BENCH=1 leave a step out; REPEATS (default 20) and TARGET_MS (default 1)
# size each measurement; DEADLINE (s after the start, default 225) bounds every step after the
# install: whatever finished is kept.
set -uo pipefail
cd "$(dirname "$0")/.."
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws-sampling}
DEADLINE_DEFAULT=225 . scripts/round_common.sh

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/sampling_setup.log "${FLASHINFER:-0}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"
if [ -n "${SOFTMAX_ONLY:-}" ] && [ "${have_peers:-0}" = 1 ]; then
  (timeout "${FLASHINFER_WARM_S:-300}" python3 -c "
import torch, flashinfer
x = torch.randn(2, 128256, device='cuda')
flashinfer.sampling.softmax(x); torch.cuda.synchronize(); print('flashinfer sampling module ready')
" >/tmp/fi_warm.log 2>&1 && touch /tmp/fi_ready) &
fi

# 1. A cold build of the three modules (a fresh workspace): one job per module, then the f32
#    module alone timed again from an empty build directory (the "cold compile" target).
step "cold build //ops:sampling (cuda)"
rm -rf "$KILN_WORKSPACE_BASE"
timeout "$(left)" python3 -m codegen build //ops:sampling --toolchain cuda -j 3 >"$OUT/build.log" 2>&1 || status=1
grep -E "built|FAILED|summary" "$OUT/build.log" | tee -a "$OUT/steps.log"
if [ -n "${SOFTMAX_ONLY:-}" ]; then
  for so in $(find "$KILN_WORKSPACE_BASE" -name 'sampling_dtype_*_cuda*.so'); do
    cuobjdump --dump-resource-usage "$so" 2>&1 | grep -A1 softmax_cluster | grep -o "REG:[0-9]*.*" \
      | sed "s|^|$(basename "$so" | cut -d. -f1) softmax_cluster_kernel: |" | tee -a "$OUT/steps.log"
  done
fi
s=$(date +%s.%N)
timeout "$(left)" python3 -m codegen build //ops:sampling --toolchain cuda --set dtype=f32 --force -j 1 \
  >>"$OUT/build.log" 2>&1 || status=1
note "cold compile, f32 module, one job: $(python3 -c "import time; print(f'{time.time() - $s:.1f} s')")"

# 2. The GPU tests, and the committed sampling definitions at their real workloads.
if [ -z "${SKIP_TESTS:-}" ] && [ -n "${SOFTMAX_ONLY:-}" ]; then
  step "pytest -m gpu: softmax (tests/ops/sampling, FlashInfer's test_sampling)"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 \
    tests/ops/sampling tests/flashinfer/test_sampling.py -k "softmax or test_cuda" 2>&1 \
    | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
elif [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  step "pytest -m gpu tests/ops/sampling + sampling definitions ${workers[*]}"
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider \
    "${workers[@]}" tests/ops/sampling tests/trace/test_definitions_e2e.py \
    -k "not definition or sampl or softmax or renorm or mask_logits" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi

# 3. Benchmarks: the target shape first (float32 and bfloat16 logits, batch 1 / 64 / 256, both
#    torch samplers side by side), then every other routine at batch 1 and 256.
if [ -z "${SKIP_BENCH:-}" ]; then
  : >"$OUT/sampling.jsonl"
  run_bench() {  # routines, backends, dtype, shapes...
    local routines=$1 backends=$2 dtype=$3; shift 3
    [ "$(left)" -gt 5 ] || { note "skipped $routines ($backends, $dtype): past the deadline"; return; }
    step "benchmarks: $routines ($backends, $dtype)"
    local shapes=(); for s in "$@"; do shapes+=(--shapes "$s"); done
    timeout "$(left)" python3 -m benchmarks run "$routines" --backends "$backends" --dtype "$dtype" "${shapes[@]}" \
      --repeats "${REPEATS:-20}" --target-ms "${TARGET_MS:-1}" --output /tmp/sampling_run.jsonl </dev/null \
      >>"$OUT/bench.log" 2>&1 || status=1
    cat /tmp/sampling_run.jsonl >>"$OUT/sampling.jsonl" 2>/dev/null
  }
  B3=(llama-3.1-8b-decode:batch_size=1 llama-3.1-8b-decode:batch_size=64 llama-3.1-8b-decode:batch_size=256)
  B2=(llama-3.1-8b-decode:batch_size=1 llama-3.1-8b-decode:batch_size=256)
  peers=kiln,torch
  if [ -n "${SOFTMAX_ONLY:-}" ]; then
    ALL=(); for b in 1 16 64 128 256; do ALL+=("llama-3.1-8b-decode:batch_size=$b"); done
    run_bench softmax kiln,torch f32 "${ALL[@]}"
    run_bench softmax kiln,torch bf16 "${ALL[@]}"
    if [ -e /tmp/fi_ready ]; then
      run_bench softmax kiln,torch,flashinfer f32 "${B3[@]}"
    else
      note "FlashInfer's sampling module not ready ($(tail -n 1 /tmp/fi_warm.log 2>/dev/null)): no FlashInfer softmax"
    fi
  else
  [ "${have_peers:-0}" = 1 ] && peers=$peers,flashinfer
  run_bench top_k_top_p_sampling_from_logits "$peers,torch_topk" f32 "${B3[@]}"
  run_bench top_k_top_p_sampling_from_logits "$peers,torch_topk" bf16 "${B3[@]}"
  run_bench softmax,sampling_from_probs,sampling_from_logits,top_k_sampling_from_probs,top_p_sampling_from_probs,\
min_p_sampling_from_probs,top_k_top_p_sampling_from_probs,top_k_renorm_probs,top_p_renorm_probs,top_k_mask_logits,\
chain_speculative_sampling "$peers" f32 "${B2[@]}"
  fi
  python3 -m benchmarks table --markdown "$OUT/sampling.jsonl" >"$OUT/results.md" 2>&1 || status=1
  python3 - "$OUT/sampling.jsonl" <<'PY' | tee -a "$OUT/steps.log"
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

if [ -n "${SOFTMAX_ONLY:-}" ] && [ "$(left)" -gt 20 ]; then
  step "host overhead per call on CUDA"
  timeout "$(left)" python3 benchmarks/host_overhead.py --device cuda --out "$OUT/host_overhead.jsonl" 2>&1 \
    | tee -a "$OUT/steps.log"
  for op in rmsnorm softmax; do
    timeout "$(left)" python3 benchmarks/host_overhead.py --device cuda --breakdown "$op" \
      --out "$OUT/host_overhead.jsonl" 2>&1 | tee -a "$OUT/steps.log"
  done
fi
if [ -n "${SOFTMAX_ONLY:-}" ] && [ "$(left)" -gt 40 ]; then
  step "first call in a fresh process: cold and warm (benchmarks/compile_time.py)"
  timeout "$(left)" python3 benchmarks/compile_time.py --device cuda --out "$OUT/compile_time.json" \
    >"$OUT/compile_time.log" 2>&1 || status=1
  python3 - "$OUT/compile_time.json" <<'PY' 2>&1 | tee -a "$OUT/steps.log"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['module']}: cold first call {r['cold']['first_call_s']:.2f} s; warm first calls "
      + ", ".join(f"{1e3 * w['first_call_s']:.1f} ms" for w in r["warm"]))
PY
fi
step "done (status $status)"
exit $status
