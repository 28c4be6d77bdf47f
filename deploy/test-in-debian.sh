#!/usr/bin/env bash
# Runs the README's commands on a Debian release in a debootstrapped root,
# from Debian's archive only: Debian 13 (trixie: Python 3.13, torch 2.6,
# NumPy 2, gcc 14) or Debian 12 (bookworm) from any Debian host.
#
#   deploy/test-in-debian.sh RELEASE [ROOT] [--fresh] [-- COMMAND...]
#
# RELEASE is 12, 13, bookworm or trixie. ROOT (default
# /var/tmp/shmtensor-CODENAME) is made with debootstrap on first use (again
# with --fresh) and kept for the next run. The tree (tracked files and
# untracked ones git does not ignore) is copied to ROOT/src; then COMMAND
# runs there in the root, by default the README's: ./deploy/test.sh (which
# installs the packages it needs with apt-get, builds, installs the package
# with pip into a virtualenv and runs every test), then ./deploy/run.sh,
# checked to serve (shmtensorctl health) and stopped. ROOT/src/build stays
# from one run to the next, so a rebuild is incremental. Inside the root:
# /proc, /sys, /dev (a recursive bind, made a slave so nothing propagates
# back) and a tmpfs of its own on /dev/shm; unmounted in reverse order on
# exit. Needs root. $DEBIAN_MIRROR overrides http://deb.debian.org/debian.
set -euo pipefail

case "${1:-}" in
  12 | bookworm) CODENAME=bookworm ;;
  13 | trixie) CODENAME=trixie ;;
  *)
    echo "usage: $0 RELEASE [ROOT] [--fresh] [-- COMMAND...] (RELEASE: 12, 13, bookworm or trixie; got '${1:-}')" >&2
    exit 2
    ;;
esac
shift
ROOT=/var/tmp/shmtensor-$CODENAME
if [ $# -gt 0 ] && [ "$1" != "--" ] && [ "$1" != "--fresh" ]; then
  ROOT=$(realpath -m "$1")  # Before the cd: relative to where it was run.
  shift
fi
FRESH=0
if [ "${1:-}" = "--fresh" ]; then
  FRESH=1
  shift
fi
cd "$(dirname "$0")/.."
case "$ROOT/" in
  "$(pwd)"/*)
    echo "test-in-debian: the root must be outside the tree (got $ROOT)" >&2
    exit 1
    ;;
esac
[ "${1:-}" = "--" ] && shift
if [ $# -eq 0 ]; then
  # The README's commands.
  set -- bash -c '
    set -e
    ./deploy/test.sh
    echo "test-in-debian: ./deploy/run.sh"
    dir=$(mktemp -d /tmp/shmtensor-run-XXXXXX)
    ./deploy/run.sh --listen "unix:$dir/d.sock" --pool-size 64MiB &
    pid=$!
    trap "kill -TERM $pid 2>/dev/null || true" EXIT
    for _ in $(seq 100); do
      if ./build/bin/shmtensorctl --address "unix:$dir/d.sock" --timeout 1 health 2>/dev/null; then
        break
      fi
      sleep 0.2
    done
    ./build/bin/shmtensorctl --address "unix:$dir/d.sock" status
    kill -TERM $pid
    wait $pid
    rmdir "$dir"
    echo "test-in-debian: ./deploy/run.sh served and stopped cleanly"'
fi
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ "$(id -u)" -ne 0 ]; then
  echo "test-in-debian: needs root (debootstrap, mounts, chroot)" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends debootstrap
fi
# The marker is written only once debootstrap succeeded: a root it left
# half made is made again.
if [ "$FRESH" = 1 ] || [ ! -f "$ROOT/.shmtensor-debootstrap-done" ]; then
  echo "test-in-debian: making a $CODENAME root in $ROOT"
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  debootstrap --variant=minbase "$CODENAME" "$ROOT" "$MIRROR"
  touch "$ROOT/.shmtensor-debootstrap-done"
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true
  done
}
trap cleanup EXIT
mount_in() {  # mount_in TARGET ARGS...
  local target=$ROOT$1
  shift
  if mountpoint -q "$target"; then  # Left by a run that was killed.
    umount -R "$target" || umount -l "$target"
  fi
  mount "$@" "$target"
  mounted+=("$target")
}
mount_in /proc -t proc proc
mount_in /sys -t sysfs sys
mount_in /dev --rbind /dev
mount --make-rslave "$ROOT/dev"
mount_in /dev/shm -t tmpfs -o size=50%,mode=1777 tmpfs

echo "test-in-debian: copying the tree to $ROOT/src (its build/ is kept)"
mkdir -p "$ROOT/src"
stage="$ROOT/src.new"
rm -rf "$stage"
mkdir -p "$stage"
# Tracked files deleted in the work tree are listed too: skipped. Every file
# lands as new (-m); one whose content is the previous copy's gets that
# copy's time back. So the kept build/ rebuilds exactly what changed, however
# old the changed file's own time is (a commit made before the last run's
# build would otherwise look built).
git ls-files -co --exclude-standard -z |
  tar --null --ignore-failed-read -T - -cf - | tar -xmf - -C "$stage"
(cd "$stage" && find . -type f -print0) |
  while IFS= read -r -d '' f; do
    if cmp -s "$stage/$f" "$ROOT/src/$f"; then
      touch -r "$ROOT/src/$f" "$stage/$f"
    fi
  done
find "$ROOT/src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
find "$stage" -mindepth 1 -maxdepth 1 -exec mv -t "$ROOT/src" {} +
rmdir "$stage"

chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive CI="${CI:-}" \
  bash -c 'cd /src && "$@"' test-in-debian "$@"
