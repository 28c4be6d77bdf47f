#!/usr/bin/env python3
"""iceoryx2 (zero-copy publish-subscribe, its Python bindings from PyPI)
against shmtensor, side by side in one run: a producer hands a 4 KiB to
16 MiB payload to a consumer process, which reads every page of it (one
byte per 4 KiB) and acknowledges; one item in flight.

  iceoryx2        the producer loans a sample, copies the payload in, sends
                  it; the consumer spins on receive() (iceoryx2's lowest
                  latency; its event service would block instead), reads
                  the sample, drops it, and acknowledges on a second
                  service, on which the producer spins
  shmtensor       put (the ref valid at once, its seal one way); the ref
                  through a pipe; the consumer's get (the daemon's round
                  trip), read, release; the acknowledgement by pipe
  shmtensor-slots shmtensor's best path for a stream between two known
                  processes, what the DataLoader's batch rings do: one
                  shared-writable pool object of 4 slots, got once by both;
                  the producer copies into the next slot and sends its
                  number through the pipe; no call to the daemon per item
  slots-spin      the same slots, the slot number and the acknowledgement
                  in a word of the object each side spins on (as iceoryx2
                  here): what the data plane alone costs

Latency: from the producer's first step (loan, put or copy) to the consumer
having read the last page, on CLOCK_MONOTONIC (both processes); p50 and
p99 over the timed items. Throughput: payload bytes / the timed items'
wall time. Each method hands WARM items untimed first.

Usage: SHMTENSOR_PYTHONPATH=build/python python bench/peers/iceoryx2_bench.py
[--quick] with an interpreter that has iceoryx2 (pip install iceoryx2) and
numpy; starts its own shmtensord (build/bin).
"""

import ctypes
import multiprocessing as mp
import os
import statistics
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.environ.get("SHMTENSOR_PYTHONPATH",
                                  os.path.join(ROOT, "build", "python")))
sys.path.insert(0, os.path.join(ROOT, "testing", "python"))
import shmtensor  # noqa: E402
from shmtensor_testing import Daemon  # noqa: E402

PAGE = 4096
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
WARM = 20
SLOTS = 4
HEADER = 64  # The spinning slots' words: [0] items sent, [8] items read.


def items_for(nbytes, quick):
    n = 2000 if nbytes <= 64 << 10 else 400 if nbytes <= 1 << 20 else 60
    return max(20, n // 10) if quick else n


def touch(a):
    return int(a[::PAGE].sum())


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# -- iceoryx2 ------------------------------------------------------------------

def iox_services(tag, nbytes):
    import iceoryx2 as iox2
    iox2.set_log_level(iox2.LogLevel.Error)
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    data = (node.service_builder(iox2.ServiceName.new(f"{tag}-data"))
            .publish_subscribe(iox2.Slice[ctypes.c_uint8])
            .subscriber_max_buffer_size(2).open_or_create())
    ack = (node.service_builder(iox2.ServiceName.new(f"{tag}-ack"))
           .publish_subscribe(ctypes.c_uint64)
           .subscriber_max_buffer_size(2).open_or_create())
    return iox2, node, data, ack


def iox_consumer(tag, nbytes, n, out):
    iox2, node, data, ack = iox_services(tag, nbytes)
    sub = data.subscriber_builder().create()
    pub = ack.publisher_builder().create()
    out.put("ready")
    lat = []
    for i in range(n):
        while (sample := sub.receive()) is None:
            pass
        view = (ctypes.c_uint8 * nbytes).from_address(sample.payload_ptr)
        a = np.frombuffer(view, np.uint8)
        touch(a)
        t = now_ns()
        (t0,) = struct.unpack_from("<Q", view, 0)
        lat.append(t - t0)
        del a, view
        sample.delete()
        reply = pub.loan_uninit()
        reply = reply.write_payload(ctypes.c_uint64(i))
        reply.send()
    out.put(lat)


def iox_producer(tag, src, n, out, ctx):
    iox2, node, data, ack = iox_services(tag, src.nbytes)
    pub = (data.publisher_builder().initial_max_slice_len(src.nbytes)
           .allocation_strategy(iox2.AllocationStrategy.Static).create())
    sub = ack.subscriber_builder().create()
    proc = ctx.Process(target=iox_consumer, args=(tag, src.nbytes, n, out))
    proc.start()
    out.get()
    time.sleep(0.2)  # The consumer's subscriber is connected.
    start = None
    for i in range(n):
        if i == WARM:
            start = time.perf_counter()
        t0 = now_ns()
        sample = pub.loan_slice_uninit(src.nbytes)
        ctypes.memmove(sample.payload_ptr, src.ctypes.data, src.nbytes)
        ctypes.memmove(sample.payload_ptr, ctypes.byref(ctypes.c_uint64(t0)), 8)
        sample.assume_init().send()
        while (a := sub.receive()) is None:
            pass
        a.delete()
    wall = time.perf_counter() - start
    lat = out.get()
    proc.join()
    return lat[WARM:], wall


# -- shmtensor -----------------------------------------------------------------

def shm_consumer(address, method, nbytes, n, conn, out):
    c = shmtensor.connect(address)
    lat = []
    if method != "shmtensor":
        ref = shmtensor.ObjectRef(conn.recv_bytes())
        ring = c.get(ref)  # Shared-writable: writable, got once.
        mem = np.asarray(ring).reshape(-1)
        words = mem[:HEADER].view(np.uint64)
        conn.send_bytes(b"ok")
    for i in range(n):
        if method == "shmtensor":
            msg = conn.recv_bytes()
            t0, raw = struct.unpack_from("<Q", msg)[0], msg[8:]
            view = c.get(shmtensor.ObjectRef(raw))
            touch(np.asarray(view).reshape(-1).view(np.uint8))
            lat.append(now_ns() - t0)
            view.close()
            conn.send_bytes(b"a")
            continue
        if method == "shmtensor-slots":
            slot = struct.unpack("<Q", conn.recv_bytes())[0]
        else:
            while words[0] <= i:
                pass
            slot = i % SLOTS
        off = HEADER + slot * nbytes
        a = mem[off:off + nbytes]
        touch(a)
        t = now_ns()
        lat.append(t - int(a[:8].view(np.uint64)[0]))
        if method == "shmtensor-slots":
            conn.send_bytes(b"a")
        else:
            words[1] = i + 1
    out.put(lat)


def shm_producer(address, method, src, n, out, ctx):
    c = shmtensor.connect(address)
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=shm_consumer,
                       args=(address, method, src.nbytes, n, theirs, out))
    proc.start()
    if method != "shmtensor":
        buf = c.create((HEADER + SLOTS * src.nbytes,), np.uint8,
                       shared_writable=True)
        mem = np.asarray(buf).reshape(-1)
        mem[:] = 0  # Mapped and touched in this process before the items.
        words = mem[:HEADER].view(np.uint64)
        mine.send_bytes(bytes(buf.ref_bytes))
        mine.recv_bytes()
    start = None
    for i in range(n):
        if i == WARM:
            start = time.perf_counter()
        t0 = now_ns()
        if method == "shmtensor":
            ref = c.put(src)
            mine.send_bytes(struct.pack("<Q", t0) + bytes(ref))
            mine.recv_bytes()
            del ref
            continue
        slot = i % SLOTS
        off = HEADER + slot * src.nbytes
        dst = mem[off:off + src.nbytes]
        np.copyto(dst, src)
        dst[:8].view(np.uint64)[0] = t0
        if method == "shmtensor-slots":
            mine.send_bytes(struct.pack("<Q", slot))
            mine.recv_bytes()
        else:
            words[0] = i + 1
            while words[1] <= i:
                pass
    wall = time.perf_counter() - start
    lat = out.get()
    proc.join()
    return lat[WARM:], wall


def main():
    quick = "--quick" in sys.argv
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    methods = ["iceoryx2", "shmtensor", "shmtensor-slots", "slots-spin"]
    rows = []
    with Daemon("1GiB") as d:
        for nbytes in SIZES:
            n = items_for(nbytes, quick) + WARM
            src = np.arange(nbytes, dtype=np.uint8)
            for m in methods:
                if m == "iceoryx2":
                    lat, wall = iox_producer(f"shmtensor-bench-{os.getpid()}"
                                             f"-{nbytes}", src, n, out, ctx)
                else:
                    lat, wall = shm_producer(d.address, m, src, n, out, ctx)
                lat.sort()
                rows.append((nbytes, m, lat[len(lat) // 2] / 1e3,
                             lat[int(len(lat) * 0.99)] / 1e3,
                             nbytes * (n - WARM) / wall / 1e9))
    print("producer -> consumer process, one item in flight, the consumer "
          "reads every page; latency in µs")
    print(f"{'size':>7} {'method':>16} {'p50':>9} {'p99':>9} {'GB/s':>7} "
          f"{'p50 / iceoryx2':>15}")
    for nbytes in SIZES:
        base = next(r for r in rows if r[0] == nbytes and r[1] == "iceoryx2")
        for r in (r for r in rows if r[0] == nbytes):
            size = (f"{nbytes >> 10}Ki" if nbytes < 1 << 20
                    else f"{nbytes >> 20}Mi")
            print(f"{size:>7} {r[1]:>16} {r[2]:9.1f} {r[3]:9.1f} "
                  f"{r[4]:7.2f} {r[2] / base[2]:14.2f}x")


if __name__ == "__main__":
    main()
