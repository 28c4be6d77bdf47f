#!/usr/bin/python3
"""Hand-off of arrays from one process to another, four ways side by side in
one run, at 1 MiB, 16 MiB and 128 MiB:

  pickle      a NumPy array through multiprocessing.Queue (pickled, copied
              through a pipe)
  torch       a torch tensor through torch.multiprocessing.Queue (moved into
              a new shared-memory segment per tensor, faulted in page by page)
  shm         a new multiprocessing.shared_memory segment per array
  shmtensor   put(exclusive=True) into a recycled, pre-faulted pool (copied
              in with pwrite); the ref goes through a multiprocessing.Queue;
              the consumer takes it writable (get), reads it as a tensor,
              and drops it (back to the pool)
  shm-ro      the same, but the consumer takes it read-only
              (get(ref, writable=False)): no writable range is opened
  shmtensor-huge  shmtensor (writable take) with the pool in a tmpfs
              mounted huge=always (2 MiB pages; mounted for the run when
              root, or $SHMTENSOR_HUGE_DIR; left out, saying why, otherwise)
  ideal       the bound: a /dev/shm file of SLOTS slots, mapped by both
              processes and touched before the timed items; the producer
              copies into the next slot and sends its number: one copy, and
              the consumer reads every page, nothing else

The consumer's page faults per timed item are printed beside (the faults
its thread traps on: perf's software counter, else getrusage's minor
faults), and the writable take's throughput against the read-only one's
(issue 62: at least 80% at 16 and 128 MiB).

Every method starts from the same source array in the producer (so the copy
into the transport is included for all) and ends when the consumer has the
data as an array or tensor and has read every page of it (one byte per 4 KiB).
Producer and consumer are long-lived processes, as in a data loader: each
method first hands off WARM items untimed, then N timed ones; throughput =
bytes of the N items / time from the end of the warm-up to the last item.
The queue between them holds at most 4 items (back-pressure).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/handoff_bench.py [--quick]
"""

import mmap
import multiprocessing as mp
import os
import sys
import tempfile
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch
import torch.multiprocessing as tmp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import shmtensor  # noqa: E402
from shmtensor_testing import Daemon, HugeTmpfs  # noqa: E402
from faults import FaultCounter  # noqa: E402

PAGE = 4096


def touch(a):
    """Reads one element per page: every page must be there."""
    flat = a.reshape(-1).view(np.uint8) if isinstance(a, np.ndarray) else \
        a.reshape(-1).view(torch.uint8)
    return int(flat[::PAGE].sum())


# -- consumers (one process each) ---------------------------------------------

# Untimed items first: enough for every pool buffer in rotation (4 in the
# queue, one being put, one held by the consumer) to have been used once in
# both processes, so what is timed is the steady state of long-lived ones
# (the first use of a buffer in a process maps its pages: a minor fault per
# page, and for a writable take one page-table change of the whole range).
WARM = 8
SLOTS = 6  # The ideal's: 4 in the queue, one being put, one being read.


class Slots:
    """The ideal's memory: a /dev/shm file of SLOTS slots of `nbytes`, mapped
    before the fork (so both processes map it), unlinked at once."""

    def __init__(self, nbytes):
        fd, path = tempfile.mkstemp(prefix="shmtensor-handoff-ideal-",
                                    dir="/dev/shm")
        os.unlink(path)
        os.ftruncate(fd, SLOTS * nbytes)
        self.map = mmap.mmap(fd, SLOTS * nbytes)
        os.close(fd)
        self.nbytes = nbytes

    def slot(self, i):
        return np.ndarray((self.nbytes,), np.uint8, self.map,
                          (i % SLOTS) * self.nbytes)


def consumer(method, q, done, n, address, slots):
    """Receives WARM + n items; reports the time after the warm-up and at
    the end, and its thread's page faults per timed item."""
    c = shmtensor.connect(address) if method.startswith("shmtensor") else None
    faults = FaultCounter()
    done.put("ready")
    for i in range(WARM + n):
        if i == WARM:
            done.put(time.perf_counter())
            f0 = faults.read()
        item = q.get()
        if method == "ideal":
            touch(slots.slot(item))
        elif method == "shm":
            name, nbytes = item
            seg = shared_memory.SharedMemory(name=name)
            touch(np.ndarray((nbytes,), np.uint8, seg.buf))
            seg.close()
            seg.unlink()
        elif method.startswith("shmtensor"):
            view = c.get(item, writable=(method != "shmtensor-ro"))
            touch(view.tensor())
            del view  # Back to the pool.
        else:
            touch(item)
        del item
    done.put((time.perf_counter(), (faults.read() - f0) / n, faults.kind))


# -- producers -----------------------------------------------------------------

def run(method, src, n, address, client):
    ctx = mp.get_context("fork") if method != "torch" else tmp.get_context("fork")
    q, done = ctx.Queue(maxsize=4), ctx.Queue()
    slots = Slots(src.nbytes) if method == "ideal" else None
    if slots is not None:
        for i in range(SLOTS):  # Mapped in both processes: touched in both.
            slots.slot(i)[:] = 0
    proc = ctx.Process(target=consumer,
                       args=(method, q, done, n, address, slots))
    proc.start()
    assert done.get(timeout=60) == "ready"
    for i in range(WARM + n):
        if method == "ideal":
            np.copyto(slots.slot(i), src)
            q.put(i % SLOTS)
        elif method == "pickle":
            q.put(src)
        elif method == "torch":
            t = torch.empty(src.shape, dtype=torch.uint8)
            t.numpy()[:] = src
            q.put(t)
        elif method == "shm":
            seg = shared_memory.SharedMemory(create=True, size=src.nbytes)
            # The consumer unlinks it: hand the tracking over too, or this
            # process's resource tracker warns about every segment at exit.
            resource_tracker.unregister(seg._name, "shared_memory")
            np.ndarray(src.shape, np.uint8, seg.buf)[:] = src
            q.put((seg.name, src.nbytes))
            seg.close()
        else:
            q.put(client.put(src, exclusive=True))
    start = done.get(timeout=600)
    end, faults, kind = done.get(timeout=600)
    proc.join()
    return src.nbytes * n / (end - start) / 1e9, faults, kind


def main():
    quick = "--quick" in sys.argv
    sizes = [(1 << 20, 200), (16 << 20, 40), (128 << 20, 8)]
    if quick:
        sizes = [(1 << 20, 40), (16 << 20, 10), (128 << 20, 3)]
    methods = ["ideal", "pickle", "torch", "shm", "shmtensor", "shmtensor-ro"]
    with HugeTmpfs("2200m") as huge, Daemon("2GiB") as d:
        client = shmtensor.connect(d.address)  # The producer's, for all runs.
        targets = {m: (d.address, client) for m in methods}
        huge_daemon = None
        if huge.path:
            huge_daemon = Daemon("2GiB", huge.path)
            targets["shmtensor-huge"] = (huge_daemon.address,
                                         shmtensor.connect(huge_daemon.address))
            methods.append("shmtensor-huge")
        else:
            print(f"no huge-page pool in this run: {huge.why}")
        try:
            rows = []
            for nbytes, n in sizes:
                src = np.random.default_rng(0).integers(0, 255, nbytes,
                                                        dtype=np.uint8)
                rows.append((nbytes, {m: run(m, src, n, *targets[m])
                                      for m in methods}))
            kind = rows[0][1]["ideal"][2]
            print(f"GB/s, and the consumer's page faults per item ({kind})")
            print(f"{'size':>8} " + " ".join(f"{m:>20}" for m in methods))
            for nbytes, r in rows:
                print(f"{nbytes >> 20:>5}MiB " + " ".join(
                    f"{r[m][0]:11.2f} ({r[m][1]:6.0f})" for m in methods))
            print()
            print(f"{'size':>8} {'shmtensor/ideal':>16} {'(ro)/ideal':>11} "
                  f"{'writable/ro':>12} {'shmtensor/torch':>16} "
                  f"{'(ro)/torch':>11}")
            for nbytes, r in rows:
                g = {m: r[m][0] for m in methods}
                print(f"{nbytes >> 20:>5}MiB {g['shmtensor'] / g['ideal']:15.0%} "
                      f"{g['shmtensor-ro'] / g['ideal']:10.0%} "
                      f"{g['shmtensor'] / g['shmtensor-ro']:11.0%} "
                      f"{g['shmtensor'] / g['torch']:15.1f}x "
                      f"{g['shmtensor-ro'] / g['torch']:10.1f}x", flush=True)
        finally:
            if huge_daemon:
                del targets["shmtensor-huge"]
                huge_daemon.__exit__(None, None, None)

if __name__ == "__main__":
    main()
