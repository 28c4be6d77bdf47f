#!/usr/bin/env python3
"""Ray's object store against shmtensor, side by side in one run, on the
same arrays: put and get of NumPy arrays and torch tensors, 4 KiB to
128 MiB, from the same process and from another process, and the store's
memory per object.

  put            ray.put(x) / client.put(x), the ref dropped after (the
                 object freed); p50 per call
  get, same      ray.get(ref) / client.get(ref) of an object this process
                 put, read every page (one byte per 4 KiB); p50
  get, other     the same in another process: a Ray actor against a plain
                 process with a shmtensor client (the refs reach it before
                 the timed gets; its own clock); p50
  memory         what one more live object costs the store: Ray's plasma
                 bytes (memory_summary) or, for objects Ray inlines (small
                 ones live in the owner's heap), the owner's RSS growth;
                 shmtensor's pool bytes (stats) plus the daemon's RSS growth

Both read-only zero-copy on get (Ray: NumPy arrays over plasma; torch
tensors are rebuilt from their pickled form); every get ends with the data
read. Ratios: Ray's time / shmtensor's (above 1: shmtensor faster).

Usage: SHMTENSOR_PYTHONPATH=build/python python bench/peers/ray_bench.py
[--quick] with an interpreter that has ray (pip install ray), numpy and
torch; starts its own shmtensord (build/bin) and a local Ray instance.
"""

import gc
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.environ.get("SHMTENSOR_PYTHONPATH",
                                  os.path.join(ROOT, "build", "python")))
sys.path.insert(0, os.path.join(ROOT, "testing", "python"))
import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402

PAGE = 4096
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20]


def reps_for(nbytes, quick):
    n = 300 if nbytes <= 64 << 10 else 60 if nbytes <= 1 << 20 else \
        15 if nbytes <= 16 << 20 else 5
    return max(3, n // 5) if quick else n


def source(kind, nbytes):
    a = np.arange(nbytes // 4, dtype=np.int32)
    return torch.from_numpy(a) if kind == "torch" else a


def touch(x):
    """Reads one byte per page; the data as a flat uint8 NumPy array."""
    if isinstance(x, torch.Tensor):
        x = x.numpy()
    return int(np.asarray(x).reshape(-1).view(np.uint8)[::PAGE].sum())


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_of(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def p50(xs):
    return statistics.median(xs)


def timed_reads(refs, read):
    """Seconds each `read(ref)` takes (a get that reads every page, then
    lets go)."""
    times = []
    for ref in refs:
        t0 = time.perf_counter()
        read(ref)
        times.append(time.perf_counter() - t0)
    return times


def timed_round(put, read, elsewhere, kind, nbytes, reps):
    """p50s of `reps` puts (each ref dropped after), of `reps` reads here of
    refs held, and of their reads in another process (`elsewhere(refs)`:
    its times)."""
    x = source(kind, nbytes)
    puts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ref = put(x)
        puts.append(time.perf_counter() - t0)
        del ref
    refs = [put(x) for _ in range(reps)]
    gets = timed_reads(refs, read)
    return p50(puts), p50(gets), p50(elsewhere(refs))


# -- shmtensor -----------------------------------------------------------------

def shm_read(c, kind, ref):
    view = c.get(ref)
    touch(view.tensor() if kind == "torch" else np.asarray(view))
    view.close()


def shm_reader(address, conn):
    c = shmtensor.connect(address)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        kind, refs = msg
        conn.send(timed_reads([shmtensor.ObjectRef(r) for r in refs],
                              lambda ref: shm_read(c, kind, ref)))


def shm_round(c, kind, nbytes, reps, reader):
    def elsewhere(refs):
        reader.send((kind, [bytes(r) for r in refs]))
        return reader.recv()

    return timed_round(c.put, lambda ref: shm_read(c, kind, ref), elsewhere,
                       kind, nbytes, reps)


# -- Ray -----------------------------------------------------------------------

def ray_round(ray, actor, kind, nbytes, reps):
    # A list of refs is passed as it is (Ray resolves only top-level refs).
    return timed_round(ray.put, lambda ref: touch(ray.get(ref)),
                       lambda refs: ray.get(actor.gets.remote([refs])),
                       kind, nbytes, reps)


def ray_reader_class(ray):
    @ray.remote(num_cpus=0)
    class Reader:
        def gets(self, wrapped):
            return timed_reads(wrapped[0], lambda ref: touch(ray.get(ref)))
    return Reader


def ray_plasma_bytes(ray):
    from ray._private.internal_api import memory_summary
    text = memory_summary(stats_only=True)
    for line in text.splitlines():
        if "Plasma memory usage" in line:
            mib = float(line.split("Plasma memory usage")[1].split()[0])
            return int(mib * (1 << 20))
    return 0


def memory_per_object(ray, c, daemon_pid, nbytes, n=1000):
    """(Ray's bytes per live object, shmtensor's) for n objects of nbytes."""
    x = np.zeros(nbytes, np.uint8)
    gc.collect()
    time.sleep(1.0)  # What the rounds before freed is gone from plasma.
    plasma0, rss0 = ray_plasma_bytes(ray), rss()
    refs = [ray.put(x) for _ in range(n)]
    time.sleep(1.0)
    ray_bytes = (max(0, ray_plasma_bytes(ray) - plasma0) +
                 max(0, rss() - rss0))
    del refs
    gc.collect()
    stats0 = c.stats()["pools"][0]
    used0 = stats0["used_bytes"] - stats0["stock_bytes"]
    d0 = rss_of(daemon_pid)
    refs = [c.put(x) for _ in range(n)]
    stats = c.stats()["pools"][0]
    used = stats["used_bytes"] - stats["stock_bytes"]
    shm_bytes = (used - used0) + max(0, rss_of(daemon_pid) - d0)
    del refs
    return ray_bytes / n, shm_bytes / n


def fmt_t(s):
    return f"{s * 1e6:9.1f}" if s < 1e-2 else f"{s * 1e3:7.2f}ms"


def main():
    import ray
    quick = "--quick" in sys.argv
    sizes = SIZES[:3] if quick else SIZES
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=3 << 30, configure_logging=False)
    with Daemon("3GiB") as d:
        c = shmtensor.connect(d.address)
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=shm_reader, args=(d.address, theirs))
        proc.start()
        actor = ray_reader_class(ray).remote()
        ray.get(actor.gets.remote([[]]))  # Started.
        rows = []
        for kind in ("numpy", "torch"):
            for nbytes in sizes:
                reps = reps_for(nbytes, quick)
                # Untimed first rounds: both stores warm at this size.
                shm_round(c, kind, nbytes, 3, mine)
                ray_round(ray, actor, kind, nbytes, 3)
                s = shm_round(c, kind, nbytes, reps, mine)
                r = ray_round(ray, actor, kind, nbytes, reps)
                rows.append((kind, nbytes, r, s))
        mem = [(n,) + memory_per_object(ray, c, d.proc.pid, n, count)
               for n, count in ((4 << 10, 1000), (1 << 20, 200))]
        mine.send(None)
        proc.join()
    ray.shutdown()

    print("Ray's object store vs shmtensor, p50 per call in µs (ms where "
          "marked); Ray/shmtensor > 1: shmtensor faster")
    print(f"{'kind':>6} {'size':>7} | {'put Ray':>9} {'shmt':>9} {'x':>6} | "
          f"{'get Ray':>9} {'shmt':>9} {'x':>6} | {'other Ray':>9} "
          f"{'shmt':>9} {'x':>6}")
    for kind, nbytes, r, s in rows:
        size = f"{nbytes >> 10}Ki" if nbytes < 1 << 20 else f"{nbytes >> 20}Mi"
        cells = " | ".join(f"{fmt_t(a)} {fmt_t(b)} {a / b:6.1f}"
                           for a, b in zip(r, s))
        print(f"{kind:>6} {size:>7} | {cells}")
    print("memory per live object (store bytes, and the owner's or the "
          "daemon's RSS growth):")
    for n, rb, sb in mem:
        print(f"  {n >> 10:>5} KiB: Ray {rb / 1024:8.1f} KiB, shmtensor "
              f"{sb / 1024:8.1f} KiB ({rb / sb:.2f}x)")


if __name__ == "__main__":
    main()
