# Sourced by the device-round scripts (scripts/*_round.sh) after `cd` to the repository root: the
# output folder, the JIT workspace, the round's clock and the helpers every round uses.
#
#   DEADLINE_DEFAULT=230 . scripts/round_common.sh
#   $OUT           where the results go (default /tmp/kiln-out); pack() tars it into ONE
#                  $OUT/results.tgz on exit (the device tool brings back 8 files at most)
#   $status        0; a script sets it to 1 on a failed step and exits with it
#   elapsed        seconds since the round started; left: seconds to $DEADLINE (at least 1)
#   step TEXT      "== [N s] TEXT" to the console and $OUT/steps.log; note TEXT: TEXT alone
# DEADLINE (s after the start; default $DEADLINE_DEFAULT, else 230) bounds every step a script
# times with `timeout "$(left)"`, so whatever finished is kept.
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_WORKSPACE_BASE=${KILN_WORKSPACE_BASE:-/tmp/kiln-ws}
export PYTHONUNBUFFERED=1
status=0
t0=$(date +%s)
DEADLINE=${DEADLINE:-${DEADLINE_DEFAULT:-230}}
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { local l=$(( DEADLINE - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/steps.log"; }
note() { echo "$*" | tee -a "$OUT/steps.log"; }
pack() { tar -czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null; }
trap pack EXIT
