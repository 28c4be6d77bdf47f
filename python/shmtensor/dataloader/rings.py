"""Batch rings: one shared-writable pool object per DataLoader worker, cut
into slots the worker collates into and the training process adopts, with no
daemon call per batch (docs/shm_layout.md, "Batch rings"; the protocol is
client/batch_ring.h).

`WorkerRing` is the producing side's, one per worker process; `RingCache`
the consuming side's: the rings one DataLoader iterator joined.
"""

import itertools
import os
import threading
import weakref

from .. import _core
from .._local import local_client
from ..errors import Error

__all__ = ["RingCache", "WorkerRing"]


class WorkerRing:
    """This worker process's batch ring, made on its first batch with
    `slots` slots of that batch's size, in the pool the worker's batches go
    to; or none (`get` returns None) when it would not fit: the slots of every
    worker's ring may take at most half that pool together, and the ring is
    made without waiting for memory (a pool too full now means batch by
    batch through the pool). A ring belongs to the process that made it: in
    a forked child `get` starts afresh.
    Not thread-safe (a worker collates on one thread)."""

    def __init__(self, slots):
        self.slots = slots
        self._ring = None  # (BatchRing, ref bytes), or False: none to be had.
        self._pid = None

    def get(self, client, nbytes, workers):
        """(BatchRing, ref bytes), or None."""
        if self.slots == 0 or nbytes == 0:
            return None
        if self._pid != os.getpid():
            self._ring, self._pid = None, os.getpid()
        if self._ring is None:
            self._ring = False
            try:
                pool = pool_of(client)
                if pool is None:
                    return None
                align = max(pool["huge_page_size"], 4096)
                size = _core.BatchRing.bytes(self.slots, nbytes, align)
                slot_bytes = self.slots * -(-nbytes // align) * align
                if slot_bytes * workers <= pool["size_bytes"] // 2:
                    buf = client.create_bytes(size, timeout=0,
                                              shared_writable=True)
                    ring = _core.BatchRing.create(buf, self.slots, nbytes,
                                                  align)
                    self._ring = (ring, bytes(buf.ref_bytes))
            except Error:
                pass  # Pool too full now: batch by batch.
        return self._ring or None

    def held_bytes(self):
        """Bytes of the ring this process holds (0: none)."""
        if not self._ring or self._pid != os.getpid():
            return 0
        ring = self._ring[0]
        return _core.BatchRing.bytes(ring.slots, ring.slot_bytes, ring.align)


def pool_of(client):
    """stats() of the host pool a create without a pool name goes to (the
    ring's, and every batch's); None if the daemon no longer lists it."""
    name = client._pool_on("cpu")
    return next((p for p in client.stats()["pools"] if p["name"] == name),
                None)


class RingCache:
    """The batch rings one consumer joined, by ref: each is joined (a daemon
    call) once and kept while the cache lives, which is while the DataLoader
    iterator lives (persistent workers: the loader). Every tensor adopted
    from a ring also holds it, so batches outlive the cache. A registered
    cache is found by its token (`find`), which the DataLoader gives its
    workers' collate_fn and they put in every RingBatch.
    Thread-safe (torch's pin-memory thread receives batches too)."""

    _serial = itertools.count(1)
    # This process's registered caches, by token; weak: a cache goes with
    # its iterator.
    _by_token = weakref.WeakValueDictionary()

    def __init__(self, register=True):
        self.pid = os.getpid()
        self.token = f"{self.pid}.{next(self._serial)}"
        self._rings = {}
        self._lock = threading.Lock()
        if register:
            RingCache._by_token[self.token] = self

    @classmethod
    def find(cls, token):
        """The registered cache of `token` in this process, or None (no
        token; another process's cache; one gone with its iterator)."""
        cache = cls._by_token.get(token) if token is not None else None
        return cache if cache is not None and cache.pid == os.getpid() else None

    def ring(self, ring_ref, slots, slot_bytes, align, address, client=None):
        """The joined ring of `ring_ref`: joined now (through `client`, or
        this process's client of `address`) if it was not yet."""
        with self._lock:
            ring = self._rings.get(ring_ref)
            if ring is None:
                from .. import ObjectRef
                c = client if client is not None else local_client(address)
                view = c.get(ObjectRef(ring_ref))  # Shared-writable.
                ring = _core.BatchRing.join(view, slots, slot_bytes, align)
                view.close()  # The ring, and each tensor from it, holds it.
                self._rings[ring_ref] = ring
            return ring
