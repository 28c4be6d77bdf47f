#!/usr/bin/python3
"""GPU hand-off benchmark, every competitor side by side in one run:

 1. Per-object latency and throughput of handing a CUDA tensor from a
    producer process to a consumer process, for 1 MiB to 1 GiB:
    - torch: a new CUDA tensor per object through a torch.multiprocessing
      Queue (torch shares it by CUDA IPC: the consumer opens an IPC handle
      for each new allocation it is sent);
    - shmtensor: an object of the daemon's CUDA pool per object, sealed for
      exclusive hand-off, its ref through the same kind of queue (the pool's
      IPC handle is opened once per process; an object is an offset).
    Both producers fill every object on the GPU, both consumers read every
    byte on the GPU (a sum) and acknowledge; the latency is from the start
    of the producer's fill to the acknowledgement, after a warm-up.
    Bound, measured in the same run with the same queues and a consumer
    process of the same kind: "ideal", one tensor of the size that both
    processes hold before the timed objects (sent once through the queue:
    a CUDA IPC handle opened once; on the CPU, a shared-memory file mapped
    once) and both have touched; per object the producer fills it, waits
    for the device (a GPU's), and sends an int; the consumer sums it and
    acknowledges. The fill, the consumer's read of every byte and the
    queue's round trip, nothing else: no allocation, no handle to open.
    Printed: its p50 and each method's p50 / ideal's (1.00x is the bound).
 2. Device-to-device put: client.put(cuda_tensor) (create, copy, wait, seal)
    against torch's own copy of the same bytes into a preallocated tensor
    (dst.copy_(src) + synchronize), same sizes, same run. Bound: one copy
    of the bytes by the fastest copy measured in the same run: on a GPU,
    torch's copy (a cudaMemcpy device to device); on the CPU, the faster
    of torch's copy and NumPy's (np.copyto, the C library's memcpy). Put
    and copies are timed in turn, medians of each.
    Printed: the bandwidths, put / copy, and put / bound (100% is the
    bound).

Usage: bench/python/gpu_bench.py [--quick] [--device cpu]
  --device cpu runs the same code on host memory and CPU tensors: a dry run
  of the benchmark on a machine without a GPU (its figures mean nothing for
  the GPU goals). Starts its own shmtensord (build/bin, or $SHMTENSOR_DAEMON)
  with a 64 MiB host pool and a 6 GiB pool on the device.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build",
                                "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import torch  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402

MiB = 1 << 20


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _torch_consumer(inq, ackq, device):
    while True:
        t = inq.get()
        if t is None:
            return
        s = float(t.sum())  # Reads every byte on the device.
        del t
        ackq.put(s)


def _ideal_consumer(inq, ackq, device):
    slot = inq.get()  # Held from now on: mapped or opened once.
    ackq.put(float(slot.sum()))
    while inq.get() is not None:
        ackq.put(float(slot.sum()))


def _shm_consumer(address, inq, ackq, device):
    c = shmtensor.connect(address)
    while True:
        ref = inq.get()
        if ref is None:
            return
        view = c.get(ref, writable=False)
        t = view.tensor()
        s = float(t.sum())
        del t, view
        ackq.put(s)


def handoff(kind, nbytes, n, device, address):
    """Per-object latencies (us) of `n` hand-offs after a warm-up."""
    ctx = tmp.get_context("spawn")
    inq, ackq = ctx.Queue(), ctx.Queue()
    if kind == "torch":
        p = ctx.Process(target=_torch_consumer, args=(inq, ackq, device))
    elif kind == "ideal":
        p = ctx.Process(target=_ideal_consumer, args=(inq, ackq, device))
    else:
        p = ctx.Process(target=_shm_consumer,
                        args=(address, inq, ackq, device))
        c = shmtensor.connect(address)
    p.start()
    elems = nbytes // 4
    if kind == "ideal":
        # One tensor for every object, in shared memory (a no-op on a
        # device), touched here, then by the consumer's first sum.
        slot = torch.ones(elems, dtype=torch.float32,
                          device=device).share_memory_()
        _sync(device)
        inq.put(slot)
        ackq.get()
    lat = []
    warm = 5
    for i in range(warm + n):
        t0 = time.perf_counter()
        if kind == "torch":
            t = torch.empty(elems, dtype=torch.float32, device=device)
            t.fill_(1.0)
            inq.put(t)
            ackq.get()
            del t  # Only now may the producer let go (torch's rule).
        elif kind == "ideal":
            slot.fill_(1.0)
            _sync(device)  # Filled before the consumer reads it.
            inq.put(i)
            ackq.get()
        else:
            buf = c.create(elems, torch.float32, device=device)
            t = buf.tensor()
            t.fill_(1.0)
            del t
            inq.put(buf.seal(exclusive=True))
            del buf
            ackq.get()
        if i >= warm:
            lat.append((time.perf_counter() - t0) * 1e6)
    inq.put(None)
    p.join(60)  # The consumer lets the ideal's tensor go before this one.
    return lat


def put_bandwidth(c, nbytes, n, device):
    """(put GB/s, torch copy GB/s, bound GB/s) for `nbytes` from a device
    tensor; the bound is the fastest copy (on the CPU, torch's or
    NumPy's)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    memcpy = None
    if device == "cpu":
        import numpy as np  # The C library's memcpy: only on the CPU.
        src_np, dst_np = src.numpy(), dst.numpy()
        memcpy = lambda: np.copyto(dst_np, src_np)  # noqa: E731
    for _ in range(3):
        dst.copy_(src)
        if memcpy:
            memcpy()
        del_ref = c.put(src)
        del del_ref
    _sync(device)
    puts, copies, memcpys = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        ref = c.put(src)
        puts.append(time.perf_counter() - t0)
        del ref
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        copies.append(time.perf_counter() - t0)
        if memcpy:
            t0 = time.perf_counter()
            memcpy()
            memcpys.append(time.perf_counter() - t0)
    gbs = lambda v: nbytes / statistics.median(v) / 1e9  # noqa: E731
    copy = gbs(copies)
    return gbs(puts), copy, max(copy, gbs(memcpys)) if memcpys else copy


def main():
    quick = "--quick" in sys.argv
    device = "cuda:0"
    if "--device" in sys.argv:
        device = sys.argv[sys.argv.index("--device") + 1]
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_bench: torch sees no CUDA device (use --device cpu for "
                 "a dry run)")
    sizes = [1 * MiB, 16 * MiB, 128 * MiB, 1024 * MiB]
    if device == "cpu":
        sizes = [1 * MiB, 16 * MiB, 64 * MiB]  # A dry run: keep it short.
    with tempfile.TemporaryDirectory() as tmpdir:
        config = os.path.join(tmpdir, "gpu.toml")
        with open(config, "w") as f:
            if device == "cpu":
                f.write('[[pool]]\nname = "host"\nsize = "512MiB"\n')
            else:
                index = int(device.split(":")[1])
                f.write('[[pool]]\nname = "host"\nsize = "64MiB"\n'
                        '[[pool]]\nname = "gpu"\nsize = "6GiB"\n'
                        f'kind = "cuda"\ndevice = {index}\n')
        with Daemon(None, config=config) as d:
            c = shmtensor.connect(d.address)
            if not c.has_pool_on(device):
                sys.exit(f"gpu_bench: the daemon has no pool on {device}")
            print(f"GPU hand-off benchmark on {device} "
                  f"({torch.cuda.get_device_name(device) if device != 'cpu' else 'dry run on the CPU'}),"
                  f" torch {torch.__version__}")
            print("\n== 1. Producer process -> consumer process, one object "
                  "at a time (fill on the device, consumer sums every byte) ==")
            print(f"{'size':>8} {'torch p50 us':>13} {'shmt p50 us':>12} "
                  f"{'latency ratio':>14} {'torch GB/s':>11} {'shmt GB/s':>10}"
                  f" {'ideal p50 us':>13} {'torch/ideal':>12} "
                  f"{'shmt/ideal':>11}")
            for nbytes in sizes:
                n = 10 if quick or nbytes >= 512 * MiB else 50
                lt = handoff("torch", nbytes, n, device, d.address)
                ls = handoff("shmtensor", nbytes, n, device, d.address)
                li = handoff("ideal", nbytes, n, device, d.address)
                pt, ps = statistics.median(lt), statistics.median(ls)
                pi = statistics.median(li)
                print(f"{nbytes // MiB:>5}MiB {pt:13.1f} {ps:12.1f} "
                      f"{pt / ps:13.1f}x {nbytes / pt / 1e3:11.2f} "
                      f"{nbytes / ps / 1e3:10.2f} {pi:13.1f} "
                      f"{pt / pi:11.2f}x {ps / pi:10.2f}x", flush=True)
            print("\n== 2. Device-to-device put vs torch's copy of the same "
                  "bytes, and the bound (the fastest copy) ==")
            print(f"{'size':>8} {'put GB/s':>9} {'copy GB/s':>10} "
                  f"{'put/copy':>9} {'bound GB/s':>11} {'put/bound':>10}")
            for nbytes in sizes:
                n = 5 if quick else 20
                put, copy, bound = put_bandwidth(c, nbytes, n, device)
                print(f"{nbytes // MiB:>5}MiB {put:9.1f} {copy:10.1f} "
                      f"{100 * put / copy:8.0f}% {bound:11.1f} "
                      f"{100 * put / bound:9.0f}%")


if __name__ == "__main__":
    main()
