#!/usr/bin/python3
"""Rank-0 broadcast to 4 local ranks, side by side in one run, at 64 MiB and
512 MiB: torch.distributed.broadcast (Gloo) and
shmtensor.distributed.broadcast, against the ideal bound measured in the
same run.

Each call ends with every rank holding the data and having read every page
of it (one element per 4 KiB). Wall time: from a barrier before the call to
a barrier after every rank read its data. Each method's first call of a
size is timed apart (it maps the memory into every rank: page-table fills),
then REPS more calls, of which the median is reported.

The ideal bound: rank 0 copies the data into shared memory that every rank
has mapped and touched already (a /dev/shm file, reused), a barrier
publishes it, every rank reads every page, a barrier ends it. Nothing can
hand the data over with less work: one copy, and every rank reads it. The
same with a fresh file each time ("cold") is what the first call of any
shared-memory method pays for mapping the pages: read page by page (a fault
per 16 pages or so) and, beside it, mapped in one call per rank
(madvise(MADV_POPULATE_READ)), which is what shmtensor's broadcast does
(View.populate).

Memory: the proportional set size (PSS, /proc/self/smaps_rollup) each rank
gained in its first call, summed over ranks, over the size of one copy. PSS
divides a shared page among the processes mapping it, so memory shared
through the pool counts once; RSS would count it once per rank.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/broadcast_bench.py
[--quick]. Starts its own shmtensord from build/bin.
"""

import ctypes
import gc
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "testing", "python"))
from shmtensor_testing import Daemon  # noqa: E402

WORLD = 4
SIZES = [64 << 20, 512 << 20]
REPS = 5
MADV_POPULATE_READ = 22  # Linux 5.14
_libc = ctypes.CDLL(None, use_errno=True)


def pss_bytes():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def touch(t):
    if isinstance(t, np.ndarray):
        return int(t.reshape(-1).view(np.uint8)[::4096].sum())
    return float(t.reshape(-1).view(torch.uint8)[::4096].sum())


class Segment:
    """A /dev/shm file every rank maps: the ideal bound's memory."""

    def __init__(self, dist, rank, nbytes):
        path = [None]
        if rank == 0:
            fd, path[0] = tempfile.mkstemp(prefix="shmtensor-bcast-ideal-",
                                           dir="/dev/shm")
            # Its pages allocated and zeroed through the file, mapped by
            # nobody yet: as a pool's are.
            zeros = bytes(4 << 20)
            for off in range(0, nbytes, len(zeros)):
                os.pwrite(fd, zeros[:nbytes - off], off)
            os.close(fd)
        dist.broadcast_object_list(path, 0)
        self.path = path[0]
        with open(self.path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), nbytes)
        self.array = np.frombuffer(self.map, np.uint8)
        dist.barrier()
        if rank == 0:
            os.unlink(self.path)  # Every rank has it mapped.

    def populate(self):
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(len(self.map)),
                      MADV_POPULATE_READ)

    def close(self):
        del self.array
        self.map.close()


def ideal_call(dist, rank, src, seg, populate=False):
    """One ideal hand-over into `seg`; its wall time."""
    dist.barrier()
    t0 = time.perf_counter()
    if rank == 0:
        np.copyto(seg.array, src)
    dist.barrier()  # Published.
    if populate:
        seg.populate()
    touch(seg.array)
    dist.barrier()
    return time.perf_counter() - t0


def method_call(dist, sd, rank, method, nbytes, src):
    """One call of `method`; (wall time, PSS this rank gained)."""
    gc.collect()
    before = pss_bytes()
    dist.barrier()
    t0 = time.perf_counter()
    if method == "torch":
        t = src if rank == 0 else torch.empty(nbytes // 4, dtype=torch.int32)
        dist.broadcast(t, 0)
    else:
        t = sd.broadcast(src, src=0, name=f"bench-{nbytes}")
    touch(t)
    dist.barrier()
    dt = time.perf_counter() - t0
    gained = pss_bytes() - before
    del t
    gc.collect()
    dist.barrier()  # Every rank let go: the next call may reuse the range.
    return dt, gained


def rank_main(rank, init_file, address, sizes, out):
    import torch.distributed as dist
    os.environ["SHMTENSOR_ADDRESS"] = address
    dist.init_process_group("gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    import shmtensor.distributed as sd
    sd.plan()  # Connects and warms the groups up, untimed.
    rows = []
    for nbytes in sizes:
        src = (torch.arange(nbytes // 4, dtype=torch.int32)
               if rank == 0 else None)
        src_np = src.numpy().view(np.uint8) if rank == 0 else None
        # The ideal, cold: fresh memory, read page by page / mapped first.
        for label, populate in (("ideal cold", False),
                                ("ideal cold+populate", True)):
            seg = Segment(dist, rank, nbytes)
            rows.append((nbytes, label, "first",
                         ideal_call(dist, rank, src_np, seg, populate), 0))
            seg.close()
        # The ideal, warm: REPS calls into memory mapped in every rank.
        seg = Segment(dist, rank, nbytes)
        ideal_call(dist, rank, src_np, seg)
        for _ in range(REPS):
            rows.append((nbytes, "ideal", "rep",
                         ideal_call(dist, rank, src_np, seg), 0))
        seg.close()
        for method in ("torch", "shmtensor"):
            dt, gained = method_call(dist, sd, rank, method, nbytes, src)
            all_gained = [0] * WORLD
            dist.all_gather_object(all_gained, gained)
            rows.append((nbytes, method, "first", dt, sum(all_gained)))
            for _ in range(REPS):
                dt, _ = method_call(dist, sd, rank, method, nbytes, src)
                rows.append((nbytes, method, "rep", dt, 0))
        del src, src_np
    if rank == 0:
        out.put(rows)
    dist.barrier()


def main():
    sizes = SIZES[:1] if "--quick" in sys.argv else SIZES
    with Daemon("1GiB") as d:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        init = tempfile.mktemp(prefix="shmtensor-bcast-")
        procs = [ctx.Process(target=rank_main,
                             args=(r, init, d.address, sizes, out))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        rows = out.get(timeout=1800)
        for p in procs:
            p.join()
        if os.path.exists(init):  # torch's FileStore rendezvous file.
            os.unlink(init)
    print(f"broadcast from rank 0 to {WORLD} local ranks (Gloo), every rank "
          f"reads its data; median of {REPS} calls after the first")
    print(f"{'size':>7} {'method':>20} {'first s':>9} {'median s':>9} "
          f"{'ideal/median':>12} {'PSS gained':>11}")
    for nbytes in sizes:
        first = {m: dt for n, m, k, dt, _ in rows if n == nbytes and k == "first"}
        gained = {m: g for n, m, k, _, g in rows if n == nbytes and k == "first"}
        med = {m: statistics.median(dt for n, mm, k, dt, _ in rows
                                    if n == nbytes and mm == m and k == "rep")
               for m in ("ideal", "torch", "shmtensor")}
        for m in ("ideal cold", "ideal cold+populate"):
            print(f"{nbytes >> 20:>5}Mi {m:>20} {first[m]:9.4f} {'':>9} "
                  f"{'':>12} {'':>11}")
        for m in ("ideal", "torch", "shmtensor"):
            f = f"{first[m]:9.4f}" if m in first else f"{'':>9}"
            g = (f"{gained[m] / nbytes:10.2f}x" if m in gained
                 else f"{'':>11}")
            print(f"{nbytes >> 20:>5}Mi {m:>20} {f} {med[m]:9.4f} "
                  f"{med['ideal'] / med[m]:11.0%} {g}")
        print(f"{nbytes >> 20} MiB: shmtensor at "
              f"{med['ideal'] / med['shmtensor']:.0%} of the ideal, "
              f"{med['torch'] / med['shmtensor']:.1f}x Gloo; first call "
              f"{first['shmtensor'] * 1e3:.1f} ms (the ideal's cold call: "
              f"{first['ideal cold'] * 1e3:.1f} ms reading page by page, "
              f"{first['ideal cold+populate'] * 1e3:.1f} ms mapped first)")


if __name__ == "__main__":
    main()
