#!/bin/bash
# The C++ client as a user installs it: `cmake --install` of the runtime
# and dev components into a fresh prefix, then examples/cpp (a project of
# its own) configured against that prefix only (find_package(shmtensor
# CONFIG)), built and run against a daemon: producer | consumer. Also
# checks the installed tree (public headers only, the versioned soname) and
# that pkg-config builds the consumer alone.
#   tests/install_example.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shmtensor-install-XXXXXX)
daemon_pid=
cleanup() {
  [[ -n "$daemon_pid" ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$work/prefix
for component in runtime dev; do
  cmake --install "$build" --prefix "$prefix" --component "$component" >/dev/null
done

# Public headers only: what client.h, view.h, sealed_ref.h, torch.h and the
# common vocabulary are; nothing of the client's inside, no generated code.
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
expected="./shmtensor/client.h ./shmtensor/defaults.h ./shmtensor/device.h ./shmtensor/dtype.h ./shmtensor/errors.h ./shmtensor/object_ref.h ./shmtensor/sealed_ref.h ./shmtensor/view.h "
if [[ -f "$prefix/include/shmtensor/torch.h" ]]; then
  expected=$(echo "$expected" | sed 's|./shmtensor/sealed_ref.h|./shmtensor/sealed_ref.h ./shmtensor/torch.h|')
fi
[[ "$headers" == "$expected" ]] || fail "installed headers: $headers (expected $expected)"
libdir=$(dirname "$(find "$prefix" -name 'libshmtensor.so.*.*' | head -1)")
[[ -d "$libdir" ]] || fail "no libshmtensor.so.X.Y.Z under $prefix"
soname=$(readelf -d "$libdir"/libshmtensor.so.*.*.* | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ "$soname" == libshmtensor.so.0 ]] || fail "soname '$soname'"
[[ -f "$libdir/libshmtensor.a" ]] || fail "no libshmtensor.a"
# Exports the shmtensor namespace only. (Outputs are taken whole before
# grep: with pipefail, grep -q ending a pipe early fails its writer.)
exports=$(nm -D --defined-only -C "$libdir/libshmtensor.so.0" |
  awk '{print $3}')
outside=$(grep -v '^shmtensor::\|^typeinfo\|^vtable\|^$' <<<"$exports" || true)
[[ -z "$outside" ]] ||
  fail "libshmtensor.so exports symbols outside namespace shmtensor: $(head -5 <<<"$outside")"
echo "installed: $(ls "$libdir" | grep shmtensor | tr '\n' ' ')"

# The example, against the prefix only (not the build tree).
cmake -S "$src/examples/cpp" -B "$work/example" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  >"$work/configure.log" || { cat "$work/configure.log"; fail "configure"; }
grep -q "$build" "$work/example/CMakeCache.txt" &&
  fail "the example's cache names the build tree"
cmake --build "$work/example" -j2 >"$work/build.log" ||
  { cat "$work/build.log"; fail "build"; }
# pkg-config alone builds the consumer too.
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists shmtensor ||
  fail "pkg-config finds no shmtensor"
# shellcheck disable=SC2046
g++ -std=c++17 -o "$work/consumer-pc" "$src/examples/cpp/consumer.cc" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs shmtensor) ||
  fail "pkg-config build"

# Run: a daemon of its own, producer | consumer.
export SHMTENSOR_ADDRESS=unix:$work/d.sock
"$build/bin/shmtensord" --listen "$SHMTENSOR_ADDRESS" --pool-size 64MiB \
  >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [[ -S "$work/d.sock" ]] && break; sleep 0.1; done
[[ -S "$work/d.sock" ]] || { cat "$work/daemon.log"; fail "no daemon"; }
loads=$(ldd "$work/example/consumer")
grep -qF "libshmtensor.so.0 => $libdir/" <<<"$loads" ||
  fail "the example does not load the installed libshmtensor.so.0: $loads"
loads=$(ldd "$work/example/consumer_static")
grep -q libshmtensor <<<"$loads" && fail "consumer_static loads libshmtensor.so"
consumers=("$work/example/consumer" "$work/example/consumer_static"
  "$work/consumer-pc")
# With libtorch installed beside it (the adapter was built): the tensor too.
if [[ -f "$prefix/include/shmtensor/torch.h" ]]; then
  [[ -x "$work/example/tensor_consumer" ]] ||
    fail "shmtensor::torch is installed and the example did not build with it"
  consumers+=("$work/example/tensor_consumer")
fi
for consumer in "${consumers[@]}"; do
  coproc PRODUCER { "$work/example/producer"; }
  read -r ref <&"${PRODUCER[0]}" || fail "producer said nothing"
  out=$(echo "$ref" | LD_LIBRARY_PATH="$libdir" "$consumer") ||
    fail "$consumer: $out"
  eval "exec ${PRODUCER[1]}>&-"
  wait "$PRODUCER_PID" || fail "producer failed"
  [[ "$out" == "ok 65536 floats, sum 2147450880" ||
     "$out" == "ok [64, 1024] sum 2147450880" ]] || fail "consumer said '$out'"
  echo "$(basename "$consumer"): $out"
done
echo "PASS"
