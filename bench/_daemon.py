"""A shmtensord for the Python benchmarks, started from the build tree."""

import os
import socket
import subprocess
import time

DAEMON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                      "bin", "shmtensord")


def _die_with_parent():
    """In the daemon's child process: SIGKILL it when this process dies, so
    a killed run leaves no daemon (and no pool) behind."""
    import ctypes
    import signal as _signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG


class Daemon:
    def __init__(self, pool_size):
        self.path = f"/tmp/shmtensor-pybench-{os.getpid()}.sock"
        self.address = "unix:" + self.path
        self.proc = subprocess.Popen([DAEMON, "--listen", self.address,
                                      "--pool-size", pool_size,
                                      "--log-level", "warn"],
                                     preexec_fn=_die_with_parent)
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
