#!/usr/bin/env bash
# Configures (once) and builds shmtensor into build/. Executables land in
# build/bin/. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/CMakeCache.txt ] || [ $# -gt 0 ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build build -j "$(nproc)"
