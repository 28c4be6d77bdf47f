#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: GoogleTest unit and
# multi-process tests (through ctest) and the Python tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
./deploy/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 300)
if [ -d tests/python ]; then
  PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q tests/python
fi
