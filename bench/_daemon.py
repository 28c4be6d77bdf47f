"""A shmtensord for the Python benchmarks, started from the build tree."""

import os
import socket
import subprocess
import tempfile
import time

DAEMON = os.environ.get("SHMTENSOR_DAEMON") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin",
    "shmtensord")


def _die_with_parent():
    """In the daemon's child process: SIGKILL it when this process dies, so
    a killed run leaves no daemon (and no pool) behind."""
    import ctypes
    import signal as _signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG


class HugeTmpfs:
    """A tmpfs with 2 MiB pages for a benchmark's pool: the directory given
    in $SHMTENSOR_HUGE_DIR, or one mounted huge=always for the run (needs
    root) and unmounted at the end. `path` is None, and `why` says why, when
    neither is possible."""

    def __init__(self, size):
        self.path, self.why, self._mounted = None, "", False
        given = os.environ.get("SHMTENSOR_HUGE_DIR")
        if given:
            self.path = given
            return
        path = tempfile.mkdtemp(prefix="shmtensor-huge-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o",
                            f"huge=always,size={size},mode=0700",
                            # Named after us: the C++ tests unmount it if
                            # we die first (tests/scoped_tmpfs.h).
                            f"shmtensor-bench-{os.getpid()}", path],
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


class Daemon:
    _count = 0

    def __init__(self, pool_size, pool_dir=None, config=None):
        Daemon._count += 1
        # A directory of its own: the daemon makes it 0700.
        self.path = f"/tmp/shmtensor-pybench-{os.getpid()}-{Daemon._count}/d.sock"
        self.address = "unix:" + self.path
        args = [DAEMON, "--listen", self.address, "--log-level", "warn"]
        args += ["--config", config] if config else ["--pool-size", pool_size]
        if pool_dir:
            args += ["--pool-dir", pool_dir]
        self.proc = subprocess.Popen(args, preexec_fn=_die_with_parent)
        while True:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.path)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("shmtensord did not start")
                time.sleep(0.01)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
