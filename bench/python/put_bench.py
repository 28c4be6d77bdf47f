#!/usr/bin/python3
"""Puts the ways users make them, each beside its bound measured in the same
run, at 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB (past what the client's
stock serves), from Python against one daemon (a 1 GiB pool):

  kept      a client connected for the size puts N objects and keeps them
            all (a producer ahead of its consumers, a store being filled),
            from its first put
  kept-2    the same client's second round, once the first was released
  recycle   put and release, over and over (the loop lifecycle_bench and
            python_bench time)

Bounds, measured in the same run, per size:
  kept, kept-2  copy + 5 us: numpy copying the source into memory this
                process has mapped but not written lately, as a kept put
                must (the N destinations are slices of one array whose
                pages were touched at the start, pushed out of the caches
                first), timed per copy, the p50, before and after the puts
                (their mean); past the stock, a round trip (the p50 of
                stats() calls) is added.
  recycle       copy + 5 us with one destination, over and over (what a
                recycled buffer is: open, mapped and warm in the caches),
                before and after the puts.
The 5 us is the issue's allowance for the put's own work (ask the stock,
seal one way).

Per pattern: wall p50 and p90 per put, p50 / bound, and per put the calling
thread's CPU time and its page faults: the faults the thread trapped on
(perf's software page-fault counter for the thread), or, where perf events
are not allowed, getrusage(RUSAGE_THREAD) minor faults, which also count the
page-table fills the client makes on purpose (marked "(rusage)").

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/put_bench.py
[--quick]. Starts its own shmtensord from build/bin.
"""

import gc
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "testing", "python"))
import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402
from faults import FaultCounter  # noqa: E402

POOL = "1GiB"
ALLOWANCE_US = 5.0
# (size, kept puts per round): at most 256 MiB kept, so that two rounds'
# worth never waits for room in the pool.
SIZES = [(4 << 10, 1000), (64 << 10, 1000), (1 << 20, 200), (16 << 20, 16),
         (64 << 20, 4)]
QUICK = [(4 << 10, 300), (64 << 10, 300), (1 << 20, 60), (16 << 20, 8),
         (64 << 20, 3)]
RECYCLE = 200  # Recycled puts per size (after 20 untimed).


class Memory:
    """Memory for the bounds' copies, mapped once (every page touched) and
    kept: allocating and freeing hundreds of MiB between the patterns
    slows what runs right after it on a VM (the host takes the freed pages
    back and faults them in again), which would tax whichever pattern ran
    next."""

    def __init__(self, nbytes):
        self.dst = np.empty(nbytes, np.uint8)
        self.dst[::4096] = 0
        self.evict = np.empty(64 << 20, np.uint8)
        self.evict[::4096] = 0

    def fresh_copy_us(self, src, n):
        """p50 us of copies of `src` into n destinations mapped but not
        written lately (pushed out of the caches first): what a kept put's
        copy must do at best."""
        self.evict.fill(1)
        per = self.dst.nbytes // src.nbytes
        return statistics.median(copy_times(src, [
            self.dst[(i % per) * src.nbytes:(i % per + 1) * src.nbytes]
            for i in range(n)]))

    def warm_copy_us(self, src, n):
        """p50 us of copies of `src` into one destination, over and over."""
        d = self.dst[:src.nbytes]
        return statistics.median(copy_times(src, [d] * n))


def copy_times(src, dst_slices):
    """us per copy of `src` into each destination in turn."""
    out = []
    for d in dst_slices:
        t = time.perf_counter()
        np.copyto(d, src)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def timed_puts(c, src, n, faults, keep):
    """Wall us per put; the thread's CPU us and faults per put; the refs
    when kept."""
    refs, wall = [], []
    f0, cpu0 = faults.read(), time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        r = c.put(src)
        wall.append((time.perf_counter() - t) * 1e6)
        if keep:
            refs.append(r)
        del r
    cpu = (time.thread_time() - cpu0) * 1e6 / n
    return wall, cpu, (faults.read() - f0) / n, refs


def round_trip_us(c, n=50):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        c.stats()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def label(nbytes):
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB"


def main():
    sizes = QUICK if "--quick" in sys.argv else SIZES
    faults = FaultCounter()
    rows = []
    mem = Memory(max(nbytes * n for nbytes, n in sizes))
    with Daemon(POOL) as d:
        for nbytes, n in sizes:
            src = np.random.default_rng(0).integers(0, 255, nbytes,
                                                    dtype=np.uint8)
            c = shmtensor.connect(d.address)  # Fresh: its first put counts.
            rt = round_trip_us(c)
            past_stock = nbytes > (64 << 20) // 4  # The default stock's reach.
            # The bound before and after the puts (the machine drifts).
            fresh = [mem.fresh_copy_us(src, n)]
            gc.collect()
            for pattern in ("kept", "kept-2"):
                wall, cpu, flt, refs = timed_puts(c, src, n, faults, True)
                rows.append([label(nbytes), pattern, wall, None, cpu, flt])
                del refs  # Released: the second round may reuse them.
                gc.collect()
                time.sleep(0.05)  # The releases reach the daemon.
            fresh.append(mem.fresh_copy_us(src, n))
            bound = statistics.mean(fresh) + ALLOWANCE_US + (
                rt if past_stock else 0)
            rows[-1][3] = rows[-2][3] = bound
            timed_puts(c, src, 20, faults, False)
            warm = [mem.warm_copy_us(src, RECYCLE)]
            wall, cpu, flt, _ = timed_puts(c, src, RECYCLE, faults, False)
            warm.append(mem.warm_copy_us(src, RECYCLE))
            rows.append([label(nbytes), "recycle", wall,
                         statistics.mean(warm) + ALLOWANCE_US, cpu, flt])
            print(f"{label(nbytes)}: copy into mapped memory "
                  f"{fresh[0]:.1f} / {fresh[1]:.1f} us (before / after the "
                  f"puts), into one buffer {warm[0]:.1f} / {warm[1]:.1f} us, "
                  f"a round trip {rt:.0f} us"
                  f"{' (in the kept bound: past the stock)' if past_stock else ''}",
                  flush=True)
            del c
            gc.collect()
    print()
    print(f"puts from Python, {POOL} pool; faults: {faults.kind}")
    print(f"{'size':>6} {'pattern':>8} {'p50 us':>9} {'p90 us':>9} "
          f"{'bound us':>9} {'p50/bound':>9} {'CPU us/put':>10} "
          f"{'faults/put':>10}")
    for size, pattern, wall, bound, cpu, flt in rows:
        p50 = statistics.median(wall)
        p90 = statistics.quantiles(wall, n=10)[-1] if len(wall) > 1 else p50
        print(f"{size:>6} {pattern:>8} {p50:9.1f} {p90:9.1f} {bound:9.1f} "
              f"{p50 / bound:8.2f}x {cpu:10.1f} {flt:10.1f}")


if __name__ == "__main__":
    main()
