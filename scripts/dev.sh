#!/usr/bin/env bash
# kiln's two entry points for a fresh machine (see README.md):
#
#   bash scripts/dev.sh demo   set up, build //ops:norm for this machine (CUDA where a GPU is, the
#                              CPU backend otherwise), run examples/rmsnorm.py
#   bash scripts/dev.sh test   set up, run the test suite (extra arguments go to pytest)
#
# Set-up is idempotent: a virtual environment in .venv (KILN_VENV) with an editable install of
# kiln. A torch that is already installed for python3 is reused (the venv sees the system
# site-packages) so its CUDA build stays as it is; otherwise torch==2.13.0 is installed
# (KILN_TORCH_SPEC overrides; on this project's CPU machines that release lies on disk).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KILN_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${KILN_TORCH_SPEC:-torch==2.13.0}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    if "$PY" -c "import torch" >/dev/null 2>&1; then
      echo "kiln: reusing the installed torch ($("$PY" -c 'import torch; print(torch.__version__)'))"
      "$PY" -m venv --system-site-packages "$VENV"
    else
      "$PY" -m venv "$VENV"
    fi
  fi
  local vpy="$VENV/bin/python"
  "$vpy" -m pip install -q --upgrade pip "setuptools>=64" wheel
  if ! "$vpy" -c "import torch" >/dev/null 2>&1; then
    echo "kiln: installing $TORCH_SPEC"
    "$vpy" -m pip install -q "$TORCH_SPEC"
  fi
  # --no-build-isolation: build with the environment's setuptools and never pull another torch.
  "$vpy" -m pip install -q --no-build-isolation -e ".[test]"
}

cmd=${1:-}
shift || true
case "$cmd" in
  demo)
    setup
    "$VENV/bin/python" -m codegen build //ops:norm
    "$VENV/bin/python" examples/rmsnorm.py "$@"
    ;;
  test)
    setup
    "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test [args]" >&2
    exit 2
    ;;
esac
