#!/usr/bin/env bash
# deploy/check-packages.sh (build, lintian, install, run, purge the Debian
# packages) in a Debian 12 and a Debian 13 root made for it
# (deploy/test-in-debian.sh; --fresh makes each root anew, as a release
# check should). Beside ./deploy/test.sh, not inside it: it takes a
# package build per release.
#   deploy/test-debian-packages.sh [--fresh] [RELEASE...]   (default: 12 13)
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=()
if [ "${1:-}" = "--fresh" ]; then fresh=(--fresh); shift; fi
releases=("$@")
[ ${#releases[@]} -eq 0 ] && releases=(12 13)
for r in "${releases[@]}"; do
  echo "test-debian-packages: Debian $r"
  ./deploy/test-in-debian.sh "$r" "/var/tmp/shmtensor-packages-$r" \
    "${fresh[@]}" -- ./deploy/check-packages.sh
done
