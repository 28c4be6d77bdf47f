#!/usr/bin/env bash
# Builds everything but the Python binding under AddressSanitizer and
# UndefinedBehaviorSanitizer (GCC) into build-asan/ and runs the C++ suite
# there (ctest; the Python tests are left out, as CPython would need the
# ASan runtime preloaded, and so are the install tests, see below). The
# daemon, the client library, every test and its helpers are instrumented.
#
#   deploy/sanitize.sh [CTEST_ARGS...]     # e.g. -R Hardening
#
# handle_segv=0: the safety tests write into sealed memory on purpose and
# expect the kernel's SIGSEGV, not ASan's report. Leak checking is off for the
# same reason (a child killed by SIGSEGV or SIGKILL leaks by design); ASan
# still reports every invalid access and UBSan every undefined operation
# (halt_on_error: the first one fails its test).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if [[ ! -f build-asan/CMakeCache.txt ]]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSHMTENSOR_WITH_PYTHON=OFF -DSHMTENSOR_WITH_CUDA=OFF \
    -DSHMTENSOR_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS=handle_segv=0:detect_leaks=0:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd build-asan
# install.*: they build projects of their own against the installed library,
# without the sanitizer runtime these objects need (undefined __asan_*).
ctest --output-on-failure -j "$(nproc)" --timeout 600 -E '^(python|install)\.' "$@"
