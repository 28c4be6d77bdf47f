#!/usr/bin/env bash
# Starts shmtensord as a deployment file configures it (its pools and its
# memory limit) inside a memory cgroup of that limit, and checks that it
# serves: the shared-memory pages a daemon reserves for its pools are charged
# to its own memory cgroup, so a limit that does not account for the pools
# gets the daemon refused at start (it checks memory.max, naming it).
#
#   deploy/check_memory_limit.sh systemd      # deploy/systemd/shmtensord.service
#                                             # with deploy/shmtensord.toml
#   deploy/check_memory_limit.sh kubernetes   # the DaemonSet and its ConfigMap
#   ... [--limit BYTES]                       # another limit (e.g. to see one
#                                             # too small fail)
#
# Exit 0 when the daemon served under the limit, 1 when it did not, 77 when
# this machine cannot run the check (not root, no memory cgroup). Needs the
# build (build/bin/shmtensord, build/bin/shmtensorctl).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-systemd}
limit=""
[[ "${2:-}" == "--limit" ]] && limit=$3
bin=build/bin
tmp=$(mktemp -d /tmp/shmtensor-memcheck-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

to_bytes() {  # 1536M, 8704Mi, 2G, 512Mi, plain bytes
  local v=$1 n u
  n=${v%%[!0-9]*}
  u=${v#"$n"}
  case "$u" in
    "") echo "$n" ;;
    K|Ki|KiB) echo $((n << 10)) ;;
    M|Mi|MiB) echo $((n << 20)) ;;
    G|Gi|GiB) echo $((n << 30)) ;;
    *) echo "check_memory_limit: cannot read size '$v'" >&2; exit 2 ;;
  esac
}

case "$what" in
  systemd)
    unit_limit=$(sed -n 's/^MemoryMax=//p' deploy/systemd/shmtensord.service)
    cp deploy/shmtensord.toml "$tmp/shmtensord.toml"
    ;;
  kubernetes)
    y=deploy/kubernetes/shmtensord-daemonset.yaml
    unit_limit=$(sed -n 's/.*limits: {memory: \([0-9A-Za-z]*\)}.*/\1/p' "$y")
    # The ConfigMap's file: the indented block after "shmtensord.toml: |".
    awk '/shmtensord.toml: \|/{on=1; next} on && /^---/{exit}
         on {sub(/^    /, ""); print}' "$y" > "$tmp/shmtensord.toml"
    ;;
  *) echo "usage: $0 systemd|kubernetes [--limit BYTES]" >&2; exit 2 ;;
esac
limit_bytes=$(to_bytes "${limit:-$unit_limit}")
# The deployment's own socket path is not ours to take here.
sed -i '/^listen *=/d' "$tmp/shmtensord.toml"

if [[ $(id -u) -ne 0 ]]; then echo "check_memory_limit: needs root (skipped)"; exit 77; fi
if [[ -d /sys/fs/cgroup/memory && -w /sys/fs/cgroup/memory ]]; then
  cg=/sys/fs/cgroup/memory/shmtensor-memcheck-$$
  mkdir "$cg" || exit 77
  echo "$limit_bytes" > "$cg/memory.limit_in_bytes"
  peak_file=memory.max_usage_in_bytes
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  cg=/sys/fs/cgroup/shmtensor-memcheck-$$
  mkdir "$cg" || exit 77
  echo "$limit_bytes" > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null
  peak_file=memory.peak
else
  echo "check_memory_limit: no writable memory cgroup here (skipped)"; exit 77
fi

sock="$tmp/run/d.sock"
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
  "$bin/shmtensord" --config "$tmp/shmtensord.toml" --listen "unix:$sock" \
  --log-level warn > "$tmp/log" 2>&1 &
pid=$!
ok=0
for _ in $(seq 1 600); do
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  if "$bin/shmtensorctl" --address "unix:$sock" --timeout 1 health >/dev/null 2>&1; then
    ok=1
    break
  fi
  sleep 0.1
done
peak=$(cat "$cg/$peak_file" 2>/dev/null || echo "?")
pool=$(sed -n 's/^size *= *"\(.*\)".*/\1/p' "$tmp/shmtensord.toml" | head -1)
kill -TERM "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
status=$?
rmdir "$cg" 2>/dev/null
if [[ $ok == 1 ]]; then
  echo "check_memory_limit: $what: served under ${limit:-$unit_limit} ($limit_bytes bytes) with a $pool pool; peak charged $peak bytes; exit $status after SIGTERM"
  exit 0
fi
echo "check_memory_limit: $what: did NOT serve under ${limit:-$unit_limit} ($limit_bytes bytes) with a $pool pool (exit $status); log:"
tail -5 "$tmp/log"
exit 1
