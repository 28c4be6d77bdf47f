"""PoolCollate: the producing side's collate_fn, which collates a batch
straight into pool memory and returns a small handle (handles.py)."""

import copy

import torch
import torch.utils.data

from .._local import local_client
from ..errors import Error, LargerThanPoolError, PoolExhaustedError
from . import batch as _batch
from .advice import pool_advice
from .handles import PooledBatch, RingBatch
from .rings import WorkerRing, pool_of

__all__ = ["PoolCollate"]


class PoolCollate:
    """A collate_fn that collates into a shmtensord pool buffer and returns
    a small, picklable handle, which turns into the batch (writable tensors
    over the pool memory) where it is unpickled; in the process that made
    it, `to_tensors` does that (once: the hand-off is exclusive).

    address: the daemon (None: as shmtensor.connect() resolves it).
    collate_fn: None for the installed torch's default_collate, with its
      stacks made straight in the pool; else your function, whose result's
      CPU tensors are then copied in (see the package docstring).
    pool_timeout: seconds to wait for pool memory when the pool is full (the
      training loop may be holding batches) before PoolExhaustedError says
      how large the pool should be.
    in_flight: batches expected in flight at once, for that message.
    ring_slots, consumer: a batch ring of `ring_slots` slots per worker
      process, for the consumer whose ring cache has the token `consumer`
      (rings.RingCache; the DataLoader gives both). 0 / None: no ring, every
      batch a pool object of its own.
    """

    def __init__(self, address=None, collate_fn=None, pool_timeout=30.0,
                 in_flight=None, ring_slots=0, consumer=None):
        self.address = address
        self.collate_fn = collate_fn
        self.pool_timeout = pool_timeout
        self.in_flight = in_flight
        self.ring_slots = ring_slots if consumer is not None else 0
        self.consumer = consumer
        self._ring = WorkerRing(self.ring_slots)

    def with_consumer(self, consumer, ring_slots):
        """The same collate_fn (a subclass's too) for another consumer (a
        new iterator), with a batch ring of `ring_slots` slots."""
        other = copy.copy(self)
        other.consumer = consumer
        other.ring_slots = ring_slots if consumer is not None else 0
        other._ring = WorkerRing(other.ring_slots)
        return other

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_ring"] = WorkerRing(self.ring_slots)  # Per process.
        return state

    def __call__(self, samples):
        plan = _batch.Plan()
        # One stack (the common batch): no placeholder, no pickle.
        payload = plan.stack(samples) if self.collate_fn is None else None
        if payload is None:
            if self.collate_fn is None:
                batch = plan.collate(samples)
            else:
                batch = self.collate_fn(samples)
            payload = _batch.pack(plan, batch)
            if not plan:
                return batch  # Nothing for the pool: as torch passes it.
        client = local_client(self.address)
        ringed = self._into_ring(client, plan, payload)
        if ringed is not None:
            return ringed
        try:
            buf = client.create_bytes(max(plan.size, 1),
                                      timeout=self.pool_timeout)
        except (PoolExhaustedError, LargerThanPoolError) as e:
            raise PoolExhaustedError(self._advice(plan.size, str(e))) from None
        _batch.fill(plan, buf.tensor())
        ref = buf.seal(exclusive=True)
        return PooledBatch(bytes(ref), payload, self.address, self.consumer)

    def _into_ring(self, client, plan, payload):
        """The batch filled into a free slot of this worker's ring, as a
        RingBatch; None when it has no ring, the batch does not fit a slot
        or every slot is in use."""
        got = self._ring.get(client, plan.size, _workers())
        if got is None:
            return None
        ring, ref = got
        if plan.size > ring.slot_bytes:
            return None
        slot = ring.claim()
        if slot < 0:
            return None
        typed = plan.typed_leaf()
        try:
            if typed is not None:  # Filled as the tensor the consumer gets.
                dtype, shape, fill_leaf = typed
                fill_leaf(_batch.typed_tensor(
                    ring.target(slot, plan.size, dtype, shape), dtype))
            else:
                _batch.fill(plan,
                            torch.from_dlpack(ring.target(slot, plan.size)))
        except BaseException:
            ring.unclaim(slot)
            raise
        gen = ring.generation(slot)
        ring.hand(slot)
        return RingBatch(ref, ring.slots, ring.slot_bytes, ring.align, slot,
                         gen, plan.size, payload, self.address, self.consumer)

    def _advice(self, nbytes, error):
        workers = _workers()
        try:
            pool = pool_of(local_client(self.address))
        except Error:
            pool = None
        size = pool["size_bytes"] if pool is not None else 0
        return pool_advice(error, nbytes, workers,
                           self.in_flight or 2 * workers,
                           self._ring.held_bytes(), size)


def _workers():
    """Workers of the DataLoader this process works for (1 outside one)."""
    info = torch.utils.data.get_worker_info()
    return info.num_workers if info is not None else 1
