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

Every method starts from the same source array in the producer (so the copy
into the transport is included for all) and ends when the consumer has the
data as an array or tensor and has read every page of it (one byte per 4 KiB).
Producer and consumer are long-lived processes, as in a data loader: each
method first hands off WARM items untimed, then N timed ones; throughput =
bytes of the N items / time from the end of the warm-up to the last item.
The queue between them holds at most 4 items (back-pressure).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/handoff_bench.py [--quick]
"""

import multiprocessing as mp
import os
import sys
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


def consumer(method, q, done, n, address):
    """Receives WARM + n items; reports the time after the warm-up and at
    the end."""
    c = shmtensor.connect(address) if method.startswith("shmtensor") else None
    done.put("ready")
    for i in range(WARM + n):
        if i == WARM:
            done.put(time.perf_counter())
        item = q.get()
        if method == "shm":
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
    done.put(time.perf_counter())


# -- producers -----------------------------------------------------------------

def run(method, src, n, address, client):
    ctx = mp.get_context("fork") if method != "torch" else tmp.get_context("fork")
    q, done = ctx.Queue(maxsize=4), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(method, q, done, n, address))
    proc.start()
    assert done.get(timeout=60) == "ready"
    for _ in range(WARM + n):
        if method == "pickle":
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
    end = done.get(timeout=600)
    proc.join()
    return src.nbytes * n / (end - start) / 1e9


def main():
    quick = "--quick" in sys.argv
    sizes = [(1 << 20, 200), (16 << 20, 40), (128 << 20, 8)]
    if quick:
        sizes = [(1 << 20, 40), (16 << 20, 10), (128 << 20, 3)]
    methods = ["pickle", "torch", "shm", "shmtensor", "shmtensor-ro"]
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
            print(f"{'size':>8} "
                  + " ".join(f"{m + ' GB/s':>18}" for m in methods)
                  + f" {'shmtensor/torch':>16} {'(ro)/torch':>11}"
                  + (f" {'(huge)/torch':>13}" if huge_daemon else ""))
            for nbytes, n in sizes:
                src = np.random.default_rng(0).integers(0, 255, nbytes,
                                                        dtype=np.uint8)
                gbps = {m: run(m, src, n, *targets[m]) for m in methods}
                label = f"{nbytes >> 20}MiB"
                print(f"{label:>8} "
                      + " ".join(f"{gbps[m]:18.2f}" for m in methods)
                      + f" {gbps['shmtensor'] / gbps['torch']:15.1f}x"
                      + f" {gbps['shmtensor-ro'] / gbps['torch']:10.1f}x"
                      + (f" {gbps['shmtensor-huge'] / gbps['torch']:12.1f}x"
                         if huge_daemon else ""), flush=True)
        finally:
            if huge_daemon:
                del targets["shmtensor-huge"]
                huge_daemon.__exit__(None, None, None)

if __name__ == "__main__":
    main()
