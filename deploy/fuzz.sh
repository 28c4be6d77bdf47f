#!/usr/bin/env bash
# Builds a fuzzer with Debian's clang, libFuzzer, ASan and UBSan, and runs it
# for a while: the long campaign beside the suite's bounded runs (ctest
# fuzz.store_20000_programs, fuzz.ledger_5000_programs).
#   store:  the store's request handling (tests/fuzz/store_fuzzer.cc)
#   ledger: requests off the wire into the ledger, two uids, then a
#           successor's adoption (tests/fuzz/ledger_fuzzer.cc)
#
#   deploy/fuzz.sh [SECONDS] [store|ledger]   # default 600 store; corpus
#                                             # kept in build-fuzz/<name>-corpus
#
# Needs the main build (for the generated protobuf sources) and clang with
# libFuzzer (Debian: clang, libclang-rt-dev); install-deps.sh installs them.
# Prints libFuzzer's final stats; exits non-zero on a crash, leaving the
# input that crashed in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
target=${2:-store}
case "$target" in
  store | ledger) ;;
  *) echo "fuzz.sh: unknown fuzzer '$target' (store or ledger)" >&2; exit 2 ;;
esac
[[ -f build/proto/shmtensor/v1/shmtensor.pb.cc ]] || ./deploy/build.sh
if ! command -v clang++ >/dev/null ||
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
       >/dev/null 2>&1; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends clang \
    "$(apt-cache show libclang-rt-dev >/dev/null 2>&1 && echo libclang-rt-dev ||
       echo libclang-rt-14-dev)"
fi
out=build-fuzz
mkdir -p "$out/$target-corpus"
# The store and what it stands on, compiled with coverage for the fuzzer.
# Every source of daemon/store (so a new one is never missed), and of the
# folders it includes what it uses; no segment (the fuzzer's are fake).
mapfile -t store_srcs < <(ls daemon/store/*.cc | grep -v '_test\.cc$')
srcs=("tests/fuzz/${target}_fuzzer.cc" testing/cpp/blocking_store.cc "${store_srcs[@]}"
  daemon/memory/pool.cc daemon/memory/pool_access.cc daemon/memory/range_allocator.cc
  daemon/memory/writer_map.cc daemon/ledger/ledger.cc
  daemon/os/mapped_fd.cc daemon/os/peer.cc common/errors.cc common/dtype.cc
  common/release_ring.cc
  build/proto/shmtensor/v1/shmtensor.pb.cc build/proto/shmtensor/v1/monitor.pb.cc)
# shellcheck disable=SC2046
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -I. -Icommon/include -Ibuild/proto \
  "${srcs[@]}" -o "$out/${target}_fuzzer" \
  $(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format \
      absl_synchronization absl_flat_hash_map absl_flat_hash_set absl_time \
      absl_btree protobuf spdlog libcrypto)
cd "$out"
"./${target}_fuzzer" -max_total_time="$seconds" -max_len=4096 \
  -print_final_stats=1 -timeout=10 "$target-corpus" 2>&1 | grep -vE "^(\"|######)" | tail -12
