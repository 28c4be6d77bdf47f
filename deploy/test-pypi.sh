#!/usr/bin/env bash
# The setup most users have: torch (and torchdata) from PyPI in a virtualenv
# that does not see the system's packages, shmtensor installed into it from
# this tree. Beside ./deploy/test.sh (which keeps Debian's torch and needs
# no PyPI); run it before a release and give its output.
#
# What it does, in a venv at $SHMTENSOR_PYPI_VENV (default
# ~/.cache/shmtensor/venv-pypi; PyPI's torch for x86_64 is a CUDA build of
# several GB, so the venv and pip's cache live outside the tree):
#   1. pip install torch torchdata numpy pytest expecttest parameterized
#      (the newest this machine's pip gives, or $SHMTENSOR_PYPI_PACKAGES);
#   2. installs shmtensor from the build tree (./deploy/build.sh first),
#      as python/tests/install_package.sh does;
#   3. runs every pytest file against the installed package;
#   4. runs torch's own test_dataloader.py against our DataLoader, both
#      loaders side by side (python/tests/torch_suite/run.py): the file of
#      the installed torch's release when $SHMTENSOR_TORCH_TESTS names it,
#      else the newest copy kept in python/tests/torch_suite (said so);
#   5. runs torchdata's own StatefulDataLoader tests (test_state_dict.py,
#      test_dataloader.py, test_sampler.py of pytorch/data's
#      test/stateful_dataloader at the installed torchdata's tag) against
#      ours the same way: from $SHMTENSOR_TORCHDATA_TESTS (that folder), else
#      a shallow git clone of the tag (skipped, saying so, when that fails).
# Exit status: 0 when every step passed (a skipped step is named).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache=${SHMTENSOR_PYPI_CACHE:-$HOME/.cache/shmtensor}
venv=${SHMTENSOR_PYPI_VENV:-$cache/venv-pypi}
packages=${SHMTENSOR_PYPI_PACKAGES:-torch torchdata numpy pytest expecttest parameterized}
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$cache/pip}
failed=()
skipped=()

cd "$root"
./deploy/build.sh >/dev/null
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv"  # No --system-site-packages.
fi
# shellcheck disable=SC2086  # A list of packages.
"$venv/bin/python" -m pip install -q --disable-pip-version-check $packages
SHMTENSOR_FROM_BUILD_TREE="$root/build" \
  python/tests/install_package.sh /usr/bin/python3 "$venv" \
  "$root/build/wheel-pypi" >/dev/null
"$venv/bin/python" - <<'EOF'
import numpy, torch, shmtensor
try:
    import torchdata
    td = torchdata.__version__
except ImportError:
    td = "not installed"
print(f"test-pypi: torch {torch.__version__}, torchdata {td}, numpy "
      f"{numpy.__version__}, shmtensor from {shmtensor.__file__}")
EOF

echo "== pytest, against the installed package"
if ! (cd python/tests && SHMTENSOR_TEST_INSTALLED=1 \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider test_*.py); then
  failed+=("pytest")
fi

suite() {  # suite NAME ARGS...: run.py with the venv's interpreter.
  local name=$1
  shift
  echo "== $name"
  if ! SHMTENSOR_DAEMON="$root/build/bin/shmtensord" \
       SHMTENSOR_PYTHONPATH="$root/build/python" \
       "$venv/bin/python" python/tests/torch_suite/run.py "$@"; then
    failed+=("$name")
  fi
}

torch_version=$("$venv/bin/python" -c \
  "import torch; print(torch.__version__.split('+')[0])")
if [ -n "${SHMTENSOR_TORCH_TESTS:-}" ]; then
  suite "torch $torch_version test_dataloader.py" \
    --test-file "$SHMTENSOR_TORCH_TESTS"
else
  kept=$(ls -d python/tests/torch_suite/pytorch-* | sort -V | tail -1)
  echo "test-pypi: no test_dataloader.py of torch $torch_version given" \
       "(\$SHMTENSOR_TORCH_TESTS): running the newest kept, $kept"
  skipped+=("torch $torch_version's own test_dataloader.py")
  suite "$(basename "$kept") test_dataloader.py on torch $torch_version" \
    --test-file "$kept/test_dataloader.py"
fi

td_version=$("$venv/bin/python" -c \
  "import torchdata; print(torchdata.__version__.split('+')[0])" 2>/dev/null \
  || true)
tests=${SHMTENSOR_TORCHDATA_TESTS:-}
if [ -z "$tests" ] && [ -n "$td_version" ]; then
  clone="$cache/pytorch-data-v$td_version"
  if [ ! -d "$clone" ] && ! git clone -q --depth 1 --branch "v$td_version" \
       https://github.com/pytorch/data "$clone" 2>/dev/null; then
    rm -rf "$clone"
  fi
  [ -d "$clone" ] && tests="$clone/test/stateful_dataloader"
fi
if [ -z "$tests" ]; then
  echo "test-pypi: SKIPPED torchdata's tests: no torchdata, or no copy of" \
       "its tests (\$SHMTENSOR_TORCHDATA_TESTS) and no clone of v$td_version"
  skipped+=("torchdata's StatefulDataLoader tests")
else
  for f in test_state_dict.py test_dataloader.py; do
    suite "torchdata $td_version $f" --rebind StatefulDataLoader \
      --test-file "$tests/$f"
  done
  # Its run_tests() is not imported there: run by unittest.
  suite "torchdata $td_version test_sampler.py" --rebind StatefulDataLoader \
    --runner unittest --test-file "$tests/test_sampler.py"
fi

echo "== test-pypi: ${#failed[@]} failed${failed:+: ${failed[*]}}" \
     "${skipped:+; skipped: ${skipped[*]}}"
[ ${#failed[@]} -eq 0 ]
