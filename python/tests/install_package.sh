#!/usr/bin/env bash
# Installs the package as a user would, into a virtualenv that sees the
# system's numpy and torch: python3 -m venv --system-site-packages VENV,
# then the README's `pip install --no-build-isolation .` (with --no-index:
# everything it needs is installed; nothing is fetched). The ctest fixture
# of the Python tests (python/CMakeLists.txt).
# Usage: install_package.sh PYTHON VENV [CMAKE_BUILD_DIR]
# CMAKE_BUILD_DIR (default: pyproject.toml's build-dir) is where the
# backend keeps its CMake build between runs ($SKBUILD_BUILD_DIR, which
# both backends read; {wheel_tag} in it is replaced).
set -euo pipefail
python=$1
venv=$2
if [ $# -ge 3 ]; then
  export SKBUILD_BUILD_DIR="$3/{wheel_tag}"
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
cd "$root"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-index \
  --no-build-isolation .
# The binaries are in the package (the console commands are not enough).
files=$("$venv/bin/python" -m pip show --files shmtensor)
for f in shmtensor/bin/shmtensord shmtensor/bin/shmtensorctl; do
  if ! grep -qx " *$f" <<<"$files"; then
    echo "install_package: the installed package has no $f" >&2
    exit 1
  fi
done
echo "install_package: installed into $venv"
