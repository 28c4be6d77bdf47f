"""The private daemon a job starts when nobody runs one (shmtensor._autostart):
started once, shared by the job's children, gone with the job however it
ends, and never started when an address is given or a daemon serves the
default one.

Each job is a real interpreter with no $SHMTENSOR_ADDRESS and its own
$XDG_RUNTIME_DIR, so the default address is one where no daemon runs (the
machine's own default daemon, if any, is not touched)."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import Daemon, child_env, shmtensor_shm_files

JOB_PREAMBLE = """
import json, os, sys
import numpy as np
import shmtensor
from shmtensor import _autostart
def report(**kw):
    print(json.dumps(kw), flush=True)
"""


RUN = None  # The running test's $XDG_RUNTIME_DIR for its jobs.


@pytest.fixture(autouse=True)
def run_dir():
    """The jobs' $XDG_RUNTIME_DIR: short (a socket path has 107 bytes), and
    removed after the test."""
    global RUN
    RUN = pathlib.Path(tempfile.mkdtemp(prefix="st-run-", dir="/tmp"))
    yield RUN
    shutil.rmtree(RUN, ignore_errors=True)


def job_env(tmp_path, **extra):
    env = child_env(XDG_RUNTIME_DIR=str(RUN), SHMTENSOR_POOL_SIZE="64MiB")
    env.pop("SHMTENSOR_ADDRESS", None)
    env.pop("SHMTENSOR_AUTOSTART", None)
    env.update(extra)
    return env


def write_job(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text(JOB_PREAMBLE + textwrap.dedent(body))
    return str(path)


def run_job(tmp_path, body, env=None, timeout=120):
    return subprocess.run([sys.executable, write_job(tmp_path, body)],
                          env=env or job_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)


def start_job(tmp_path, body, name="job.py", env=None):
    return subprocess.Popen([sys.executable, write_job(tmp_path, body, name)],
                            env=env or job_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def reports(stdout):
    return [json.loads(line) for line in stdout.splitlines()
            if line.startswith("{")]


def alive(pid):
    """True while `pid` runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pid, address, within=10.0):
    """The private daemon `pid` ends and leaves nothing: no file in
    /dev/shm (it never makes one), no socket, no directory."""
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"private daemon {pid} still runs"
    directory = os.path.dirname(address[len("unix:"):])
    deadline = time.monotonic() + within
    while os.path.exists(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shmtensor_shm_files(), shmtensor_shm_files()
    assert not os.path.exists(directory), os.listdir(directory)


USE = """
c = shmtensor.connect()
ref = c.put(np.arange(1000, dtype=np.int64))
pid, address = _autostart.private_daemon()
report(pid=pid, address=address, env=os.environ["SHMTENSOR_ADDRESS"],
       total=int(np.asarray(c.get(ref)).sum()))
"""


def test_a_job_that_exits_normally_starts_one_daemon_that_ends_with_it(tmp_path):
    out = run_job(tmp_path, USE + """
# Later connects, from any thread, use the same daemon.
import threading
seen = []
t = threading.Thread(target=lambda: seen.append(_autostart.resolve()))
t.start(); t.join()
report(again=shmtensor.connect().daemon_epoch == c.daemon_epoch,
       thread=seen[0])
""")
    assert out.returncode == 0, out.stderr
    first, second = reports(out.stdout)
    assert first["total"] == 499500
    assert first["env"] == first["address"]
    assert second == {"again": True, "thread": first["address"]}
    # One log line, naming what was started.
    lines = [l for l in out.stderr.splitlines() if "private shmtensord" in l]
    assert len(lines) == 1, out.stderr
    assert f"pid {first['pid']}" in lines[0] and first["address"] in lines[0]
    assert "64MiB pool" in lines[0]
    assert first["address"].startswith("unix:" + str(RUN))
    assert_gone(first["pid"], first["address"])


def test_a_job_that_raises_leaves_nothing(tmp_path):
    out = run_job(tmp_path, USE + "raise RuntimeError('the job failed')\n")
    assert out.returncode == 1 and "the job failed" in out.stderr
    (first,) = reports(out.stdout)
    assert_gone(first["pid"], first["address"])


def test_a_sigkilled_job_leaves_nothing(tmp_path):
    job = start_job(tmp_path, USE + """
view = c.get(ref)           # Held while the job is killed.
buf = c.create((1 << 20,), "uint8")
report(holding=True)
import time; time.sleep(300)
""")
    try:
        first = json.loads(job.stdout.readline())
        assert json.loads(job.stdout.readline()) == {"holding": True}
        assert alive(first["pid"]) and not shmtensor_shm_files()
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=10)
        assert_gone(first["pid"], first["address"])
    finally:
        job.kill()
        job.communicate()


def test_two_jobs_at_once_each_get_their_own(tmp_path):
    body = USE + """
sys.stdin.readline()  # Until the test has seen both.
report(still=int(np.asarray(c.get(ref)).sum()))
"""
    env = job_env(tmp_path)
    jobs = [subprocess.Popen([sys.executable, write_job(tmp_path, body, f"j{i}.py")],
                             env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for i in range(2)]
    try:
        firsts = [json.loads(j.stdout.readline()) for j in jobs]
        assert firsts[0]["pid"] != firsts[1]["pid"]
        assert firsts[0]["address"] != firsts[1]["address"]
        assert all(alive(f["pid"]) for f in firsts)
        for j in jobs:
            j.stdin.write("\n")
            j.stdin.flush()
        for j, f in zip(jobs, firsts):
            out, err = j.communicate(timeout=60)
            assert j.returncode == 0, err
            assert reports(out) == [{"still": 499500}]
        for f in firsts:
            assert_gone(f["pid"], f["address"])
    finally:
        for j in jobs:
            j.kill()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_children_share_the_parents_daemon(tmp_path, method):
    out = run_job(tmp_path, f"""
import multiprocessing as mp
def child(ref, q):
    import shmtensor
    from shmtensor import _autostart
    c = shmtensor.connect()
    q.put((_autostart.private_daemon(), os.environ.get("SHMTENSOR_ADDRESS"),
           int(np.asarray(c.get(ref)).sum())))
if __name__ == "__main__":
""" + textwrap.indent(USE, "    ") + f"""
    ctx = mp.get_context({method!r})
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(shmtensor.ObjectRef(bytes(ref)), q))
    p.start()
    own, address, total = q.get(timeout=60)
    p.join(60)
    report(own=own, address=address, total=total, exitcode=p.exitcode)
""")
    assert out.returncode == 0, out.stderr
    first, second = reports(out.stdout)
    assert second == {"own": None, "address": first["address"],
                      "total": 499500, "exitcode": 0}
    assert out.stderr.count("private shmtensord") == 1, out.stderr
    assert_gone(first["pid"], first["address"])


def test_autostart_off_gives_the_daemon_unavailable_error(tmp_path):
    out = run_job(tmp_path, """
try:
    shmtensor.connect(connect_timeout=0.5)
except shmtensor.DaemonUnavailableError as e:
    report(error=str(e), own=_autostart.private_daemon())
""", env=job_env(tmp_path, SHMTENSOR_AUTOSTART="0"))
    assert out.returncode == 0, out.stderr
    (r,) = reports(out.stdout)
    assert r["own"] is None
    assert str(RUN / "shmtensord.sock") in r["error"]
    assert os.listdir(RUN) == []


def test_an_explicit_address_never_autostarts(tmp_path):
    gone = f"unix:{tmp_path}/none/d.sock"
    out = run_job(tmp_path, f"""
for how in ("argument", "environment"):
    try:
        if how == "argument":
            shmtensor.connect({gone!r}, connect_timeout=0.5)
        else:
            os.environ["SHMTENSOR_ADDRESS"] = {gone!r}
            shmtensor.connect(connect_timeout=0.5)
    except shmtensor.DaemonUnavailableError as e:
        report(how=how, named={gone!r} in str(e),
               own=_autostart.private_daemon())
""")
    assert out.returncode == 0, out.stderr
    assert reports(out.stdout) == [
        {"how": "argument", "named": True, "own": None},
        {"how": "environment", "named": True, "own": None}]
    assert os.listdir(RUN) == []
    assert "private shmtensord" not in out.stderr


def test_a_daemon_at_the_default_address_is_used_as_it_is(tmp_path):
    env = job_env(tmp_path)
    default = os.path.join(env["XDG_RUNTIME_DIR"], "shmtensord.sock")
    d = Daemon(path=default)
    try:
        out = run_job(tmp_path, USE.replace(
            "pid, address = _autostart.private_daemon()",
            "pid, address = None, _autostart.resolve()")
            .replace('env=os.environ["SHMTENSOR_ADDRESS"]',
                     'env=os.environ.get("SHMTENSOR_ADDRESS"), '
                     'own=_autostart.private_daemon()'), env=env)
        assert out.returncode == 0, out.stderr
        (r,) = reports(out.stdout)
        assert r == {"pid": None, "address": "unix:" + default, "env": None,
                     "own": None, "total": 499500}
        assert "private shmtensord" not in out.stderr
    finally:
        d.kill()


def test_the_default_pool_fits_the_machine_and_a_bad_size_is_named(tmp_path):
    # The default (no SHMTENSOR_POOL_SIZE): what _default_pool_bytes chose
    # (its rule is tested with a faked /dev/shm and cgroup below).
    env = job_env(tmp_path)
    del env["SHMTENSOR_POOL_SIZE"]
    out = run_job(tmp_path, """
from shmtensor import _autostart
c = shmtensor.connect()
report(size=c.stats()["pools"][0]["size_bytes"],
       expected=_autostart._private.pool)
""", env=env)
    assert out.returncode == 0, out.stderr
    (r,) = reports(out.stdout)
    assert f"{r['size'] >> 20}MiB" == r["expected"]
    assert 16 << 20 <= r["size"] <= 1 << 30

    out = run_job(tmp_path, """
try:
    shmtensor.connect()
except shmtensor.DaemonUnavailableError as e:
    report(error=str(e))
""", env=job_env(tmp_path, SHMTENSOR_POOL_SIZE="lots"))
    assert out.returncode == 0, out.stderr
    (r,) = reports(out.stdout)
    assert "exited with status 2 before serving" in r["error"], r
    assert "--pool-size lots" in r["error"]
    assert "--pool-size" in out.stderr  # The daemon's own message.
    assert os.listdir(RUN) == []


def test_the_owner_must_be_the_daemons_parent(daemon):
    # shmtensord --owner-pid with a pid that is not its parent (here: pid 1)
    # refuses to start: it could not tell that process from a later one.
    from conftest import DAEMON
    out = subprocess.run([DAEMON, "--listen", daemon.address + "x",
                          "--owner-pid", "1"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2
    assert "owner pid 1 is not this daemon's parent" in out.stdout + out.stderr



def test_the_default_pool_shrinks_to_available_memory_and_a_limit(monkeypatch):
    from shmtensor import _autostart

    available = {"bytes": 64 << 20}  # A small machine, nearly full.
    monkeypatch.setattr(_autostart, "_mem_available",
                        lambda: available["bytes"])
    monkeypatch.setattr(_autostart, "_cgroup_memory_limit", lambda: None)
    # /dev/shm plays no part: the pool is a memfd.
    monkeypatch.setattr(_autostart.os, "statvfs", None)
    assert _autostart._default_pool_bytes() == "32MiB"
    available["bytes"] = 64 << 30
    assert _autostart._default_pool_bytes() == "1024MiB"
    # A systemd unit with MemoryMax=512M.
    monkeypatch.setattr(_autostart, "_cgroup_memory_limit", lambda: 512 << 20)
    assert _autostart._default_pool_bytes() == "128MiB"
    available["bytes"] = 20 << 20
    with pytest.raises(Exception) as e:
        _autostart._default_pool_bytes()
    assert "SHMTENSOR_POOL_SIZE" in str(e.value) and "10 MiB" in str(e.value)
    assert isinstance(e.value, _autostart.DaemonUnavailableError)


def test_in_a_container_like_setting_another_uid_and_a_64_mib_shm():
    """A job as another user (nobody), with a /dev/shm of its own of 64 MiB
    (a container's default), and no daemon: the private daemon it starts
    gets a pool larger than that /dev/shm (its memory is a memfd), serves,
    and never puts a file in the tmpfs. Needs root (a mount namespace,
    setpriv); skipped without."""
    if os.geteuid() != 0 or not shutil.which("unshare") or \
            not shutil.which("setpriv"):
        pytest.skip("needs root, unshare and setpriv")
    code = JOB_PREAMBLE + textwrap.dedent("""
        c = shmtensor.connect()
        ref = c.put(np.ones((1 << 20,), np.uint8))
        pid, address = _autostart.private_daemon()
        report(uid=os.getuid(), pool=c.stats()["pools"][0]["size_bytes"],
               total=int(np.asarray(c.get(ref)).sum()), pid=pid,
               address=address, shm=sorted(os.listdir("/dev/shm")))
        """)
    env = child_env()
    for name in ("SHMTENSOR_ADDRESS", "SHMTENSOR_POOL_SIZE", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    # Nothing mounted here may reach the host's namespace: every mount
    # private, or (in a chroot, whose / is no mount point) /dev/shm's.
    script = ("{ mount --make-rprivate / 2>/dev/null ||"
              " mount --make-private /dev/shm; } &&"
              " mount -t tmpfs -o size=64m,mode=1777 shmtensor-test-shm /dev/shm"
              " && setpriv --reuid=65534 --regid=65534 --clear-groups "
              f"{sys.executable} -c \"$JOB\"; rc=$?; "
              # The daemon cleans up once the job has ended: up to 10 s.
              "for i in $(seq 100); do [ -z \"$(ls -A /dev/shm)\" ] && break;"
              " sleep 0.1; done; echo left=$(ls -A /dev/shm | wc -l); exit $rc")
    env["JOB"] = code
    out = subprocess.run(["unshare", "--mount", "--propagation", "unchanged",
                          "sh", "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, cwd="/")
    if out.returncode != 0 and out.stderr.startswith("unshare:"):
        pytest.skip(f"no mount namespace here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stdout + out.stderr
    (r,) = reports(out.stdout)
    assert r["uid"] == 65534 and r["total"] == 1 << 20
    assert r["pool"] > 64 << 20, r
    assert r["shm"] == [], r
    assert f"{r['pool'] >> 20}MiB pool" in out.stderr
    assert "left=0" in out.stdout, out.stdout
    # The daemon ended with the job (before the shell listed /dev/shm, or
    # just after: wait for it) and its directory in /tmp is gone.
    deadline = time.monotonic() + 10
    while alive(r["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(r["pid"])
    assert not os.path.exists(os.path.dirname(r["address"][len("unix:"):]))


def test_a_private_daemon_that_died_is_named_in_the_error(tmp_path):
    out = run_job(tmp_path, USE + """
import signal, time
os.kill(pid, signal.SIGKILL)
while _autostart._private.process.poll() is None:
    time.sleep(0.01)
try:
    shmtensor.connect(connect_timeout=0.5)
except shmtensor.DaemonUnavailableError as e:
    report(error=str(e), code=e.code)
""")
    assert out.returncode == 0, out.stderr
    first, second = reports(out.stdout)
    # A killed daemon leaves its socket directory (its pool was a memfd:
    # nothing in /dev/shm); the test removes it.
    assert not shmtensor_shm_files()
    directory = os.path.dirname(first["address"][len("unix:"):])
    shutil.rmtree(directory, ignore_errors=True)
    assert f"(pid {first['pid']}) was killed by signal 9" in second["error"]
    assert "its log is on this process's stderr" in second["error"]
    assert second["code"] == "UNAVAILABLE"


def _as_user(uid, code, *args, env=None):
    """Popen of `code` (with `args`) in this interpreter as `uid`
    (setpriv), in "/"."""
    return subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
         sys.executable, "-c", code, *args], env=env or child_env(), cwd="/",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _needs_other_users():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as other users")


def _job_env_without_runtime_dir():
    env = child_env(SHMTENSOR_POOL_SIZE="32MiB")
    for name in ("SHMTENSOR_ADDRESS", "SHMTENSOR_AUTOSTART", "XDG_RUNTIME_DIR",
                 "TMPDIR"):
        env.pop(name, None)
    return env


JOB_AS_USER = JOB_PREAMBLE + """
try:
    c = shmtensor.connect()
    ref = c.put(np.arange(1000, dtype=np.int64))
    report(uid=os.getuid(), private=_autostart.private_daemon(),
           total=int(np.asarray(c.get(ref)).sum()))
except Exception as e:
    report(error=f"{type(e).__name__}: {e}")
"""

SQUAT_DEFAULT = """
import os, socket, sys, time
d = sys.argv[1]
os.mkdir(d, 0o777)
os.chmod(d, 0o777)
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(d, "shmtensord.sock"))
os.chmod(os.path.join(d, "shmtensord.sock"), 0o777)
s.listen(64)
print("ready", flush=True)
time.sleep(600)
"""


def test_another_users_socket_at_the_default_address_gets_a_private_daemon():
    # Without $XDG_RUNTIME_DIR the default is /tmp/shmtensor-<uid>/; another
    # user made that directory and listens there. The job starts its own
    # daemon instead of failing, and says once why.
    _needs_other_users()
    job_uid, squatter_uid = 65524, 65525
    directory = f"/tmp/shmtensor-{job_uid}"
    shutil.rmtree(directory, ignore_errors=True)
    squatter = _as_user(squatter_uid, SQUAT_DEFAULT, directory)
    try:
        assert squatter.stdout.readline().strip() == "ready", \
            squatter.stderr.read()
        job = _as_user(job_uid, JOB_AS_USER, env=_job_env_without_runtime_dir())
        out, err = job.communicate(timeout=120)
        (r,) = reports(out)
        assert "error" not in r, r
        assert r["uid"] == job_uid and r["total"] == sum(range(1000))
        assert r["private"] is not None, r
        assert err.count(f"not using the default address unix:{directory}"
                         "/shmtensord.sock") == 1, err
        assert f"uid {squatter_uid}" in err, err
    finally:
        squatter.kill()
        squatter.wait()
        shutil.rmtree(directory, ignore_errors=True)


WATCH_AND_SQUAT = """
import os, re, sys, time
made = 0
end = time.monotonic() + float(sys.argv[1])
print("ready", flush=True)
while time.monotonic() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\\0")
        except OSError:
            continue
        if args and args[0].endswith(b"shmtensord") and b"--listen" in args:
            path = args[args.index(b"--listen") + 1].decode()[len("unix:"):]
            # A job's private daemon only: the other test files' daemons
            # (their launcher makes their directories) are not its target.
            if "/shmtensor-job-" not in path:
                continue
            try:
                os.mkdir(os.path.dirname(path), 0o777)
                made += 1
            except OSError:
                pass
print("made", made, flush=True)
"""


def test_nobody_can_make_a_private_daemons_directory_first():
    # Another user reads every new shmtensord's --listen from /proc and
    # makes that directory before the daemon can: the job makes it before
    # the daemon is started, so its name is never public before it exists.
    _needs_other_users()
    job_uid, watcher_uid = 65524, 65525
    watcher = _as_user(watcher_uid, WATCH_AND_SQUAT, "60")
    try:
        assert watcher.stdout.readline().strip() == "ready"
        results = []
        for _ in range(4):
            job = _as_user(job_uid, JOB_AS_USER,
                           env=_job_env_without_runtime_dir())
            out, err = job.communicate(timeout=120)
            results.append((reports(out) or [{"error": err}])[0])
        assert [r.get("error") for r in results] == [None] * 4, results
        assert all(r["private"] is not None for r in results)
    finally:
        watcher.kill()
        watcher.wait()
        for name in os.listdir("/tmp"):
            p = os.path.join("/tmp", name)
            if name.startswith("shmtensor-job-") and \
                    os.stat(p).st_uid == watcher_uid:
                shutil.rmtree(p, ignore_errors=True)


def test_a_sigkilled_private_daemon_leaves_nothing(tmp_path):
    out = run_job(tmp_path, USE + """
import signal, time
os.kill(pid, signal.SIGKILL)
directory = os.path.dirname(address[len("unix:"):])
deadline = time.monotonic() + 10
while os.path.exists(directory) and time.monotonic() < deadline:
    time.sleep(0.02)
report(left=os.listdir(directory) if os.path.exists(directory) else None)
""")
    assert out.returncode == 0, out.stderr
    first, second = reports(out.stdout)
    # Gone while the job still ran, not only at its exit.
    assert second["left"] is None, second
    assert os.listdir(RUN) == []
