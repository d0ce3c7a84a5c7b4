#!/usr/bin/env bash
# One GPU round on the device machine, in one call: install kiln (editable, no deps), run the GPU
# tests, the benchmarks and the compile-time measurement, and leave logs and results in $OUT.
#
#   bash scripts/gpu_round.sh [pytest args...]
#
# SKIP_COMPILE_TIME=1 / SKIP_NORM_BENCH=1 leave out the measurements that did not change.
#
# FlashInfer (a peer for benchmarks only) is used when its wheels are carried in .peers/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if ls .peers/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl >>"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a
fi

echo "== prebuild every module for this GPU (parallel; the tests then load from the cache)"
python3 -m codegen build //ops/... >"$OUT/prebuild.log" 2>&1 || { status=1; tail -n 40 "$OUT/prebuild.log"; }
tail -n 2 "$OUT/prebuild.log"

if [ -z "${SKIP_COMPILE_TIME:-}" ]; then
  echo "== compile time"
  python3 benchmarks/compile_time.py --device cuda --out "$OUT/compile_time.json" >"$OUT/compile_time.log" 2>&1 || status=1
  tail -n 30 "$OUT/compile_time.log"
fi

echo "== pytest -m gpu"
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmarks"
if [ -z "${SKIP_NORM_BENCH:-}" ]; then
  python3 benchmarks/bench_norm.py --out "$OUT/norm_h200.json" 2>&1 | tee "$OUT/bench_norm.log" | tail -n 30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
python3 benchmarks/bench_decode.py --out "$OUT/decode_h200.json" 2>&1 | tee "$OUT/bench_decode.log" | tail -n 45
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
