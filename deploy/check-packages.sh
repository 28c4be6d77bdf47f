#!/usr/bin/env bash
# The Debian packages, end to end, on the Debian this runs on (as root, in
# a root of its own: deploy/test-debian-packages.sh runs it in fresh
# Debian 12 and 13 roots). Builds them with Debian's own tools
# (dpkg-buildpackage -us -uc -b), runs lintian (errors fail), installs them
# with apt-get install ./*.deb, starts the daemon as the package configures
# it (the unit's ExecStart= line, as its User=, in its RuntimeDirectory=:
# systemd is not PID 1 here) after systemd-analyze verify of the unit,
# checks shmtensorctl health and status, builds examples/cpp against the
# installed libshmtensor-dev and runs it against that daemon, then purges
# the packages and checks that nothing of them is left.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "check-packages: $*"; }
fail() { echo "check-packages: FAIL: $*" >&2; exit 1; }

apt-get update -q >/dev/null
# What debian/control's Build-Depends name, and the tools of this check.
apt-get build-dep -y -q ./ >/dev/null
apt-get install -y -q --no-install-recommends dpkg-dev debhelper lintian \
  systemd adduser >/dev/null

out=$(mktemp -d /tmp/shmtensor-debs-XXXXXX)
say "dpkg-buildpackage -us -uc -b"
products=(../shmtensor_*.changes ../shmtensor_*.buildinfo ../shmtensord_*.deb
  ../shmtensord-dbgsym_*.deb ../libshmtensor*.deb)
rm -f "${products[@]}"
DEB_BUILD_OPTIONS="parallel=$(nproc)" dpkg-buildpackage -us -uc -b \
  >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; fail "build"; }
mv ../shmtensor_*.changes ../shmtensor_*.buildinfo ../shmtensord_*.deb \
  ../shmtensord-dbgsym_*.deb ../libshmtensor*.deb "$out/"
ls "$out"/*.deb

say "lintian"
lintian --fail-on error "$out"/*.changes |
  tee "$out/lintian.log" || fail "lintian reports errors"

say "apt-get install ./*.deb"
debs=()
for d in "$out"/*.deb; do [[ "$d" == *-dbgsym_* ]] || debs+=("$d"); done
apt-get install -y -q "${debs[@]}" >/dev/null
getent passwd shmtensor >/dev/null || fail "no user shmtensor"
getent group shmtensor >/dev/null || fail "no group shmtensor"
unit=/lib/systemd/system/shmtensord.service
[[ -f "$unit" ]] || unit=/usr/lib/systemd/system/shmtensord.service
[[ -f "$unit" ]] || fail "no unit installed"
[[ -e /etc/systemd/system/multi-user.target.wants/shmtensord.service ]] ||
  fail "the unit is not enabled"
[[ -f /etc/shmtensor/shmtensord.toml ]] || fail "no /etc/shmtensor/shmtensord.toml"
conffiles=$(dpkg-query -W -f='${Conffiles}\n' shmtensord)
grep -q /etc/shmtensor/shmtensord.toml <<<"$conffiles" ||
  fail "the config is not a conffile"
for page in shmtensord.8 shmtensorctl.1 shmtensord.toml.5; do
  ls /usr/share/man/man*/"$page"* >/dev/null 2>&1 || fail "no man page $page"
done
say "systemd-analyze verify $unit"
systemd-analyze verify "$unit" >"$out/verify.log" 2>&1 ||
  { cat "$out/verify.log"; fail "systemd-analyze verify"; }
cat "$out/verify.log"

# The unit's ExecStart=, continuation lines joined, as its user.
exec_start=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$unit" | sed 's/\\$//' |
  tr '\n' ' ' | sed 's/^ExecStart=//')
user=$(sed -n 's/^User=//p' "$unit")
say "starting: $exec_start (as $user)"
install -d -o "$user" -g "$user" -m 0750 /run/shmtensor
# shellcheck disable=SC2086
setpriv --reuid "$user" --regid "$user" --init-groups $exec_start \
  >"$out/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
export SHMTENSOR_ADDRESS=unix:/run/shmtensor/shmtensord.sock
export SHMTENSOR_DAEMON_UID=$user
for _ in $(seq 100); do
  shmtensorctl --timeout 1 health >/dev/null 2>&1 && break
  sleep 0.2
done
shmtensorctl health || { cat "$out/daemon.log"; fail "health"; }
shmtensorctl status

say "examples/cpp against the installed libshmtensor-dev"
cmake -S examples/cpp -B "$out/example" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$out/example" -j"$(nproc)" >/dev/null
coproc PRODUCER { "$out/example/producer"; }
read -r ref <&"${PRODUCER[0]}" || fail "the producer said nothing"
result=$(echo "$ref" | "$out/example/consumer") || fail "consumer: $result"
eval "exec ${PRODUCER[1]}>&-"
wait "$PRODUCER_PID"
say "consumer: $result"
[[ "$result" == "ok 65536 floats, sum 2147450880" ]] || fail "wrong result"
kill -TERM $daemon
wait $daemon || true
trap - EXIT

say "apt-get purge"
apt-get purge -y -q shmtensord libshmtensor0 libshmtensor-dev >/dev/null
left=$(dpkg -l | awk '/shmtensor/ {print $2}')
[[ -z "$left" ]] || fail "packages left: $left"
for path in /etc/shmtensor /usr/sbin/shmtensord /usr/bin/shmtensorctl \
    /usr/include/shmtensor "$unit" \
    /etc/systemd/system/multi-user.target.wants/shmtensord.service; do
  [[ ! -e "$path" ]] || fail "$path is left after purge"
done
getent passwd shmtensor >/dev/null && fail "user shmtensor left after purge"
libs=$(find /usr/lib -name 'libshmtensor*')
[[ -z "$libs" ]] || fail "a library is left: $libs"
rm -rf "$out"
say "PASS"
