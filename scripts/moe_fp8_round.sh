#!/usr/bin/env bash
# The fp8 grouped GEMM's GPU round on the device machine (an H200, 16 cores), in one call of at
# most ~240 s: install kiln (no peers: FlashInfer's group_gemm_fp8_nt_groupwise is sm100/sm120
# only), prebuild //ops/gemm:fp8_grouped and what the MoE layer composes for this GPU, the GPU
# tests of the new op and of the MoE family, then the benchmarks: the grouped fp8 GEMM against
# torch._grouped_mm on bf16 copies (DeepSeek-V3's expert GEMMs, E 256, T 512 and 4096) and
# benchmarks/moe_fp8.py (the DeepSeek-V3 layer with fp8 block-scaled weights, E 256) against the
# torch._grouped_mm pipeline. Logs and results go to $OUT and into ONE $OUT/results.tgz:
#
#   steps.log          each step's start (s since the start), the GPU, and the summaries below
#   pytest_gpu.log     pytest -m gpu (4 xdist workers when pytest-xdist imports)
#   group_gemm.jsonl   the group_gemm_fp8_nt_groupwise routine's records (each after a reference check)
#   moe_fp8.jsonl      benchmarks/moe_fp8.py's records
#   bench.log          the harness's tables and progress
#   ptxas.log          registers and spills of the fp8 grouped kernels (nvcc -Xptxas -v)
#
#   bash scripts/moe_fp8_round.sh [pytest args, default: the new op's tests and tests/ops/moe]
#
# SKIP_TESTS=1 / SKIP_GEMM=1 (the GEMM routine) / SKIP_LAYER=1 (moe_fp8.py) leave a step out;
# FP8_TOKENS (default "512 4096") the layer's token counts; REPEATS (default 10) and TARGET_MS
# (default 1) size each GEMM measurement. DEADLINE (s after the start, default 225) bounds every
# step after the install: whatever finished is kept, and the tar is written on exit.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_DEFAULT=225 . scripts/round_common.sh
TARGETS="//ops/gemm:fp8_grouped //ops:moe //ops/gemm:grouped //ops:activation //ops:quantization"

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/steps.log"
step "install"
. scripts/device_setup.sh
install_kiln_and_peers /tmp/moe_setup.log 0
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', __import__('os').cpu_count())" \
  | tee -a "$OUT/steps.log"

# 1. Every module the tests and benchmarks load, the targets side by side (-j 3 each: 15 jobs).
step "prebuild $TARGETS (cuda)"
pids=()
for t in $TARGETS; do
  log=/tmp/fp8_prebuild_${t##*:}.log
  timeout "$(left)" python3 -m codegen build "$t" --toolchain cuda -j 3 >"$log" 2>&1 &
  pids+=("$!")
done
i=0
for t in $TARGETS; do
  wait "${pids[$i]}" || { status=1; tail -n 40 "/tmp/fp8_prebuild_${t##*:}.log" | tee -a "$OUT/steps.log"; }
  grep -E "built|summary" "/tmp/fp8_prebuild_${t##*:}.log" | tee -a "$OUT/steps.log"
  i=$((i + 1))
done
# Registers and spills of the grouped fp8 kernels, from the generated unit's own flags.
python3 - >"$OUT/ptxas.log" 2>&1 <<'PY' &
import glob, os, re, subprocess
base = os.environ["KILN_WORKSPACE_BASE"]
for nin in glob.glob(f"{base}/artifacts/gemm_fp8_grouped_dtype_e4m3_cuda/*/build/build.ninja"):
    text = open(nin).read()
    nvcc = re.search(r"^nvcc = (.*)$", text, re.M).group(1)
    flags = re.search(r"^cudaflags = (.*)$", text, re.M).group(1)
    src = re.search(r"^build fp8_grouped_sm90\.cu\.o: cuda (\S+)", text, re.M).group(1)
    cmd = f"{nvcc} {flags} -Xptxas -v -c {src} -o /tmp/ptxas_probe.o"
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    print("\n".join(l for l in r.stderr.splitlines() if re.search("entry|Used|spill", l)))
PY
ptx_pid=$!

# 2. The GPU tests: the new op's and the MoE family's (its fp8 layers now take the new GEMM).
if [ -z "${SKIP_TESTS:-}" ]; then
  workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
  tests=${*:-tests/ops/gemm/test_group_gemm_fp8.py tests/ops/moe}
  step "pytest -m gpu $tests ${workers[*]}"
  # shellcheck disable=SC2086
  KILN_TEST_WORKSPACE=$KILN_WORKSPACE_BASE timeout "$(( $(left) > 100 ? 100 : $(left) ))" python3 -m pytest -m gpu -q \
    -p no:cacheprovider "${workers[@]}" $tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -n 1 "$OUT/pytest_gpu.log" | sed 's/^/pytest: /' >>"$OUT/steps.log"
fi
wait "$ptx_pid" 2>/dev/null; grep -E "spill|Used" "$OUT/ptxas.log" | sort | uniq -c | tee -a "$OUT/steps.log"

# 3. The GEMM alone: DeepSeek-V3's expert GEMMs at E 256 (the template's examples).
if [ -z "${SKIP_GEMM:-}" ] && [ "$(left)" -gt 40 ]; then
  step "benchmarks: group_gemm_fp8_nt_groupwise (kiln, torch_grouped_mm)"
  timeout "$(( $(left) > 70 ? 70 : $(left) ))" python3 -m benchmarks run group_gemm_fp8_nt_groupwise \
    --backends kiln,torch_grouped_mm --repeats "${REPEATS:-10}" --target-ms "${TARGET_MS:-1}" --no-ceilings \
    --output "$OUT/group_gemm.jsonl" </dev/null >>"$OUT/bench.log" 2>&1 || status=1
  python3 - "$OUT/group_gemm.jsonl" <<'PY' | tee -a "$OUT/steps.log"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if r.get("status") != "ok":
        print("gemm", r.get("backend"), r.get("axes"), r.get("status"), (r.get("error") or "")[:200])
        continue
    a = r["axes"]
    print("gemm", r["definition"].split("/")[-1], "rows", a["rows"], r["backend"], round(r["median_us"], 1), "us",
          round(r.get("tflops") or 0), "TFLOP/s")
PY
fi

# 4. The layer: DeepSeek-V3 with fp8 block-scaled weights at its real 256 experts.
if [ -z "${SKIP_LAYER:-}" ] && [ "$(left)" -gt 30 ]; then
  step "benchmarks/moe_fp8.py --tokens ${FP8_TOKENS:-512 4096}"
  timeout "$(left)" python3 benchmarks/moe_fp8.py --tokens ${FP8_TOKENS:-512 4096} --out "$OUT/moe_fp8.jsonl" \
    </dev/null >>"$OUT/bench.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench.log" | tee -a "$OUT/steps.log"; }
  python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print('layer', r['tokens'], r['backend'], 'graph' if r['cuda_graph'] else 'eager', round(r['median_us'], 1), 'us',
          'rel err', round(r.get('rel_err_vs_float32_layer', 0), 4), r.get('activations', ''))
" "$OUT/moe_fp8.jsonl" 2>/dev/null | tee -a "$OUT/steps.log"
fi

step "done (status $status)"
exit $status
