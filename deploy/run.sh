#!/usr/bin/env bash
# Builds shmtensor if needed and starts shmtensord in the foreground on its
# embedded defaults (a 1 GiB pool, socket unix:$XDG_RUNTIME_DIR/shmtensord.sock or unix:/tmp/shmtensor-<uid>/shmtensord.sock, or
# $SHMTENSOR_ADDRESS). Arguments go to shmtensord, e.g. --pool-size 4GiB.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
./deploy/build.sh
exec ./build/bin/shmtensord "$@"
