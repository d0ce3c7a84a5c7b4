#!/usr/bin/env bash
# The MoE family's GPU round on the device machine (an H200, 16 cores), in one call of at most
# ~240 s: install kiln (and the peers carried in .peers/), prebuild //ops:moe and the targets the
# layer composes (//ops/gemm:grouped, //ops:activation) for this GPU, the family's GPU tests, then
# its benchmark routines against torch (the torch._grouped_mm pipeline) and, with what time is
# left, FlashInfer's cutlass_fused_moe. Logs and results go to $OUT and into ONE $OUT/results.tgz:
#
#   steps.log        each step's start (s since the start), the GPU, and the summaries below
#   pytest_gpu.log   pytest -m gpu tests/ops/moe (4 xdist workers when pytest-xdist imports)
#   moe.jsonl        every benchmark record (kiln, torch, FlashInfer), each after a reference check
#   bench.log        the harness's tables and progress, routine by routine
#   results.md       the Markdown table of moe.jsonl
#   moe_fp8.jsonl    benchmarks/moe_fp8.py: DeepSeek-V3 with fp8 block-scaled weights at 256 experts
#
#   bash scripts/moe_round.sh [pytest args, default: tests/ops/moe]
#
# SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_PEERS=1 / SKIP_GRAPH=1 (the CUDA-graph run of the decode
# sizes) / SKIP_PIECES=1 (routing, align, permute, unpermute) / SKIP_FP8=1 (benchmarks/moe_fp8.py;
# FP8_TOKENS picks its token counts) leave a step out. TOKENS (default "1 16 64 512 4096
# 16384") and MODELS (default "mixtral-8x7b qwen3-30b-a3b deepseek-v3") pick the layer shapes;
# REPEATS (default 10) and TARGET_MS (default 1) size each measurement. DEADLINE (s after the
# start, default 230) bounds every step after the install: whatever finished is kept.
# FlashInfer's cutlass_fused_moe JIT-compiles its CUTLASS kernels on first use (minutes, when no
# cached build is on the machine): it runs last and is cut off by the deadline if it must.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=230 . scripts/round_common.sh
TARGETS="//ops:moe //ops/gemm:grouped //ops:activation"
TOKENS=${TOKENS:-"1 16 64 512 4096 16384"}
MODELS=${MODELS:-"mixtral-8x7b qwen3-30b-a3b deepseek-v3"}
declare -A SIZES=(  # the layer templates' var axes besides tokens (python/kiln/trace/moe.py)
  [mixtral-8x7b]="num_experts=8,top_k=2,hidden=4096,intermediate=14336"
  [qwen3-30b-a3b]="num_experts=128,top_k=8,hidden=2048,intermediate=768"
  [deepseek-v3]="num_experts=128,top_k=8,hidden=7168,intermediate=2048"
)
layer_shapes() {  # the layer's --shapes values: every model at every T (decode examples to 256)
  local m t
  for m in $MODELS; do
    for t in $TOKENS; do
      if [ "$t" -le 256 ]; then echo "$m-decode:tokens=$t,${SIZES[$m]}"; else echo "$m-prefill:tokens=$t,${SIZES[$m]}"; fi
    done
  done
}
SMALL_SHAPES() {  # the pieces: T = 1, 64 and 16384 of every model
  local m
  for m in $MODELS; do echo "$m-decode:tokens=1 $m-decode:tokens=64 $m-prefill:tokens=16384"; done
}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/moe_setup.log "${PEERS:-1}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"

# 1. The modules the tests and the benchmarks load (moe: 3 dtypes; grouped: bf16, f16; activation:
#    3 dtypes), the targets side by side with 4 compile jobs each.
step "prebuild $TARGETS (cuda)"
pids=()
for t in $TARGETS; do
  log=/tmp/moe_prebuild_${t##*:}.log
  timeout "$(left)" python3 -m codegen build "$t" --toolchain cuda -j 4 >"$log" 2>&1 &
  pids+=("$!")
done
for i in "${!pids[@]}"; do
  t=$(echo $TARGETS | cut -d' ' -f$((i + 1)))
  wait "${pids[$i]}" || { status=1; tail -n 40 "/tmp/moe_prebuild_${t##*:}.log"; }
  grep -E "built|summary" "/tmp/moe_prebuild_${t##*:}.log" | tee -a "$OUT/steps.log"
done

# 2. The GPU tests (small shapes and one Qwen3-sized layer: 4 workers fit in the GPU's memory).
if [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  step "pytest -m gpu ${*:-tests/ops/moe} ${workers[*]}"
  # shellcheck disable=SC2086
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider \
    "${workers[@]}" ${*:-tests/ops/moe} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi

# 3. Benchmarks: the layer (kiln vs the torch._grouped_mm pipeline) first, then the pieces, then
#    FlashInfer's cutlass_fused_moe beside kiln's.
if [ -z "${SKIP_BENCH:-}" ]; then
  : >"$OUT/moe.jsonl"
  run_bench() {  # comma-separated routines, backends, shapes, then extra flags (--cuda-graph)
    [ "$(left)" -gt 5 ] || { note "skipped $1 ($2): past the deadline"; return; }
    step "benchmarks: $1 ($2) ${*:4}"
    local shapes=(); for s in $3; do shapes+=(--shapes "$s"); done
    rm -f /tmp/moe_run.jsonl
    timeout "$(left)" python3 -m benchmarks run "$1" --backends "$2" "${shapes[@]}" --repeats "${REPEATS:-10}" \
      --target-ms "${TARGET_MS:-1}" "${@:4}" --output /tmp/moe_run.jsonl </dev/null >>"$OUT/bench.log" 2>&1 || status=1
    cat /tmp/moe_run.jsonl >>"$OUT/moe.jsonl" 2>/dev/null
  }
  run_bench fused_moe kiln,torch_grouped_mm "$(layer_shapes)"
  # The decode sizes again under CUDA graphs: the kernels' time without the eager host path.
  [ -z "${SKIP_GRAPH:-}" ] && run_bench fused_moe kiln,torch_grouped_mm "$(layer_shapes | grep -- -decode:)" --cuda-graph
  if [ -z "${SKIP_PIECES:-}" ]; then
    run_bench moe_topk,moe_align_block_size kiln,torch "$(SMALL_SHAPES)"
    run_bench moe_permute,moe_unpermute kiln,torch "$(SMALL_SHAPES)"
  fi
  # DeepSeek-V3 at its real 256 experts with fp8 block-scaled weights (one copy of each input:
  # the harness's three would not fit), against the torch pipeline on the dequantised weights.
  if [ -z "${SKIP_FP8:-}" ] && [ "$(left)" -gt 30 ]; then
    step "benchmarks/moe_fp8.py (DeepSeek-V3 fp8, E 256)"
    timeout "$(left)" python3 benchmarks/moe_fp8.py --tokens ${FP8_TOKENS:-1 16 64 512 4096} --out "$OUT/moe_fp8.jsonl" \
      </dev/null >>"$OUT/bench.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench.log"; }
    python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print('fp8', r['tokens'], r['backend'], 'graph' if r['cuda_graph'] else 'eager', round(r['median_us'], 1), 'us',
          round(100 * r['fraction_of_fp8_floor']), '% of the fp8 floor')
" "$OUT/moe_fp8.jsonl" 2>/dev/null | tee -a "$OUT/steps.log"
  fi
  if [ -z "${SKIP_PEERS:-}" ] && [ "${have_peers:-0}" = 1 ]; then
    run_bench cutlass_fused_moe kiln,flashinfer "$(layer_shapes)"
  fi
  python3 -m benchmarks table --markdown "$OUT/moe.jsonl" >"$OUT/results.md" 2>&1 || status=1
  python3 - "$OUT/moe.jsonl" <<'PY' | tee -a "$OUT/steps.log"
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
