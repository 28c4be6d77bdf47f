"""Fixtures: a real shmtensord per test, started from the build tree."""

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two ways to run: against the package pip installed in the interpreter
# running the tests ($SHMTENSOR_TEST_INSTALLED=1, what ctest does: see
# python/CMakeLists.txt), or against the build tree's package
# ($SHMTENSOR_PYTHONPATH, default build/python).
INSTALLED = os.environ.get("SHMTENSOR_TEST_INSTALLED") == "1"
if INSTALLED:
    PYTHONPATH = None
else:
    PYTHONPATH = os.environ.get("SHMTENSOR_PYTHONPATH",
                                os.path.join(REPO, "build", "python"))
    if PYTHONPATH not in sys.path:
        sys.path.insert(0, PYTHONPATH)

import shmtensor  # noqa: E402 - after the path is set.
from shmtensor import _commands  # noqa: E402

if INSTALLED and not os.path.abspath(shmtensor.__file__).startswith(
        os.path.join(sys.prefix, "")):
    raise RuntimeError(f"shmtensor imported from {shmtensor.__file__}, not "
                       f"from the environment {sys.prefix}")
DAEMON = os.environ.get("SHMTENSOR_DAEMON", _commands.binary("shmtensord"))


def child_env(**extra):
    """The environment of a child interpreter that imports the same
    package as this one."""
    env = dict(os.environ, **extra)
    if PYTHONPATH is not None:
        env["PYTHONPATH"] = PYTHONPATH
    return env


def _die_with_parent():
    """In the daemon's child process: SIGKILL it when this process dies, so
    a killed run leaves no daemon (and no pool) behind."""
    import ctypes
    import signal as _signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG


def shmtensor_shm_files():
    """Names in /dev/shm that a shmtensord could have made: there must never
    be any, since pools are unnamed memory (memfd, O_TMPFILE)."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("shmtensor"))


def pool_memfds(pid):
    """The pool memory a process holds descriptors of, as /proc/PID/fd
    names it ("/memfd:shmtensor:default (deleted)", or "/dir/#ino (deleted)"
    for a pool directory's O_TMPFILE file)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:shmtensor:") or "/#" in target:
            out.append(target)
    return out


class Daemon:
    """A shmtensord on a fresh socket; stop() sends SIGTERM. With
    `pool_dir`, its pool is an unnamed file in that tmpfs instead of a
    memfd; with
    `config` (a TOML file), its pools are that file's."""

    def __init__(self, pool_size="256MiB", pool_dir=None, config=None,
                 path=None):
        # A directory of its own, which the daemon makes 0700 (it refuses a
        # socket directory others can write).
        self.path = path or f"/tmp/shmtensor-pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}/d.sock"
        self.address = "unix:" + self.path
        args = [DAEMON, "--listen", self.address, "--log-level", "warn"]
        args += ["--config", config] if config else ["--pool-size", pool_size]
        if pool_dir:
            args += ["--pool-dir", pool_dir]
        self.proc = subprocess.Popen(args, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shmtensord exited with {self.proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        # Its pool: two descriptors (O_RDWR and O_RDONLY) of one memfd.
        assert pool_memfds(self.proc.pid), "daemon serves but holds no pool"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        return self.proc.returncode

    def kill(self):
        """SIGKILLs the daemon if it still runs, then removes what a killed
        daemon leaves behind: its sockets and lock file (its pools are
        unnamed memory, gone with their last holder)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in (self.path, self.path + ".fd", self.path + ".lock"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.kill()


@pytest.fixture
def huge_daemon(tmp_path):
    """A daemon whose 256 MiB pool is on a tmpfs mounted huge=always (2 MiB
    pages). Mounting needs root; the test is skipped, saying so, without."""
    mnt = tmp_path / "huge"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o",
                        "huge=always,size=300m,mode=0700",
                        # Named after us: a later run unmounts it if we
                        # die first (tests/scoped_tmpfs.h).
                        f"shmtensor-pytest-{os.getpid()}", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a huge=always tmpfs: {r.stderr.strip()}")
    try:
        d = Daemon(pool_dir=str(mnt))
        try:
            yield d
        finally:
            d.kill()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def client(daemon):
    import shmtensor
    return shmtensor.connect(daemon.address)


def used(client):
    return client.stats()["pools"][0]["used_bytes"]


def wait_until(predicate, timeout=1.0):
    """Polls `predicate` until true or `timeout` seconds; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.005)


def run_python(code, address, *args, timeout=60):
    """Runs `code` in a fresh interpreter (Debian's, with the package on its
    path) and returns the CompletedProcess."""
    env = child_env(SHMTENSOR_ADDRESS=address)
    return subprocess.run([sys.executable, "-c", code, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def spawn_python(code, address, *args):
    env = child_env(SHMTENSOR_ADDRESS=address)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
