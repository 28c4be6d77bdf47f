#!/usr/bin/python3
"""A tensor sent through a torch.multiprocessing queue to a long-lived
receiver, side by side in one run, at 64 KiB, 1 MiB and 16 MiB:

  floor      an int: the queue's round trip, what any way of sending pays
             at least
  torch      a tensor of torch's own memory, as a producer makes a new one
             per item: torch moves it into a new shared-memory segment per
             send (a copy), the receiver maps that segment
  by-ref     a tensor over a sealed shmtensor object (a view's): sent by
             reference (the sender offers the object, the receiver takes
             it under its own lease: one round trip each, no byte copied)
  copy       the same tensor sent as a copy of its bytes in the message
             (what shmtensor does for an unsealed buffer's tensor)

Each item is timed from the sender's put to the sender's receipt of the
receiver's acknowledgement, sent once the receiver has the tensor and has
read one byte per 4 KiB page of it; medians of N items after WARM untimed
ones. Ratios are to torch (lower is better) and to the floor.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/torch_queue_bench.py [--quick]
"""

import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as tmp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import shmtensor  # noqa: E402
import shmtensor._torch_sharing as sharing  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402

PAGE = 4096
WARM = 10


def receiver(q, ack):
    """Acknowledges each tensor once it has read every page of it."""
    while True:
        t = q.get()
        if t is None:
            return
        if isinstance(t, int):
            ack.put(t)
            continue
        flat = t.reshape(-1).view(torch.uint8)
        ack.put(int(flat[::PAGE].sum()) if flat.numel() else 0)
        del t, flat


def run(method, nbytes, n, client, q, ack):
    if method == "floor":
        make = lambda: 1  # noqa: E731
    elif method == "torch":
        make = lambda: torch.ones(nbytes // 4)  # noqa: E731
    else:
        view = client.get(client.put(torch.ones(nbytes // 4)))
        sent = view.tensor()
        make = lambda: sent  # noqa: E731
    real_offer = sharing._offer
    if method == "copy":
        sharing._offer = lambda storage, itemsize: None
    try:
        times = []
        for i in range(WARM + n):
            t = make()
            start = time.perf_counter()
            q.put(t)
            ack.get()
            if i >= WARM:
                times.append(time.perf_counter() - start)
            del t
        return statistics.median(times)
    finally:
        sharing._offer = real_offer


def main():
    quick = "--quick" in sys.argv
    n = 30 if quick else 200
    sizes = [64 << 10, 1 << 20, 16 << 20]
    methods = ["floor", "by-ref", "copy", "torch"]
    with Daemon(pool_size="1GiB") as d:
        client = shmtensor.connect(d.address)
        ctx = tmp.get_context("spawn")
        q, ack = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=receiver, args=(q, ack))
        p.start()
        # The receiver's client of the daemon comes with its first take.
        run("by-ref", 1 << 16, 1, client, q, ack)
        print(f"# {n} items per cell after {WARM} untimed; median us per "
              f"item (put to acknowledgement); {os.cpu_count()} CPUs")
        print(f"{'size':>8} " + " ".join(f"{m:>9}" for m in methods) +
              "  by-ref/torch  copy/torch  by-ref/floor")
        for nbytes in sizes:
            r = {m: run(m, nbytes, n, client, q, ack) for m in methods}
            print(f"{nbytes >> 10:>6}Ki " +
                  " ".join(f"{r[m] * 1e6:>9.0f}" for m in methods) +
                  f"  {r['by-ref'] / r['torch']:>12.2f}"
                  f"  {r['copy'] / r['torch']:>10.2f}"
                  f"  {r['by-ref'] / r['floor']:>12.2f}")
        q.put(None)
        p.join(30)


if __name__ == "__main__":
    main()
