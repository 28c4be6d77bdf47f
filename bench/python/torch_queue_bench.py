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
  shared     torch's own best case: one tensor moved into shared memory
             once (share_memory_()) and sent every time: torch sends its
             segment's descriptor, and the receiver maps it once (torch
             caches the mapping per segment), with no lifetime beyond
             torch's reference counts

Each item is timed from the sender's put to the sender's receipt of the
receiver's acknowledgement, sent once the receiver has the tensor and has
read one byte per 4 KiB page of it; medians of N items after WARM untimed
ones. Ratios are to torch (lower is better) and to the floor.

Bounds, measured in the same run, per size, with the same queue and
receiver: a /dev/shm file of one slot of the size (one item is in flight
at a time), mapped by both processes and every page of it touched by both
before the timed items (the receiver opens it by name once; it is unlinked
then); the receiver reads one byte per page of the slot and acknowledges,
as for a tensor.

  ideal      the bound of a method that copies (torch, copy): the sender
             copies the new tensor's bytes into the slot and sends the
             slot's number, an int: one copy into memory both processes
             have mapped, the queue's round trip, the receiver's reads
  ideal-ref  the bound of sending by reference (by-ref): the bytes are in
             the slot already, the sender sends the slot's number: the
             queue's round trip and the receiver's reads

Both are timed before and after the methods (their mean: the machine
drifts). A second table gives each method's ratio to its bound
(method / bound, lower is better; 1.00x is the bound).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/torch_queue_bench.py [--quick]
(any interpreter with torch: PyPI's in a virtualenv too).
"""

import mmap
import os
import statistics
import sys
import tempfile
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


def touch(t):
    """Reads one byte per page of `t`."""
    flat = t.reshape(-1).view(torch.uint8)
    return int(flat[::PAGE].sum()) if flat.numel() else 0


def map_slot(path, nbytes):
    """A uint8 tensor over a mapping of the file at `path`."""
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return torch.frombuffer(m, dtype=torch.uint8)


def receiver(q, ack):
    """Acknowledges each tensor once it has read every page of it. A tuple
    (path, nbytes) maps the ideal's slot (every page read), () lets it go;
    while a slot is mapped, an int is its number: every page of the slot is
    read before the acknowledgement. Without a slot an int is acknowledged
    as it is (the floor)."""
    slot = None
    while True:
        t = q.get()
        if t is None:
            return
        if isinstance(t, tuple):
            slot = map_slot(*t) if t else None
            ack.put(touch(slot) if t else 0)
            continue
        if isinstance(t, int):
            ack.put(touch(slot) if slot is not None else t)
            continue
        ack.put(touch(t))
        del t


class Slot:
    """The ideals' memory: a /dev/shm file of one slot of `nbytes`, mapped
    here and in the receiver, every page written here and read there."""

    def __init__(self, nbytes, q, ack):
        fd, path = tempfile.mkstemp(prefix="shmtensor-torch-queue-ideal-",
                                    dir="/dev/shm")
        try:
            os.ftruncate(fd, nbytes)
            self.tensor = torch.frombuffer(mmap.mmap(fd, nbytes),
                                           dtype=torch.uint8)
            self.tensor.fill_(1)
            q.put((path, nbytes))  # The receiver maps it and reads it.
            ack.get()
        finally:
            os.close(fd)
            os.unlink(path)
        self.q, self.ack = q, ack

    def close(self):
        self.q.put(())
        self.ack.get()


def run(method, nbytes, n, client, q, ack, slot=None):
    if method == "floor":
        make = lambda: 1  # noqa: E731
    elif method == "ideal-ref":
        make = lambda: 0  # noqa: E731
    elif method in ("torch", "ideal"):
        make = lambda: torch.ones(nbytes // 4)  # noqa: E731
    elif method == "shared":
        shared = torch.ones(nbytes // 4).share_memory_()
        make = lambda: shared  # noqa: E731
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
            if method == "ideal":
                slot.tensor.copy_(t.view(torch.uint8))
                q.put(0)
            else:
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
    methods = ["floor", "by-ref", "copy", "torch", "shared"]
    ideals = ["ideal-ref", "ideal"]
    bound_of = {"by-ref": "ideal-ref", "copy": "ideal", "torch": "ideal",
                "shared": "ideal-ref"}
    with Daemon(pool_size="1GiB") as d:
        client = shmtensor.connect(d.address)
        ctx = tmp.get_context("spawn")
        q, ack = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=receiver, args=(q, ack))
        p.start()
        # The receiver's client of the daemon comes with its first take.
        run("by-ref", 1 << 16, 1, client, q, ack)
        print(f"# torch {torch.__version__}; {n} items per cell after {WARM} "
              f"untimed; median us per item (put to acknowledgement); "
              f"{os.cpu_count()} CPUs")
        print(f"{'size':>8} " + " ".join(f"{m:>9}" for m in methods + ideals) +
              "  by-ref/torch  copy/torch  by-ref/floor  by-ref/shared")
        rows = []
        for nbytes in sizes:
            # The floor first: while the slot is mapped, an int names it.
            r = {"floor": run("floor", nbytes, n, client, q, ack)}
            slot = Slot(nbytes, q, ack)
            before = {m: run(m, nbytes, n, client, q, ack, slot)
                      for m in ideals}
            r.update({m: run(m, nbytes, n, client, q, ack)
                      for m in methods[1:]})
            r.update({m: statistics.mean(
                (before[m], run(m, nbytes, n, client, q, ack, slot)))
                for m in ideals})
            slot.close()
            rows.append((nbytes, r))
            print(f"{nbytes >> 10:>6}Ki " +
                  " ".join(f"{r[m] * 1e6:>9.0f}" for m in methods + ideals) +
                  f"  {r['by-ref'] / r['torch']:>12.2f}"
                  f"  {r['copy'] / r['torch']:>10.2f}"
                  f"  {r['by-ref'] / r['floor']:>12.2f}"
                  f"  {r['by-ref'] / r['shared']:>13.2f}", flush=True)
        print()
        print("# each method / its bound (by-ref: ideal-ref; copy, torch: "
              "ideal)")
        print(f"{'size':>8} " +
              " ".join(f"{m + '/' + bound_of[m]:>16}" for m in bound_of))
        for nbytes, r in rows:
            print(f"{nbytes >> 10:>6}Ki " + " ".join(
                f"{r[m] / r[bound_of[m]]:>15.2f}x" for m in bound_of))
        q.put(None)
        p.join(30)


if __name__ == "__main__":
    main()
