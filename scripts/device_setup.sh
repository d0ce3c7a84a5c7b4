# Sourced by the device-round scripts (gpu_round.sh, prefill_round.sh): install kiln (editable, no
# deps: the device machine has torch and the build tools) and the peers carried as wheels in
# .peers/ (FlashInfer, cupti-python) into /tmp/peers, with the environment FlashInfer's JIT needs.
#
#   install_kiln_and_peers LOG [PEERS]   # PEERS=0 leaves the peers out; exits on a failed install
#   $have_peers                          # 1 when the peers were installed
install_kiln_and_peers() {
  local log=$1 want=${2:-1}
  # kiln's pyproject needs setuptools >= 77 (an SPDX license string); an older one on the machine
  # is shadowed by the wheel carried in .whl/, if any.
  if ! python3 -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null \
      && ls .whl/setuptools-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-setuptools .whl/setuptools-*.whl >"$log" 2>&1
    export PYTHONPATH=/tmp/site-setuptools${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -m pip install -q --no-build-isolation --no-deps -e . >>"$log" 2>&1 || { cat "$log"; exit 1; }
  have_peers=0
  if [ "$want" != 0 ] && ls .peers/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl >>"$log" 2>&1
    export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a
    have_peers=1
  fi
}
