#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest: the
# GoogleTest unit and multi-process tests, the Python tests (pytest, one
# ctest entry per file) and torch's own DataLoader tests against ours
# (python/tests/torch_suite).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
./deploy/build.sh
rm -f build/torch_suite.txt
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 300)
# What torch's own DataLoader tests said of ours (ctest shows a passing
# entry's output only when it fails).
if [ -f build/torch_suite.txt ]; then
  cat build/torch_suite.txt
fi
