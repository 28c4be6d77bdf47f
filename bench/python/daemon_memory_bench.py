"""What the daemon's own memory pays per object, per lease and per session,
the figures its default [limits] are sized by (daemon/store/limits.h,
docs/hardening.md). Starts a daemon, reads its resident set (VmRSS) before
and after making N of each, and prints bytes per item. The pool's pages are
shared memory the daemon never maps, so they are not in its VmRSS.

Each figure is printed beside its bound, measured in the same run, and its
ratio to it (figure / bound):

  per item   what docs/shm_layout.md makes the daemon keep in memory for
             the item: its records in the ledger (an object's, a lease's,
             a session's) and, for a session, the daemon's mapping of the
             session's release ring. Both are memfds the daemon maps, so
             their pages are in its VmRSS; the bound is the growth over the
             same N items of their resident pages in the daemon, the Rss
             of those mappings in /proc/PID/smaps, read with each VmRSS.
             The rest of a figure is the daemon's own bookkeeping (its
             tables, its heap, a session's connection and stream).
  baseline   a bare process: the VmRSS of sleep(1), started in the same
             run and read the same way, what any process costs the kernel.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/daemon_memory_bench.py [N]
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import numpy as np  # noqa: E402

import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402

# The memfds docs/shm_layout.md has the daemon map, as /proc/PID/smaps
# names them.
SPEC_MAPPINGS = ("/memfd:shmtensor-ledger ", "/memfd:shmtensor-release-ring ")


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def spec_rss(pid):
    """Resident bytes of the daemon's mappings of its ledger and of the
    sessions' release rings."""
    total, counted = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:
                counted = len(fields) == 6 and fields[5].startswith(
                    SPEC_MAPPINGS)
            elif counted and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def sample(pid):
    """(VmRSS, the spec's mappings' Rss) of the daemon."""
    return rss(pid), spec_rss(pid)


def bare_process_rss():
    """VmRSS of a bare process: sleep, once it runs and sleeps."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{p.pid}/stat") as f:
                comm, rest = f.read().split(" (", 1)[1].rsplit(") ", 1)
            if comm == "sleep" and rest.split()[0] == "S":
                return rss(p.pid)
            time.sleep(0.01)
        raise RuntimeError("sleep did not start in 10 s")
    finally:
        p.kill()
        p.wait()


def per(after, before, count):
    """Per item: (VmRSS growth, the spec's mappings' growth)."""
    return ((after[0] - before[0]) / count, (after[1] - before[1]) / count)


def line(what, figure, bound, unit="bytes", scale=1, digits=0):
    return (f"  {what:<18}{figure / scale:8.{digits}f} {unit}  bound "
            f"{bound / scale:8.{digits}f} {unit}  {figure / bound:6.2f}x")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
    empty = np.zeros((0,), dtype=np.float32)
    bare = bare_process_rss()
    with Daemon("64MiB") as d:
        pid = d.proc.pid
        client = shmtensor.connect(d.address)
        client.stats()
        base = sample(pid)
        # Named objects, no lease left: the object alone.
        for i in range(n):
            client.put(empty, name=f"o{i}").release()
        client.stats()
        objects = sample(pid)
        # Leases: n views of one object.
        views = [client.get("o0") for _ in range(n)]
        client.stats()
        leases = sample(pid)
        del views
        # Sessions: 200 more clients of this process.
        clients = [shmtensor.connect(d.address) for _ in range(200)]
        for c in clients:
            c.stats()
        sessions = sample(pid)
        obj, lease, sess = (per(objects, base, n), per(leases, objects, n),
                            per(sessions, leases, 200))
        print(f"daemon RSS, {n} items each (VmRSS deltas; pool pages are not in it):")
        print(f"  per named object: {obj[0]:8.0f} bytes")
        print(f"  per lease:        {lease[0]:8.0f} bytes")
        print(f"  per session:      {sess[0]:8.0f} bytes "
              "(connection and stream included)")
        print(f"  baseline RSS:     {base[0] / 2**20:8.1f} MiB")
        print()
        print("beside the bound (per item: the growth of the ledger's and "
              "release rings'\nresident pages in the daemon; baseline: a "
              "bare process's VmRSS), figure/bound:")
        print(line("per named object:", *obj))
        print(line("per lease:", *lease))
        print(line("per session:", *sess))
        print(line("baseline RSS:", base[0], bare, "MiB", 2**20, 1))

if __name__ == "__main__":
    main()
