"""PoolCollate: the producing side's collate_fn, which collates a batch
straight into pool memory and returns a small handle (handles.py)."""

import copy
import os

import torch
import torch.utils.data

from .._local import local_client
from ..errors import Error, LargerThanPoolError, PoolExhaustedError
from . import batch as _batch
from .advice import pool_advice
from .handles import PooledBatch, RingBatch, ring_form
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
        self._repeat = None  # _RepeatStack of the last ring batch, or None.

    def with_consumer(self, consumer, ring_slots):
        """The same collate_fn (a subclass's too) for another consumer (a
        new iterator), with a batch ring of `ring_slots` slots."""
        other = copy.copy(self)
        other.consumer = consumer
        other.ring_slots = ring_slots if consumer is not None else 0
        other._ring = WorkerRing(other.ring_slots)
        other._repeat = None
        return other

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_ring"] = WorkerRing(self.ring_slots)  # Per process.
        state["_repeat"] = None
        return state

    def __call__(self, samples):
        repeat = self._repeat
        if repeat is not None:
            ringed = repeat(samples)
            if ringed is not None:
                return ringed
        plan = _batch.Plan()
        # One stack (the common batch): no placeholder, no pickle.
        payload = plan.stack(samples) if self.collate_fn is None else None
        stacked = payload is not None
        if not stacked:
            if self.collate_fn is None:
                batch = plan.collate(samples)
            else:
                batch = self.collate_fn(samples)
            payload = _batch.pack(plan, batch)
            if not plan:
                return batch  # Nothing for the pool: as torch passes it.
        client = local_client(self.address)
        ringed = self._into_ring(client, plan, payload, samples if stacked
                                 else None)
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

    def _into_ring(self, client, plan, payload, stacked):
        """The batch filled into a free slot of this worker's ring, as a
        RingBatch; None when it has no ring, the batch does not fit a slot
        or every slot is in use. `stacked`: the samples, when the plan is
        Plan.stack's (else None)."""
        got = self._ring.get(client, plan.size, _workers())
        if got is None:
            return None
        ring, ref = got
        if plan.size > ring.slot_bytes:
            return None
        typed = plan.typed_leaf()
        repeat = None
        if typed is not None and stacked is not None:
            # One stack of samples, the payload its leaf's id: the next
            # batch like it skips the plan (_RepeatStack).
            repeat = _RepeatStack(ring, ref, typed[:2], payload, plan.size,
                                  self.address, self.consumer)
        slot = ring.claim()
        if slot < 0:
            return None
        self._repeat = repeat
        if repeat is not None:
            return repeat(stacked, slot)
        try:
            if typed is not None:  # Filled as the tensor the consumer gets.
                dtype, shape, fill_leaf = typed
                fill_leaf(_batch.typed_tensor(
                    ring.target(slot, plan.size, dtype, shape), dtype))
            else:
                _batch.fill(plan,
                            _batch.from_capsule(ring.target(slot, plan.size)))
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


class _RepeatStack:
    """The batch a worker's default collate makes over and over (one stack
    of samples of the same dtype and shape) filled into its ring with
    nothing planned again: the plan's payload and size, and a tensor over
    each slot, made once. Called with samples, it is the ring batch, or None
    when they are not such a stack (the registry changed, another dtype or
    shape, a tensor that Plan.stack would not stack) or no slot is free:
    PoolCollate then takes the whole way. The batches it makes so carry a
    form (handles.ring_form), made at the first of them: a worker whose
    batches change shape every time makes none. Belongs to the process that
    made it (the ring's); not thread-safe, as WorkerRing."""

    def __init__(self, ring, ref, typed, payload, size, address, consumer):
        self._ring, self._pid = ring, os.getpid()
        self._dtype, self._shape = typed
        self._sample_shape = self._shape[1:]
        self._payload, self._size = payload, size
        self._handle = (ref, ring.slots, ring.slot_bytes, ring.align)
        self._tail = (address, consumer)
        self._form = None  # Made with the first batch alike.
        self._targets = [None] * ring.slots

    def __call__(self, samples, slot=None):
        """`slot`: one the caller claimed for these samples (they passed
        Plan.stack's checks); their batch goes without a form."""
        form = None
        if slot is None:
            elem = samples[0]
            # That the stack is this one, then Plan.stack's own checks.
            if (type(elem) is not torch.Tensor or elem.dtype != self._dtype
                    or len(samples) != self._shape[0]
                    or elem.shape != self._sample_shape
                    or not _batch.stackable(elem)
                    or not _batch.torch_registry_only()
                    or os.getpid() != self._pid):
                return None
            form = self._form
            if form is None:
                form = self._form = ring_form(
                    *self._handle, self._size, self._payload, *self._tail)
            slot = self._ring.claim()
            if slot < 0:
                return None
        ring = self._ring
        out = self._targets[slot]
        try:
            if out is None:
                out = self._targets[slot] = _batch.typed_tensor(
                    ring.target(slot, self._size, self._dtype, self._shape),
                    self._dtype)
            torch.stack(samples, 0, out=out)
        except BaseException:
            self._targets[slot] = None  # Whatever torch left of it.
            ring.unclaim(slot)
            raise
        gen = ring.generation(slot)
        ring.hand(slot)
        return RingBatch(*self._handle, slot, gen, self._size, self._payload,
                         *self._tail, form=form)


def _workers():
    """Workers of the DataLoader this process works for (1 outside one)."""
    info = torch.utils.data.get_worker_info()
    return info.num_workers if info is not None else 1
