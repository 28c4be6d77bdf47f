"""The one Python launcher of shmtensord, for the pytest suite and the Python
benchmarks alike: a real daemon on a fresh socket, killed with its parent.

Which daemon: $SHMTENSOR_DAEMON if set, else the one the imported shmtensor
package carries (shmtensor/bin/shmtensord: the build tree's links to
build/bin, a pip-installed package has its own copy).

Thread safety: none; use from one thread.
"""

import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid

__all__ = ["Daemon", "HugeTmpfs", "daemon_path", "pool_memfds",
           "shmtensor_shm_files"]

_PR_SET_PDEATHSIG = 1


def daemon_path():
    """The shmtensord binary the launcher starts."""
    given = os.environ.get("SHMTENSOR_DAEMON")
    if given:
        return given
    from shmtensor import _commands
    return _commands.binary("shmtensord")


def _die_with_parent():
    """In the daemon's child process: SIGKILL it when the launching process
    dies, so a killed run leaves no daemon (and no pool) behind."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG,
                                                   signal.SIGKILL)


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
    """A shmtensord on a fresh socket, serving once the constructor returns.

    `pool_size` gives its one pool (a memfd); with `pool_dir` the pool is an
    unnamed file in that tmpfs instead; with `config` (a TOML file) its pools
    are that file's. `path` places the socket (default: a directory of its
    own under /tmp, which the daemon makes 0700). stop() sends SIGTERM;
    kill() SIGKILLs it if it still runs and removes what a killed daemon
    leaves: its sockets, lock file and socket directory. The context
    manager's exit does both, in that order.
    """

    def __init__(self, pool_size="256MiB", pool_dir=None, config=None,
                 path=None, log_level="warn", start_timeout=30):
        self.path = path or (f"/tmp/shmtensor-test-{os.getpid()}-"
                             f"{uuid.uuid4().hex[:8]}/d.sock")
        self.address = "unix:" + self.path
        args = [daemon_path(), "--listen", self.address,
                "--log-level", log_level]
        args += ["--config", config] if config else ["--pool-size", pool_size]
        if pool_dir:
            args += ["--pool-dir", pool_dir]
        self.proc = subprocess.Popen(args, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"shmtensord exited with {self.proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise
                time.sleep(0.01)
        # Serving means its pools are reserved: the daemon holds them.
        assert pool_memfds(self.proc.pid), "daemon serves but holds no pool"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.stop()  # A clean shutdown (its log's last lines) first.
        finally:
            self.kill()

    def take_over(self, timeout=30):
        """Replaces the daemon by a new one started with --take-over (same
        arguments): the old one hands everything over and exits 0, which
        this waits for; then the new one serves."""
        old = self.proc
        self.proc = subprocess.Popen(list(old.args) + ["--take-over"],
                                     preexec_fn=_die_with_parent)
        assert old.wait(timeout=timeout) == 0, "the old daemon did not exit 0"
        deadline = time.monotonic() + timeout
        while not pool_memfds(self.proc.pid):
            assert self.proc.poll() is None, "the new daemon exited"
            assert time.monotonic() < deadline, "the new daemon never served"
            time.sleep(0.01)

    def stop(self):
        """SIGTERM, then waits (30 s); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        return self.proc.returncode

    def kill(self):
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


class HugeTmpfs:
    """A tmpfs with 2 MiB pages for a pool: the directory $SHMTENSOR_HUGE_DIR
    names, or one mounted huge=always for the context (needs root) and
    unmounted at its end. `path` is None, and `why` says why, when neither
    is possible."""

    def __init__(self, size, parent=None):
        self.path, self.why, self._mounted = None, "", False
        given = os.environ.get("SHMTENSOR_HUGE_DIR")
        if given:
            self.path = given
            return
        path = tempfile.mkdtemp(prefix="shmtensor-huge-", dir=parent)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o",
                            f"huge=always,size={size},mode=0700",
                            # Named after us: the C++ tests unmount it if
                            # we die first (testing/cpp/scoped_tmpfs.h).
                            f"shmtensor-test-{os.getpid()}", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            os.rmdir(path)
            self.why = (f"cannot mount a huge=always tmpfs ({r.stderr.strip()});"
                        " run as root or set SHMTENSOR_HUGE_DIR")
            return
        self.path, self._mounted = path, True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._mounted:
            subprocess.run(["umount", "-l", self.path], check=False)
            os.rmdir(self.path)
