#!/usr/bin/env bash
# Installs the Debian 12 (and 13) packages shmtensor needs to build, run and
# test, skipping those already installed. Debian's archive only; nothing
# else.
set -euo pipefail

PACKAGES=(
  cmake g++ make pkg-config
  help2man  # the man pages, from --help (man/)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libcli11-dev libtomlplusplus-dev
  libboost-dev libssl-dev
  libtorch-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest
  python3-setuptools  # torch's test utilities import it (python/tests/torch_suite)
  python3-matplotlib
  # The package build (pyproject.toml) and its install into a virtualenv.
  python3-venv python3-pip python3-wheel
  ninja-build  # scikit-build-core's generator: a parallel build.
)
# The Python build backend: scikit-build-core where Debian has it (13 and
# later); on Debian 12 setuptools drives CMake (setup.py).
. /etc/os-release
case "${VERSION_ID:-}" in
  12) ;;
  *) PACKAGES+=(python3-scikit-build-core) ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-deps: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
