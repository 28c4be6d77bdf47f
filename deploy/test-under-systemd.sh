#!/bin/bash
# The unit's restart promises, checked under systemd itself: this Debian's
# own service manager, run as a user instance beside whatever is PID 1 here
# (a container or VM without systemd as init can run it; nothing is
# booted). Checked with Debian 12's systemd 252; systemd 256 and later need
# a unified (cgroup v2) hierarchy, and on a host with cgroup v1 (the dev VM)
# their user manager exits before it serves, which this script reports. It runs deploy/systemd/
# shmtensord.service, adapted as below, and a client that holds a view and
# a named object checks after each event that it kept its session, its view's
# bytes and its refs:
#   1. Type=notify: `systemctl start` returns once the daemon said READY=1,
#      and the daemon stored its pools, ledger and sockets (FDSTORE=1).
#   2. SIGKILL of the daemon: Restart=on-failure starts the next instance
#      with the stored descriptors ($LISTEN_FDS), and it adopts them.
#   3. `systemctl reload` (ExecReload=): the daemon re-executes in place.
#   4. `systemctl stop`: the client's session ends with a precise error.
#
# The unit as installed, less what a user instance cannot do or what would
# hide this checkout: User=/Group= (a user manager runs its units as its
# own user), RequiresMountsFor= (a system mount), MemoryMax=/TasksMax=
# (deploy/check_memory_limit.sh checks those) and the sandboxing lines
# (PrivateTmp=, ProtectSystem= and the like; `systemd-analyze verify` checks
# the installed unit in deploy tests). ExecStart= runs the build tree's
# daemon with deploy/shmtensord.toml and a socket in the runtime directory;
# output goes to a file.
#
# Usage: deploy/test-under-systemd.sh   (as root, after ./deploy/test.sh:
# it uses build/bin/shmtensord, build/bin/shmtensorctl and the Python
# package installed in build/venv)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
PY="$BUILD/venv/bin/python"
SYSTEMD=/lib/systemd/systemd
for f in "$BUILD/bin/shmtensord" "$BUILD/bin/shmtensorctl" "$PY" "$SYSTEMD"; do
  [ -x "$f" ] || { echo "missing $f (run ./deploy/test.sh first)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }

RT="$(mktemp -d /run/shmtensor-sd.XXXXXX)"
chmod 0700 "$RT"
export XDG_RUNTIME_DIR="$RT" XDG_CONFIG_HOME="$RT/config"
UNIT_DIR="$XDG_CONFIG_HOME/systemd/user"
mkdir -p "$UNIT_DIR"
# sd_booted(): a user instance runs only where the system "was booted with
# systemd", which it tells by this directory. Made here if missing, removed
# at the end.
MADE_BOOTED=""
if [ ! -d /run/systemd/system ]; then
  mkdir -p /run/systemd/system
  MADE_BOOTED=1
fi
MANAGER=""
CLIENT=""
cleanup() {
  set +e
  [ -n "$CLIENT" ] && kill "$CLIENT" 2>/dev/null
  if [ -n "$MANAGER" ]; then
    systemctl --user stop shmtensord.service >/dev/null 2>&1
    kill "$MANAGER" 2>/dev/null
    wait "$MANAGER" 2>/dev/null
  fi
  [ -n "$MADE_BOOTED" ] && rmdir /run/systemd/system 2>/dev/null
  rm -rf "$RT"
}
trap cleanup EXIT

SOCK="$RT/shmtensor/shmtensord.sock"
ADDR="unix:$SOCK"
LOG="$RT/shmtensord.log"
sed -E \
  -e '/^(User|Group|RequiresMountsFor|MemoryMax|TasksMax|NoNewPrivileges|ProtectSystem|ProtectHome|PrivateTmp|PrivateDevices|ReadWritePaths|ProtectKernelTunables|ProtectControlGroups|RestrictAddressFamilies|LockPersonality)=/d' \
  -e "s|^ExecStart=/usr/local/bin/shmtensord --config /etc/shmtensor/shmtensord.toml|ExecStart=$BUILD/bin/shmtensord --config $ROOT/deploy/shmtensord.toml|" \
  -e "s|--listen unix:/run/shmtensor/shmtensord.sock|--listen $ADDR|" \
  -e "s|^\[Service\]|[Service]\nStandardOutput=append:$LOG\nStandardError=append:$LOG|" \
  "$ROOT/deploy/systemd/shmtensord.service" > "$UNIT_DIR/shmtensord.service"
grep -q "ExecStart=$BUILD/bin/shmtensord" "$UNIT_DIR/shmtensord.service"

"$SYSTEMD" --user --log-target=console --log-level=notice \
  > "$RT/manager.log" 2>&1 &
MANAGER=$!
for _ in $(seq 100); do
  [ -S "$RT/systemd/private" ] && break
  sleep 0.1
done
if [ ! -S "$RT/systemd/private" ]; then
  cat "$RT/manager.log"
  echo "FAIL: $("$SYSTEMD" --version | head -1) did not start as a user" \
    "manager; /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)" \
    "(systemd 256 and later need cgroup2fs)"
  exit 1
fi
echo "== $("$SYSTEMD" --version | head -1) as a user manager (pid $MANAGER)"

main_pid() { systemctl --user show -p MainPID --value shmtensord.service; }
fail() {
  echo "FAIL: $*"
  echo "--- unit status"; systemctl --user status shmtensord.service --no-pager || true
  echo "--- daemon log"; tail -40 "$LOG" || true
  echo "--- manager log"; tail -20 "$RT/manager.log" || true
  exit 1
}

echo "== 1. start (Type=notify)"
systemctl --user start shmtensord.service || fail "start"
[ "$(systemctl --user is-active shmtensord.service)" = active ] || fail "not active"
"$BUILD/bin/shmtensorctl" --address "$ADDR" health || fail "health"
grep -q "descriptors stored with systemd" "$LOG" || fail "nothing stored"
PID1="$(main_pid)"
echo "   active, pid $PID1; $(grep -o 'descriptors stored with systemd ([0-9]*)' "$LOG" | tail -1)"

# The client: holds a view of a named object and a ref; on each line it
# reads, checks them and makes a new object, and answers "ok <n>" or the
# error.
coproc CLIENT_PROC {
  exec "$PY" -u -c '
import sys, numpy as np, shmtensor
c = shmtensor.connect(sys.argv[1])
x = np.arange(1 << 18, dtype=np.float32)
ref = c.put(x, name="sd-kept")
view = np.asarray(c.get(ref))
print("ready", c.client_id, flush=True)
n = 0
for line in sys.stdin:
    try:
        assert np.array_equal(view, x), "the view changed"
        again = np.asarray(c.get("sd-kept"))
        assert np.array_equal(again, x), "the name resolves elsewhere"
        r = c.put(x + n)
        assert np.array_equal(np.asarray(c.get(r)), x + n)
        n += 1
        print("ok", n, c.client_id, flush=True)
    except Exception as e:
        print("error", type(e).__name__, str(e).replace("\n", " ")[:300],
              flush=True)
' "$ADDR" 2>&1
}
CLIENT=$CLIENT_PROC_PID
read -r -t 20 READY <&"${CLIENT_PROC[0]}" || fail "client did not start"
echo "   client: $READY"
# One check: the first call after an event may be the one in flight at it
# (UNAVAILABLE, once); the second must succeed.
check() {
  local what="$1" answer
  echo >&"${CLIENT_PROC[1]}"
  read -r -t 30 answer <&"${CLIENT_PROC[0]}" || fail "$what: client hung"
  case "$answer" in
    ok*) ;;
    *) echo "   (first call: $answer)"
       echo >&"${CLIENT_PROC[1]}"
       read -r -t 30 answer <&"${CLIENT_PROC[0]}" || fail "$what: client hung"
       ;;
  esac
  case "$answer" in
    "ok "*" ${READY#ready }") echo "   $what: client $answer (same session)" ;;
    *) fail "$what: client says: $answer" ;;
  esac
}
check "before"

echo "== 2. SIGKILL (Restart=on-failure with the descriptor store)"
kill -KILL "$PID1"
for _ in $(seq 100); do
  PID2="$(main_pid)"
  [ "$PID2" != 0 ] && [ "$PID2" != "$PID1" ] &&
    [ "$(systemctl --user is-active shmtensord.service)" = active ] && break
  sleep 0.1
done
[ "$PID2" != 0 ] && [ "$PID2" != "$PID1" ] || fail "not restarted"
grep -q "adopted the previous daemon's ledger" "$LOG" || fail "not adopted"
echo "   restarted as pid $PID2: $(grep -o "adopted the previous daemon's ledger[^:]*" "$LOG" | tail -1)"
check "after SIGKILL"

echo "== 3. systemctl reload (ExecReload=: re-exec in place)"
RELOADS_BEFORE="$(grep -c 'reload: executing' "$LOG" || true)"
systemctl --user reload shmtensord.service || fail "reload"
for _ in $(seq 100); do
  [ "$(grep -c 'reload: executing' "$LOG" || true)" -gt "$RELOADS_BEFORE" ] &&
    "$BUILD/bin/shmtensorctl" --address "$ADDR" health >/dev/null 2>&1 && break
  sleep 0.1
done
[ "$(main_pid)" = "$PID2" ] || fail "reload changed the main pid"
check "after reload"

echo "== 4. stop"
systemctl --user stop shmtensord.service
echo >&"${CLIENT_PROC[1]}"
read -r -t 30 ANSWER <&"${CLIENT_PROC[0]}" || fail "stop: client hung"
case "$ANSWER" in
  error*SessionEnded*|error*session*ended*) echo "   client: $ANSWER" ;;
  *) fail "after stop the client says: $ANSWER" ;;
esac
[ ! -e "$SOCK" ] || fail "the socket outlived a stop"
echo "PASS: Type=notify, the descriptor store across a SIGKILL, ExecReload= and a stop, under $("$SYSTEMD" --version | head -1)"
