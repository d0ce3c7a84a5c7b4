#!/usr/bin/env bash
# Nsight Compute side by side of the single-prefill kernel (causal 8192 tokens, 32/8 heads,
# head_dim 128, bf16: benchmarks/bounds_overhead.py's prefill workload) of this tree and of the
# older tree carried in .baseline/, on the device machine, in one call of ~4-5 minutes. For each
# tree: a timed run (which JIT-builds its module), then one kernel launch under
# `ncu --set full --clock-control none`, exported as text. Results in $OUT:
#
#   times.jsonl                the timed runs (bounds_overhead.py records, median of --reps)
#   details_{now,baseline}.txt  ncu's details page (every section's metrics)
#   sass_{now,baseline}.csv     ncu's source page: per-SASS-instruction counters
#   ncu.tgz                    the three kinds above and the .ncu-rep reports, packed
#
#   bash scripts/prefill_ncu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
[ -d .baseline/ops ] || { echo "no .baseline/ tree to compare with" >&2; exit 2; }
. scripts/device_setup.sh
install_kiln_and_peers /tmp/ncu_setup.log 0
status=0
for tree in . .baseline; do
  name=now; [ "$tree" = . ] || name=baseline
  ws=/tmp/kiln-ws-ncu-$name
  echo "== $name: timed run (builds the module)"
  KILN_WORKSPACE_BASE=$ws timeout 240 python3 benchmarks/bounds_overhead.py --root "$tree" --workloads prefill \
    --reps 10 --out "$OUT/times.jsonl" 2>&1 | tail -n 3 || status=1
  echo "== $name: ncu"
  KILN_WORKSPACE_BASE=$ws timeout 200 ncu --clock-control none --kernel-name regex:prefill --launch-skip 2 \
    --launch-count 1 --set full -f -o "$OUT/ncu_$name" python3 benchmarks/bounds_overhead.py --root "$tree" \
    --workloads prefill --reps 1 --no-kernel-list >"$OUT/ncu_$name.log" 2>&1 || { status=1; tail -n 20 "$OUT/ncu_$name.log"; }
  ncu -i "$OUT/ncu_$name.ncu-rep" --page details >"$OUT/details_$name.txt" 2>&1 || status=1
  ncu -i "$OUT/ncu_$name.ncu-rep" --page source --print-source sass --csv >"$OUT/sass_$name.csv" 2>&1 || status=1
done
grep -hE "^  [a-z_:]+.*prefill|Duration|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
  "$OUT"/details_now.txt "$OUT"/details_baseline.txt | head -n 40
tar -czf "$OUT/ncu.tgz" -C "$OUT" --exclude ncu.tgz . 2>/dev/null
exit $status
