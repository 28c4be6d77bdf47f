#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest: the
# GoogleTest unit and multi-process tests and the Python tests (pytest, one
# ctest entry per file).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
./deploy/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 300)
