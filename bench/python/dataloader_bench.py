#!/usr/bin/python3
"""DataLoader throughput, three (four) ways side by side in one run, at batches of
64 KiB, 1 MiB, 16 MiB and 128 MiB, with 2 workers each:

  torch      torch.utils.data.DataLoader as it is: each batch collated into
             a fresh shared-memory segment, faulted in page by page (P8)
  shmtensor  shmtensor.torch.DataLoader: collated into a slot of the
             worker's batch ring (one shared-writable pool object per
             worker; no daemon call per batch; a buffer of its own, handed
             over by exclusive reference, when the rings would take more
             than half the pool); the training side gets writable tensors.
             The default pool, a memfd (4 KiB pages)
  shmtensor-huge  the same with the pool in a tmpfs mounted huge=always
             (2 MiB pages; mounted for the run when root, or the directory
             in $SHMTENSOR_HUGE_DIR; left out, saying why, otherwise)
  ideal      the bound: a ring of pre-faulted multiprocessing.shared_memory
             buffers made once, workers collate into them and pass only an
             index; no allocation, no page-table change, no daemon
  ideal-DL   the same ring with the index handed over through torch's own
             DataLoader (its index and result queues, worker loop): the
             bound for any drop-in DataLoader, whose machinery costs CPU
             that the fill itself could otherwise use

Every batch is 4 samples (torch.stack of 4 tensors: the same collation work
for all three); the training side touches every page of every batch (one
element per 4 KiB). Throughput = batch bytes / wall time after a warm-up.
The shmtensor loader and ideal-DL run PAIRS times each, back to back in
pairs, each first in turn: their columns are medians, and shmtensor/ideal-DL
is the median of the pairs' ratios (this VM's throughput drifts by more than
the goal's 10% between runs a minute apart).
Prints a table with ratios, the page faults a batch of each loader's timed
part (to show the shmtensor runs are in steady state), the CPU time a timed
batch took in all of a loader's processes (on a machine the loaders
saturate, what throughput follows, and steadier than it), and writes a plot
(matplotlib) to build/dataloader_bench.png, or to the path given with --plot
(a benchmark never rewrites a tracked file unless asked: --plot
docs/dataloader_bench.png for the figure in docs/performance.md).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/dataloader_bench.py
       [--quick] [--plot PATH]
"""

import multiprocessing as mp
import os
import sys
import time
from multiprocessing import shared_memory
from statistics import median

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "testing", "python"))
import shmtensor.torch as st  # noqa: E402
from shmtensor_testing import Daemon, HugeTmpfs  # noqa: E402

WORKERS = 2
SAMPLES = 4
# Untimed batches first, so that what is timed is the steady state of a long
# training run: every buffer in flight (2 workers x prefetch 2, plus those
# held) mapped and touched in every process that uses it. WARM batches for
# every loader; the shmtensor loaders then go on until SETTLE batches in a
# row took no page fault in any of their processes (at most MAX_WARM). A
# fresh worker takes a fault on its first touch of each pool page (what that
# costs: docs/performance.md, "DataLoader") and which buffers it gets
# depends on timing, so a fixed count could leave some first touches in the
# timed part of a run. (The ideal bound's workers touch their whole ring
# before they start; torch's loader faults in every new segment by design.)
WARM = 24
SETTLE = 8
MAX_WARM = 200
# Every timed part runs at least this long: a fixed count of the largest
# batches can pass in too short a window to time on a shared machine.
MIN_SECONDS = 1.0
# Runs of the shmtensor loader and of ideal-DL, in pairs (see main).
PAIRS = 5
# Samples a dataset has: more than any run takes (runs stop on time).
ENDLESS = 10 ** 9
PAGE_FLOATS = 1024  # float32 elements per 4 KiB page


class Samples(Dataset):
    """n samples of `nbytes` each; the sample tensor is made once per
    process, so the dataset itself costs next to nothing."""

    def __init__(self, n, nbytes):
        self.n, self.elems = n, nbytes // 4
        self._sample = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._sample is None:
            self._sample = torch.arange(self.elems, dtype=torch.float32)
        return self._sample


def touch(batch):
    """Reads one element per page of the batch."""
    return float(batch.reshape(-1)[::PAGE_FLOATS].sum())


def _stat(pid):
    """/proc/PID/stat's fields after the command name (field 3 first)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _minor_faults(pid):
    """Minor page faults of process `pid` so far (/proc/PID/stat field 10)."""
    return int(_stat(pid)[7])


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pids):
    """CPU time (user + system, every thread) the processes `pids` used so
    far, in seconds (/proc/PID/stat fields 14 and 15)."""
    total = 0
    for pid in pids:
        fields = _stat(pid)
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def run_loader(loader, batches, settle=False, daemon=None):
    """Times `batches` batches, and at least MIN_SECONDS, after the warm-up
    (see WARM; `settle`: until the loader's processes stop faulting).
    Returns GB/s, the page faults a timed batch of the training process and
    the workers together, the warm-up batches taken, and the CPU time a
    timed batch took in µs: training process, workers and `daemon` (a
    Daemon) together, every thread."""
    it = iter(loader)
    # torch's iterator keeps its worker processes in _workers.
    pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
    cpu_pids = pids + ([daemon.proc.pid] if daemon is not None else [])

    def faults():
        return sum(_minor_faults(p) for p in pids)

    for _ in range(WARM):
        touch(next(it))
    warm, quiet = WARM, 0
    while settle and quiet < SETTLE and warm < MAX_WARM:
        before = faults()
        touch(next(it))
        warm += 1
        quiet = quiet + 1 if faults() == before else 0
    before = faults()
    cpu0 = _cpu_seconds(cpu_pids)
    t0 = time.perf_counter()
    n = k = 0
    while k < batches or time.perf_counter() - t0 < MIN_SECONDS:
        batch = next(it)
        touch(batch)
        n += batch.numel() * 4
        k += 1
        del batch
    dt = time.perf_counter() - t0
    cpu = _cpu_seconds(cpu_pids) - cpu0
    timed_faults = faults() - before
    del it
    return n / dt / 1e9, timed_faults / k, warm, cpu / k * 1e6


# -- the ideal bound -----------------------------------------------------------

def ideal_worker(names, shape, tasks, free, done):
    segs = [shared_memory.SharedMemory(name=n) for n in names]
    views = [torch.from_numpy(np.ndarray(shape, np.float32, s.buf))
             for s in segs]
    sample = torch.arange(shape[1], dtype=torch.float32)
    for v in views:  # Pre-faulted in this process too: the ideal.
        v.zero_()
    done.put("ready")
    while True:
        task = tasks.get()
        if task is None:
            break
        slot = free.get()
        torch.stack([sample] * SAMPLES, 0, out=views[slot])
        done.put(slot)
    del views
    for s in segs:
        s.close()


def run_ideal(nbytes, batches):
    shape = (SAMPLES, nbytes // SAMPLES // 4)
    ring = WORKERS * 2 + 2  # In flight (prefetch 2 per worker) + held.
    segs = []
    for _ in range(ring):
        s = shared_memory.SharedMemory(create=True, size=nbytes)
        np.ndarray((nbytes,), np.uint8, s.buf)[:] = 0  # Pre-faulted.
        segs.append(s)
    views = [torch.from_numpy(np.ndarray(shape, np.float32, s.buf))
             for s in segs]
    ctx = mp.get_context("fork")
    tasks, free, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    for i in range(ring):
        free.put(i)
    procs = [ctx.Process(target=ideal_worker,
                         args=([s.name for s in segs], shape, tasks, free,
                               done))
             for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for _ in procs:
        assert done.get() == "ready"
    for _ in range(ring):  # A task per slot, topped up as slots return.
        tasks.put(1)

    def consume():
        slot = done.get()
        touch(views[slot])
        free.put(slot)
        tasks.put(1)

    for _ in range(WARM):
        consume()
    t0 = time.perf_counter()
    k = 0
    while k < batches or time.perf_counter() - t0 < MIN_SECONDS:
        consume()
        k += 1
    dt = time.perf_counter() - t0
    for _ in range(ring):  # The tasks still out.
        free.put(done.get())
    for _ in procs:
        tasks.put(None)
    for p in procs:
        p.join()
    del views
    for s in segs:
        s.close()
        s.unlink()
    return k * nbytes / dt / 1e9


# -- the ideal bound inside torch's DataLoader ---------------------------------

class _RingCollate:
    """collate_fn of the second bound: stacks into a free slot of the ideal's
    pre-faulted ring and returns only the slot's index, through torch's own
    DataLoader machinery (index queues, worker loop, result queue)."""

    def __init__(self, names, shape, free):
        self.names, self.shape, self.free = names, shape, free
        self._views = None  # Opened in each worker on first use.

    def __call__(self, samples):
        if self._views is None:
            self._segs = [shared_memory.SharedMemory(name=n) for n in self.names]
            self._views = [torch.from_numpy(np.ndarray(self.shape, np.float32,
                                                       s.buf))
                           for s in self._segs]
            for v in self._views:  # Pre-faulted in this process too.
                v.zero_()
        slot = self.free.get()
        torch.stack(samples, 0, out=self._views[slot])
        return slot


def run_ideal_loader(ds, nbytes, batches):
    """torch's DataLoader handing over slots of a pre-faulted ring: what a
    drop-in DataLoader could reach if the hand-off itself cost nothing.
    Returns GB/s and the CPU time a timed batch took in µs (training process
    and workers together, every thread)."""
    shape = (SAMPLES, nbytes // SAMPLES // 4)
    ring = WORKERS * 2 + 2
    segs = []
    for _ in range(ring):
        s = shared_memory.SharedMemory(create=True, size=nbytes)
        np.ndarray((nbytes,), np.uint8, s.buf)[:] = 0
        segs.append(s)
    views = [torch.from_numpy(np.ndarray(shape, np.float32, s.buf))
             for s in segs]
    free = mp.get_context("fork").Queue()
    for i in range(ring):
        free.put(i)
    loader = TorchLoader(ds, batch_size=SAMPLES, num_workers=WORKERS,
                         collate_fn=_RingCollate([s.name for s in segs], shape,
                                                 free))
    it = iter(loader)
    for _ in range(WARM):
        slot = next(it)
        touch(views[slot])
        free.put(slot)
    pids = [os.getpid()] + [w.pid for w in it._workers]
    cpu0 = _cpu_seconds(pids)
    t0 = time.perf_counter()
    k = 0
    while k < batches or time.perf_counter() - t0 < MIN_SECONDS:
        slot = next(it)
        touch(views[slot])
        free.put(slot)
        k += 1
    n = k * nbytes
    dt = time.perf_counter() - t0
    cpu = _cpu_seconds(pids) - cpu0
    for _ in range(WORKERS):  # No worker stays blocked waiting for a slot
        free.put(0)           # while torch shuts them down.
    del it, views
    for s in segs:
        s.close()
        s.unlink()
    return n / dt / 1e9, cpu / k * 1e6


# -- main ----------------------------------------------------------------------

class _Nothing:
    """A context that gives None (no second daemon)."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main():
    quick = "--quick" in sys.argv
    plot = os.path.join(HERE, "..", "..", "build", "dataloader_bench.png")
    if "--plot" in sys.argv:
        plot = sys.argv[sys.argv.index("--plot") + 1]
    sizes = [(64 << 10, 400), (1 << 20, 200), (16 << 20, 60), (128 << 20, 20)]
    if quick:
        sizes = [(64 << 10, 100), (1 << 20, 40), (16 << 20, 10), (128 << 20, 4)]
    results, faults, cpus = [], [], []
    with HugeTmpfs("2200m") as huge, Daemon("2GiB") as d, \
            Daemon("2GiB", huge.path) if huge.path else _Nothing() as dh:
        if not huge.path:
            print(f"no huge-page pool in this run: {huge.why}")
        print(f"DataLoader throughput, {WORKERS} workers, {SAMPLES} samples a "
              f"batch, every page touched (GB/s)")
        head = f"{'batch':>8} {'torch':>8} {'shmtensor':>10} "
        if dh:
            head += f"{'shmt-huge':>10} "
        head += (f"{'ideal':>8} {'ideal-DL':>9} {'shmtensor/torch':>16} "
                 f"{'shmtensor/ideal':>16} {'shmtensor/ideal-DL':>19}")
        if dh:
            head += (f" {'huge/torch':>11} {'huge/ideal':>11} "
                     f"{'huge/ideal-DL':>14}")
        print(head)
        for nbytes, batches in sizes:
            ds = Samples(ENDLESS, nbytes // SAMPLES)
            torch_gbps, torch_faults, _, torch_cpu = run_loader(
                TorchLoader(ds, batch_size=SAMPLES, num_workers=WORKERS),
                batches)
            huge_gbps, huge_faults, huge_warm, huge_cpu = run_loader(
                st.DataLoader(ds, batch_size=SAMPLES, num_workers=WORKERS,
                              shmtensor_address=dh.address),
                batches, settle=True, daemon=dh) if dh else (
                    float("nan"), 0, 0, float("nan"))
            ideal_gbps = run_ideal(nbytes, batches)
            # shmtensor against ideal-DL, the goal's ratio: PAIRS runs of
            # each back to back, in turn first, so that what the machine
            # does meanwhile lands on both; the median of each, and of the
            # pairs' ratios.
            def ours():
                return run_loader(
                    st.DataLoader(ds, batch_size=SAMPLES, num_workers=WORKERS,
                                  shmtensor_address=d.address),
                    batches, settle=True, daemon=d)

            def bound():
                return run_ideal_loader(ds, nbytes, batches)

            pairs = []
            for k in range(PAIRS):
                if k % 2 == 0:
                    o = ours()
                    pairs.append((o, bound()))
                else:
                    b = bound()
                    pairs.append((ours(), b))
            ours_gbps = median(o[0] for o, _ in pairs)
            ours_faults = max(o[1] for o, _ in pairs)  # The worst run's.
            ours_warm = max(o[2] for o, _ in pairs)
            ours_cpu = median(o[3] for o, _ in pairs)
            ideal_dl_gbps = median(b[0] for _, b in pairs)
            ideal_dl_cpu = median(b[1] for _, b in pairs)
            ours_vs_dl = median(o[0] / b[0] for o, b in pairs)
            label = (f"{nbytes >> 20}MiB" if nbytes >= 1 << 20
                     else f"{nbytes >> 10}KiB")
            results.append((label, torch_gbps, ours_gbps, huge_gbps,
                            ideal_gbps, ideal_dl_gbps))
            line = f"{label:>8} {torch_gbps:8.2f} {ours_gbps:10.2f} "
            if dh:
                line += f"{huge_gbps:10.2f} "
            line += (f"{ideal_gbps:8.2f} {ideal_dl_gbps:9.2f} "
                     f"{ours_gbps / torch_gbps:15.1f}x "
                     f"{100 * ours_gbps / ideal_gbps:15.0f}% "
                     f"{100 * ours_vs_dl:18.0f}%")
            if dh:
                line += (f" {huge_gbps / torch_gbps:10.1f}x"
                         f" {100 * huge_gbps / ideal_gbps:10.0f}%"
                         f" {100 * huge_gbps / ideal_dl_gbps:13.0f}%")
            print(line, flush=True)
            faults.append((label, torch_faults, ours_faults, ours_warm,
                           huge_faults, huge_warm))
            cpus.append((label, torch_cpu, ours_cpu, huge_cpu, ideal_dl_cpu))
        print("page faults a timed batch, training process and workers "
              "together (warm-up batches):")
        for label, *f in faults:
            print(f"{label:>8} torch {f[0]:8.0f}  shmtensor {f[1]:6.0f} "
                  f"({f[2]})" +
                  (f"  shmt-huge {f[3]:6.0f} ({f[4]})" if dh else ""))
        # On a machine whose cores the loaders saturate, throughput follows
        # CPU a batch, which varies less from run to run than GB/s does.
        print("CPU a timed batch, µs, training process and workers (and the "
              "daemon) together, every thread:")
        print(f"{'batch':>8} {'torch':>8} {'shmtensor':>10} "
              + (f"{'shmt-huge':>10} " if dh else "")
              + f"{'ideal-DL':>9} {'ideal-DL/shmtensor':>19}")
        for label, t_cpu, o_cpu, h_cpu, i_cpu in cpus:
            print(f"{label:>8} {t_cpu:8.0f} {o_cpu:10.0f} "
                  + (f"{h_cpu:10.0f} " if dh else "")
                  + f"{i_cpu:9.0f} {100 * i_cpu / o_cpu:18.0f}%")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (apt-get install python3-matplotlib): "
              "no plot")
        return
    labels = [r[0] for r in results]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [("torch DataLoader", "#888888", 1),
              ("shmtensor DataLoader, memfd pool", "#1f77b4", 2),
              ("shmtensor DataLoader, 2 MiB-page pool", "#ff7f0e", 3),
              ("ideal bound", "#2ca02c", 4),
              ("ideal bound inside torch's DataLoader", "#98df8a", 5)]
    series = [sr for sr in series
              if not all(np.isnan(r[sr[2]]) for r in results)]
    width = 0.8 / len(series)
    for k, (name, color, col) in enumerate(series):
        ax.bar(x + (k - (len(series) - 1) / 2) * width,
               [r[col] for r in results], width, label=name, color=color)
    ax.set_xticks(x, labels)
    ax.set_xlabel("batch size")
    ax.set_ylabel("GB/s (higher is better)")
    ax.set_yscale("log")
    ax.set_title(f"DataLoader hand-off, {WORKERS} workers, every page touched")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(plot)), exist_ok=True)
    fig.savefig(plot, dpi=100)
    print(f"plot: {os.path.relpath(plot)}")


if __name__ == "__main__":
    main()
