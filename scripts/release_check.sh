#!/usr/bin/env bash
# The release path end to end, as CI runs it after the test suite (.ci/run):
#   1. build the host precompiled package of //ops:norm (python -m release build) and kiln's own
#      wheel, and check the package (python -m release verify);
#   2. install both into a fresh virtual environment: no editable install, no repository on the path;
#   3. run the norm tests there with KILN_DISABLE_JIT=1 and no C++ compiler (CXX points nowhere), so
#      every module must come from the package, and check nothing was compiled;
#   4. from a directory outside the checkout, the build graph's CLI of the wheel install
#      (kiln-build and python -m kiln.codegen) answers, and kiln.utils sees the precompiled
#      modules as the backend that can run (no compiler there).
# The CUDA package for "8.0 9.0a" is cross-compiled in the test suite itself
# (tests/release/test_release_build.py, marked slow).
#
#   bash scripts/release_check.sh        # after 'bash scripts/dev.sh test' set up .venv
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KILN_VENV:-.venv}
PY="$VENV/bin/python"
TORCH_SPEC=${KILN_TORCH_SPEC:-torch==2.13.0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-release-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export KILN_WORKSPACE_BASE="$WORK/build-ws"  # the build's own JIT cache, thrown away afterwards

echo "== 1. build and verify the host package of //ops:norm, and kiln's wheel"
"$PY" -m release build --toolchain host //ops:norm --out "$WORK/dist"
"$PY" -m release verify "$WORK"/dist/kiln_kernels_precompiled_host-*.whl
# kiln's wheel from a clean copy, so no earlier build/ directory can leak stale files into it.
mkdir "$WORK/src"
tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' \
  -cf - . | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"

echo "== 2. install both into a fresh virtual environment"
python3 -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "$TORCH_SPEC"
"$VPY" -m pip install -q "$WORK"/dist/kiln_kernels-*.whl \
  "$WORK"/dist/kiln_kernels_precompiled_host-*.whl "pytest>=7.4" "hypothesis>=6.90"

echo "== 3. the norm tests with KILN_DISABLE_JIT=1 and no compiler"
# A copy of the tests, run from outside the repository, so 'import kiln' is the installed wheel.
mkdir "$WORK/run"
cp -r tests pyproject.toml "$WORK/run/"
(
  cd "$WORK/run"
  "$VPY" -c "import kiln, sys; assert '$WORK/venv/' in kiln.__file__, kiln.__file__"
  KILN_TEST_WORKSPACE="$WORK/test-ws" KILN_TEST_DISABLE_JIT=1 CXX=/nonexistent/c++ \
    KILN_NVCC=/nonexistent/nvcc "$VPY" -m pytest -q -p no:cacheprovider tests/ops/norm/test_rmsnorm.py
)
if [ -e "$WORK/test-ws/artifacts" ] || [ -e "$WORK/test-ws/generated" ]; then
  echo "release check: the norm tests compiled something; the precompiled package did not serve" >&2
  exit 1
fi

echo "== 4. the wheel's CLI from outside the checkout, and backend_available without a compiler"
(
  cd "$WORK"
  "$WORK/venv/bin/kiln-build" query //ops/... | grep "^//ops/attention:prefill" >/dev/null
  "$VPY" -m kiln.codegen query //ops:attention | grep "^//ops/attention:cascade" >/dev/null
  CXX=/nonexistent/c++ KILN_NVCC=/nonexistent/nvcc "$VPY" - <<'PY'
from kiln import utils
assert utils.backend_available("//ops:norm", "host"), "the precompiled norm modules are not seen"
assert utils.backend_available("//ops:norm", "host", dtype="bf16")
assert not utils.backend_available("//ops/attention:decode", "host"), "no compiler, no package: unavailable"
PY
)
echo "release check: passed (every norm module came from the precompiled package; the wheel's CLI works from anywhere)"
