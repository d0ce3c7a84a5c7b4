#!/usr/bin/env bash
# The triton toolchain's GPU round on the device machine (an H200, 16 cores, triton 3.6), in one
# call of at most ~240 s: install kiln, prebuild //ops/gemm:grouped's triton and CUDA modules and
# the CUDA modules the MoE layer composes (//ops:moe, //ops:activation) for this GPU, the triton GPU
# tests (the toolchain's driver launches, grouped_mm's triton backend, fused_moe(backend="triton")),
# the host overhead per call, the fused_moe benchmark (kiln CUDA, kiln triton, the
# torch._grouped_mm pipeline) at a few layer shapes, then the grouped_mm benchmark (kiln CUDA, kiln
# triton, torch._grouped_mm, a matmul loop) at the MoE shapes with what time is left. Everything
# lands in $OUT/results.tgz (only a few files come back):
#
#   steps.log        each step's start (s since the start), the GPU, and the summaries below
#   pytest_gpu.log   pytest -m gpu over the triton tests (4 xdist workers when pytest-xdist imports)
#   overhead.jsonl   benchmarks/triton_overhead.py: µs per call, triton API vs the nvcc module's
#   moe.jsonl        every fused_moe benchmark record, each after a reference check
#   grouped.jsonl    every grouped_mm benchmark record, each after a reference check
#   bench.log        the harness's tables; results.md the Markdown tables of moe.jsonl, grouped.jsonl
#   inspect.txt      the triton modules' cubins and their resources (kiln-build inspect)
#
#   bash scripts/triton_round.sh [pytest args, default: the triton tests]
#
# SKIP_TESTS=1 / SKIP_BENCH=1 leave a step out; SHAPES (default: the moe-e128 decode and prefill
# sets and the Qwen3-30B-A3B prefill ones) narrows the grouped_mm benchmark, MOE_SHAPES (default:
# Qwen3-30B-A3B at T = 1, 16, 64 and 4096, Mixtral-8x7B at T = 4096) the fused_moe one; REPEATS
# (default 20) and TARGET_MS (default 1) size each measurement. DEADLINE (s, default 230) bounds
# every step.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=230 . scripts/round_common.sh
TESTS="tests/runtime/test_triton_toolchain.py tests/ops/gemm/test_grouped_triton.py tests/ops/moe/test_moe_backend.py"
SHAPES=${SHAPES:-"moe-e128-k2048-n3072-decode moe-e128-k2048-n3072-prefill qwen3-30b-a3b-moe-gate-up-prefill \
qwen3-30b-a3b-moe-down-prefill"}
QWEN3="num_experts=128,top_k=8,hidden=2048,intermediate=768"  # (as scripts/moe_round.sh spells them)
MIXTRAL="num_experts=8,top_k=2,hidden=4096,intermediate=14336"
MOE_SHAPES=${MOE_SHAPES:-"qwen3-30b-a3b-decode:tokens=1,$QWEN3 qwen3-30b-a3b-decode:tokens=16,$QWEN3 \
qwen3-30b-a3b-decode:tokens=64,$QWEN3 qwen3-30b-a3b-prefill:tokens=4096,$QWEN3 mixtral-8x7b-prefill:tokens=4096,$MIXTRAL"}

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/triton_setup.log 0
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  2>&1 | tee -a "$OUT/steps.log"

# 1. //ops/gemm:grouped for this GPU: the triton modules (a child process each, seconds) and the
#    CUDA modules (the baseline of the tests and the benchmark), and the CUDA modules of the MoE
#    layer's other steps (//ops:moe, //ops:activation), side by side.
step "prebuild //ops/gemm:grouped (triton and cuda), //ops:moe and //ops:activation (cuda)"
timeout "$(left)" python3 -m codegen build //ops/gemm:grouped --toolchain triton -j 2 >/tmp/triton_prebuild.log 2>&1 &
p1=$!
timeout "$(left)" python3 -m codegen build //ops/gemm:grouped --toolchain cuda -j 6 >/tmp/triton_prebuild_cuda.log 2>&1 &
p2=$!
timeout "$(left)" python3 -m codegen build //ops:moe --toolchain cuda -j 4 >/tmp/triton_prebuild_moe.log 2>&1 &
p3=$!
timeout "$(left)" python3 -m codegen build //ops:activation --toolchain cuda -j 2 >/tmp/triton_prebuild_act.log 2>&1 &
p4=$!
wait $p1 || { status=1; tail -n 40 /tmp/triton_prebuild.log; }
wait $p2 || { status=1; tail -n 40 /tmp/triton_prebuild_cuda.log; }
wait $p3 || { status=1; tail -n 40 /tmp/triton_prebuild_moe.log; }
wait $p4 || { status=1; tail -n 40 /tmp/triton_prebuild_act.log; }
grep -hE "built|cached|summary" /tmp/triton_prebuild.log /tmp/triton_prebuild_cuda.log /tmp/triton_prebuild_moe.log \
  /tmp/triton_prebuild_act.log | tee -a "$OUT/steps.log"
python3 -m codegen inspect gemm_grouped_dtype_bf16_triton >"$OUT/inspect.txt" 2>&1
grep -A6 "cubins:" "$OUT/inspect.txt" | tee -a "$OUT/steps.log"

# 2. The GPU tests.
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

# 3. Host overhead per call, then the benchmarks: fused_moe first, grouped_mm with what is left.
if [ -z "${SKIP_BENCH:-}" ]; then
  step "host overhead (benchmarks/triton_overhead.py)"
  : >"$OUT/overhead.jsonl"
  timeout "$(left)" python3 benchmarks/triton_overhead.py --out "$OUT/overhead.jsonl" 2>&1 | tee -a "$OUT/steps.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  summary() {  # the record counts and failures of a benchmark JSONL file
    python3 - "$1" <<'PY' | tee -a "$OUT/steps.log"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {}
for r in recs:
    by[r["status"]] = by.get(r["status"], 0) + 1
print(sys.argv[1].rsplit("/", 1)[-1], "records:", by)
for r in recs:
    if r["status"] == "failed":
        print("FAILED", r["routine"], r["backend"], r["axes"], (r.get("error") or "")[:200])
PY
  }
  if [ "$(left)" -gt 5 ]; then
    step "benchmarks: fused_moe (kiln, kiln_triton, torch_grouped_mm)"
    shapes=(); for s in $MOE_SHAPES; do shapes+=(--shapes "$s"); done
    timeout "$(left)" python3 -m benchmarks run fused_moe --backends kiln,kiln_triton,torch_grouped_mm \
      "${shapes[@]}" --repeats "${REPEATS:-20}" --target-ms "${TARGET_MS:-1}" --output "$OUT/moe.jsonl" \
      </dev/null >>"$OUT/bench.log" 2>&1 || status=1
    python3 -m benchmarks table --markdown "$OUT/moe.jsonl" >"$OUT/results.md" 2>&1 || status=1
    summary "$OUT/moe.jsonl"
  else
    note "skipped fused_moe: past the deadline"
  fi
  if [ "$(left)" -gt 5 ]; then
    step "benchmarks: grouped_mm (kiln, kiln_triton, torch_grouped_mm, torch_loop)"
    shapes=(); for s in $SHAPES; do shapes+=(--shapes "$s"); done
    timeout "$(left)" python3 -m benchmarks run grouped_mm --backends kiln,kiln_triton,torch_grouped_mm,torch_loop \
      "${shapes[@]}" --repeats "${REPEATS:-20}" --target-ms "${TARGET_MS:-1}" --output "$OUT/grouped.jsonl" \
      </dev/null >>"$OUT/bench.log" 2>&1 || status=1
    python3 -m benchmarks table --markdown "$OUT/grouped.jsonl" >>"$OUT/results.md" 2>&1 || status=1
    summary "$OUT/grouped.jsonl"
  else
    note "skipped grouped_mm: past the deadline"
  fi
fi

step "done (status $status)"
exit $status
