#!/usr/bin/env bash
# Runs lifecycle_bench and dataloader_bench of two built trees of shmtensor
# one after the other, in one run, alternating (A B A B), so that a change
# can be told from noise: "no regression" claims in a change's note come
# from here.
#
#   bench/compare_trees.sh OLD_TREE [NEW_TREE] [--full]
#
# Each tree is a checkout with its build/ made (./deploy/build.sh, benches
# on); NEW_TREE defaults to this one. Each bench runs its own daemon from
# its own tree. --quick runs unless --full is given. Output: each run's
# tables, headed by the tree and the round.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(realpath "$1")
shift
NEW=$(pwd)
if [ $# -gt 0 ] && [ "$1" != "--full" ]; then
  NEW=$(realpath "$1")
  shift
fi
QUICK=--quick
[ "${1:-}" = "--full" ] && QUICK=
for tree in "$OLD" "$NEW"; do
  for f in build/bin/lifecycle_bench bench/python/dataloader_bench.py; do
    [ -e "$tree/$f" ] || { echo "compare_trees: $tree/$f is missing" >&2; exit 1; }
  done
done
echo "old: $OLD ($(git -C "$OLD" rev-parse --short HEAD))"
echo "new: $NEW ($(git -C "$NEW" rev-parse --short HEAD))"
echo "machine: $(nproc) cores, $(uname -r)"
for round in 1 2; do
  for tree in "$OLD" "$NEW"; do
    echo
    echo "######## lifecycle_bench $QUICK: $tree, round $round"
    "$tree/build/bin/lifecycle_bench" $QUICK
  done
  for tree in "$OLD" "$NEW"; do
    echo
    echo "######## dataloader_bench $QUICK: $tree, round $round"
    /usr/bin/python3 "$tree/bench/python/dataloader_bench.py" $QUICK \
      --plot "$(mktemp -u /tmp/dataloader_bench-XXXXXX.png)"
  done
done
