#!/usr/bin/python3
"""Python binding overhead: the 64 KiB lifecycle (create, seal, get, release)
through the Python package and through the C++ client, side by side in one
run against one daemon and one session. The two alternate lifecycle by
lifecycle, and the overhead is the median of the paired differences, so that
the machine's drift (large on a shared 2-core VM) cancels out. Two measures:
wall-clock time, and the CPU time of the calling thread (time.thread_time),
which is where the binding's own work happens and which the daemon's and the
other core's noise do not reach.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py
Starts its own shmtensord from build/bin.
"""

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "build", "python"))
import shmtensor  # noqa: E402
from shmtensor import _core  # noqa: E402
from _daemon import Daemon  # noqa: E402

NBYTES = 64 << 10


def py_lifecycle(c):
    """One Python lifecycle; returns (wall us, calling-thread CPU us)."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    buf = c.create(NBYTES // 4, "float32")
    np.asarray(buf)[0] = 1.0
    ref = buf.seal()
    view = c.get(ref)
    assert np.asarray(view)[0] == 1.0
    del view, buf, ref  # Releases without waiting, like the C++ scope exit.
    return ((time.perf_counter() - t0) * 1e6,
            (time.thread_time() - c0) * 1e6)


def cpp_lifecycle(c):
    """One C++ lifecycle (timed inside C++); returns (wall us, CPU us)."""
    c0 = time.thread_time()
    (wall,) = _core._cpp_lifecycles(c._c, NBYTES, 1)
    return wall, (time.thread_time() - c0) * 1e6


def main():
    iters = 500 if "--quick" in sys.argv else 4000
    with Daemon("512MiB") as d:
        c = shmtensor.connect(d.address)
        py, cpp = [], []
        for i in range(iters + 100):
            p = py_lifecycle(c)
            q = cpp_lifecycle(c)
            if i >= 100:  # Warm-up done.
                py.append(p)
                cpp.append(q)
    print(f"64 KiB lifecycle (create, seal, get, release), {iters} pairs")
    print(f"{'client':8} {'wall p50 us':>12} {'thread CPU p50 us':>18}")
    for name, v in (("C++", cpp), ("Python", py)):
        print(f"{name:8} {statistics.median(x[0] for x in v):12.1f} "
              f"{statistics.median(x[1] for x in v):18.1f}")
    for k, what in ((0, "wall"), (1, "thread CPU")):
        d = statistics.median(p[k] - q[k] for p, q in zip(py, cpp))
        r = (statistics.median(p[k] for p in py) /
             statistics.median(q[k] for q in cpp))
        print(f"binding overhead, {what}: median paired difference {d:+.1f} us,"
              f" ratio of medians {r:.3f}")


if __name__ == "__main__":
    main()
