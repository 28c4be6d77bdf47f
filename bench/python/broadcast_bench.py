#!/usr/bin/python3
"""Rank-0 broadcast to 4 local ranks, side by side in one run, at 64 MiB and
512 MiB: torch.distributed.broadcast (Gloo) against
shmtensor.distributed.broadcast.

Each rank ends holding the data and having read every page of it (one
element per 4 KiB). Wall time: from a barrier before the call to a barrier
after every rank read its data. Memory: the proportional set size (PSS,
/proc/self/smaps_rollup) each rank gained, summed over ranks, over the size
of one copy. PSS divides a shared page among the processes mapping it, so
memory shared through the pool counts once; RSS would count it once per
rank.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/broadcast_bench.py
"""

import gc
import multiprocessing as mp
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "testing", "python"))
from shmtensor_testing import Daemon  # noqa: E402

WORLD = 4
SIZES = [64 << 20, 512 << 20]


def pss_bytes():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def touch(t):
    return float(t.reshape(-1).view(torch.uint8)[::4096].sum())


def rank_main(rank, init_file, address, out):
    import torch.distributed as dist
    os.environ["SHMTENSOR_ADDRESS"] = address
    dist.init_process_group("gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    import shmtensor.distributed as sd
    sd.plan()  # Connects and warms the groups up, untimed.
    rows = []
    for nbytes in SIZES:
        src = (torch.arange(nbytes // 4, dtype=torch.int32)
               if rank == 0 else None)
        for method in ("torch", "shmtensor"):
            gc.collect()
            before = pss_bytes()
            dist.barrier()
            t0 = time.perf_counter()
            if method == "torch":
                t = src if rank == 0 else torch.empty(nbytes // 4,
                                                      dtype=torch.int32)
                dist.broadcast(t, 0)
            else:
                t = sd.broadcast(src, src=0, name=f"bench-{nbytes}")
            touch(t)
            dist.barrier()
            dt = time.perf_counter() - t0
            gained = [0] * WORLD
            dist.all_gather_object(gained, pss_bytes() - before)
            if rank == 0:
                rows.append((nbytes, method, dt, sum(gained)))
            del t
            dist.barrier()
        del src
    if rank == 0:
        out.put(rows)
    dist.barrier()


def main():
    with Daemon("1GiB") as d:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        init = tempfile.mktemp(prefix="shmtensor-bcast-")
        procs = [ctx.Process(target=rank_main, args=(r, init, d.address, out))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        rows = out.get(timeout=1200)
        for p in procs:
            p.join()
        if os.path.exists(init):  # torch's FileStore rendezvous file.
            os.unlink(init)
    print(f"broadcast from rank 0 to {WORLD} local ranks (Gloo), every rank "
          f"reads its data")
    print(f"{'size':>7} {'method':>10} {'wall s':>8} {'PSS gained':>12} "
          f"{'x one copy':>11}")
    by = {}
    for nbytes, method, dt, gained in rows:
        by[(nbytes, method)] = (dt, gained)
        print(f"{nbytes >> 20:>5}Mi {method:>10} {dt:8.3f} "
              f"{gained / 2**20:10.0f}Mi {gained / nbytes:10.2f}x")
    for nbytes in SIZES:
        t, s = by[(nbytes, "torch")], by[(nbytes, "shmtensor")]
        print(f"{nbytes >> 20} MiB: shmtensor is {t[0] / s[0]:.1f}x faster, "
              f"memory {s[1] / nbytes:.2f}x one copy (torch "
              f"{t[1] / nbytes:.2f}x)")


if __name__ == "__main__":
    main()
