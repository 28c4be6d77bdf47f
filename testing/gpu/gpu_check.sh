#!/bin/bash
# GPU verification of shmtensor's CUDA pools, in two steps:
#
#   testing/gpu/gpu_check.sh prepare   Here (Debian, CUDA toolkit, no GPU needed):
#                                builds, and gathers into .gpu/ what the GPU
#                                machine lacks: shmtensord, cuda_test and its
#                                helper, every shared library they and the
#                                Python binding need, the binding's static
#                                client libraries and link line, and the absl
#                                headers. (.gpu/ is git-ignored; ~50 MiB.)
#   testing/gpu/gpu_check.sh run       On the GPU machine, from the repository root
#                                with .gpu/ carried (the device tool:
#                                run(command="testing/gpu/gpu_check.sh run",
#                                carry=[".gpu"])): runs the CUDA GoogleTests,
#                                builds the Python binding for that machine's
#                                python3 and torch, runs the CUDA pytest file
#                                and bench/python/gpu_bench.py, and ends with a
#                                short table.
#   testing/gpu/gpu_check.sh run --dry-run
#                                The same here, against .gpu/ alone, with
#                                /usr/bin/python3 and the benchmark on the CPU:
#                                checks the bundle and the script before device
#                                minutes are spent on them.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
G=$ROOT/.gpu

prepare() {
  set -e
  [[ -f build/CMakeCache.txt ]] || cmake -S . -B build >/dev/null
  cmake --build build -j"$(nproc)" --target shmtensord cuda_test st_cuda_child \
    shmtensor_python shmtensor_python_sources
  grep -q 'SHMTENSOR_WITH_CUDA:BOOL=ON' build/CMakeCache.txt ||
    { echo "gpu_check: build has no CUDA (is /usr/local/cuda there?)"; exit 1; }
  rm -rf "$G" && mkdir -p "$G"/bin "$G"/lib "$G"/include
  cp build/bin/shmtensord build/bin/cuda_test build/bin/st_cuda_child "$G"/bin/
  # The binding's link line, with every library copied into .gpu/lib.
  local link=build/python/CMakeFiles/shmtensor_python.dir/link.txt
  local args=() tok f
  for tok in $(sed 's/.* -o [^ ]* //' "$link"); do
    case "$tok" in
      CMakeFiles/*.o) ;;                       # Rebuilt there.
      *.a|*.so|*.so.*)
        f=$(cd build/python && readlink -f "$tok")
        cp -n "$f" "$G"/lib/
        args+=("\$G/lib/$(basename "$f")") ;;
      -l*)
        f=$(ldconfig -p | awk -v n="lib${tok#-l}.so" '$1 ~ "^"n && !f {f = $NF} END {print f}')
        if [[ -n "$f" && "$tok" != -lm && "$tok" != -lrt && "$tok" != -ldl &&
              "$tok" != -latomic ]]; then
          f=$(readlink -f "$f"); cp -n "$f" "$G"/lib/
          args+=("\$G/lib/$(basename "$f")")
        else
          args+=("$tok")
        fi ;;
      *) args+=("$tok") ;;
    esac
  done
  echo "${args[*]}" >"$G"/link_args
  # Every shared library the programs and the binding load, but glibc's.
  for f in "$G"/bin/* build/python/shmtensor/_core*.so; do
    ldd "$f" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r f; do
    case "$(basename "$f")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      *) cp -Ln "$f" "$G"/lib/ ;;
    esac
  done
  # Linking by a library's real file name works; loading needs its soname.
  for f in "$G"/lib/*.so*; do
    local so
    so=$(objdump -p "$f" 2>/dev/null | awk '/SONAME/ {print $2}')
    [[ -n "$so" && ! -e "$G/lib/$so" ]] && ln -s "$(basename "$f")" "$G/lib/$so"
  done
  cp -r /usr/include/absl "$G"/include/
  du -sh "$G"
}

run() {
  local dry=0 py=python3
  [[ "${1:-}" == --dry-run ]] && { dry=1; py=/usr/bin/python3; }
  [[ -d "$G" ]] || { echo "gpu_check: no .gpu/; run 'testing/gpu/gpu_check.sh prepare' first"; exit 1; }
  export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SHMTENSOR_DAEMON=$G/bin/shmtensord SHMTENSOR_CUDA_CHILD=$G/bin/st_cuda_child
  export PYTHONUNBUFFERED=1
  local out=${OUT:-$G/out}
  mkdir -p "$out"
  echo "== machine"
  nvidia-smi -L 2>&1 | head -4
  $py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'

  echo "== 1. CUDA GoogleTests (tests/cuda_test.cc)"
  "$G"/bin/cuda_test --gtest_brief=1 2>&1 | tee "$out"/cuda_test.log | tail -25
  local gtest=${PIPESTATUS[0]}

  echo "== 2. Python binding for $($py -c 'import sys; print(sys.executable)')"
  local inc ext pyb
  inc=$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  ext=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # pybind11's headers: the pip package's there, /usr/include/pybind11 here.
  pyb=$($py -c 'import pybind11; print("-isystem", pybind11.get_include())' 2>/dev/null)
  mkdir -p "$G"/python && cp -r python/shmtensor "$G"/python/
  local build=0 cxx
  cxx=${CXX:-$(command -v g++ || command -v c++ || command -v clang++)}
  [[ -n "$cxx" ]] || echo "gpu_check: no C++ compiler here: Python part skipped"
  # shellcheck disable=SC2046
  [[ -n "$cxx" ]] && "$cxx" -O2 -fPIC -fvisibility=hidden -std=c++17 -shared \
      -I. -Icommon/include -Iclient/include -isystem "$G"/include $pyb -isystem "$inc" \
      python/src/*.cc \
      -o "$G/python/shmtensor/_core$ext" $(G=$G eval echo "$(cat "$G"/link_args)") \
      2>&1 | tail -20 || true
  [[ -f "$G/python/shmtensor/_core$ext" ]] && build=1

  local pytest=1
  if [[ $build == 1 ]]; then
    echo "== 3. CUDA pytest (python/tests/test_cuda.py)"
    (cd python/tests && SHMTENSOR_PYTHONPATH=$G/python PYTHONPATH=$G/python \
      $py -m pytest -q -rs -p no:cacheprovider test_cuda.py 2>&1 | tee "$out"/pytest.log | tail -15)
    pytest=$?
    echo "== 4. GPU benchmark (bench/python/gpu_bench.py)"
    local dev=()
    [[ $dry == 1 ]] && dev=(--device cpu --quick)
    PYTHONPATH=$G/python timeout 420 $py bench/python/gpu_bench.py "${dev[@]}" 2>&1 | tee "$out"/gpu_bench.txt
  fi

  echo "== summary"
  printf '%-34s %s\n' "CUDA GoogleTests" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out"/cuda_test.log | tr '\n' ' ')"
  printf '%-34s %s\n' "Python binding built" "$([[ $build == 1 ]] && echo yes || echo NO)"
  printf '%-34s %s\n' "CUDA pytest" "$(tail -1 "$out"/pytest.log 2>/dev/null)"
  [[ $gtest == 0 && $build == 1 && $pytest == 0 ]]
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) sed -n '2,25p' "$0"; exit 2 ;;
esac
