"""What the daemon's own memory pays per object, per lease and per session,
the figures its default [limits] are sized by (daemon/store/limits.h,
docs/hardening.md). Starts a daemon, reads its resident set (VmRSS) before
and after making N of each, and prints bytes per item. The pool's pages are
shared memory the daemon never maps, so they are not in its VmRSS.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/daemon_memory_bench.py [N]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import numpy as np  # noqa: E402

import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
    empty = np.zeros((0,), dtype=np.float32)
    with Daemon("64MiB") as d:
        client = shmtensor.connect(d.address)
        client.stats()
        base = rss(d.proc.pid)
        # Named objects, no lease left: the object alone.
        for i in range(n):
            client.put(empty, name=f"o{i}").release()
        client.stats()
        objects = rss(d.proc.pid)
        # Leases: n views of one object.
        views = [client.get("o0") for _ in range(n)]
        client.stats()
        leases = rss(d.proc.pid)
        del views
        # Sessions: 200 more clients of this process.
        clients = [shmtensor.connect(d.address) for _ in range(200)]
        for c in clients:
            c.stats()
        sessions = rss(d.proc.pid)
        print(f"daemon RSS, {n} items each (VmRSS deltas; pool pages are not in it):")
        print(f"  per named object: {(objects - base) / n:8.0f} bytes")
        print(f"  per lease:        {(leases - objects) / n:8.0f} bytes")
        print(f"  per session:      {(sessions - leases) / 200:8.0f} bytes "
              "(connection and stream included)")
        print(f"  baseline RSS:     {base / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
