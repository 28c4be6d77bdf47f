#!/usr/bin/env bash
# The package build a user runs: `pip install --no-build-isolation .` with
# the backend compiling the C++ tree itself (scikit-build-core on Debian 13,
# setuptools on Debian 12), from a copy of the tree with no build in it;
# then the package's tests (python/tests/test_package.py) against what it
# installed. ./deploy/test.sh packages ./deploy/build.sh's build instead
# ($SHMTENSOR_FROM_BUILD_TREE, python/build_backend/build_tree.py); this
# checks the path it skips. It compiles the tree once more (minutes): it
# runs beside ./deploy/test.sh, not inside it. Needs the packages of
# ./deploy/install-deps.sh. On Debian 13 from a Debian 12 host:
#   deploy/test-in-debian.sh 13 -- deploy/test-package-build.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d /var/tmp/shmtensor-package-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The sources only: no build tree, no virtualenv, no git metadata.
mkdir "$work/src"
tar -C "$root" --exclude='./build' --exclude='./build-*' --exclude='./.git' \
  --exclude='./.whl' --exclude='./.gpu' -cf - . | tar -C "$work/src" -xf -
unset SHMTENSOR_FROM_BUILD_TREE SKBUILD_BUILD_DIR
. /etc/os-release
echo "test-package-build: Debian ${VERSION_ID:-?}, $(/usr/bin/python3 --version)"
start=$(date +%s)
"$work/src/python/tests/install_package.sh" /usr/bin/python3 "$work/venv"
echo "test-package-build: pip install built and installed in $(( $(date +%s) - start )) s"
if [ -n "$(find "$work/src/build/wheel" -maxdepth 1 -name 'setuptools-*' -print -quit)" ]; then
  echo "test-package-build: built by setuptools (setup.py)"
else
  echo "test-package-build: built by scikit-build-core"
fi
cd "$work/src/python/tests"
SHMTENSOR_TEST_INSTALLED=1 "$work/venv/bin/python" -m pytest -q \
  -p no:cacheprovider test_package.py
echo "test-package-build: PASS"
