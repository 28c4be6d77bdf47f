"""What a producer sends for a batch, and how it turns into the batch.

`PooledBatch` names a pool object of its own (sealed for exclusive
hand-off); `RingBatch` a slot of the worker's batch ring. Either is small
and picklable: where it is unpickled it becomes the batch itself (ordinary
writable CPU tensors over pool memory, in the structure the collate
function produced). In the process that made it, `to_tensors` does that.
Each handle turns into tensors once: the hand-off is exclusive.
"""

import pickle

import torch

from .. import _torch_sharing
from .._local import local_client
from . import batch as _batch
from . import rings as _rings

__all__ = ["PooledBatch", "RingBatch", "ring_form", "to_tensors"]


class PooledBatch:
    """A batch in a pool object of its own: the object's ref (sealed for
    exclusive hand-off) and the batch's structure (batch.py's payload).
    Where it is unpickled it takes the object and turns into the batch."""

    __slots__ = ("_ref", "_payload", "_address", "_consumer")

    def __init__(self, ref_bytes, payload, address, consumer):
        self._ref, self._payload = ref_bytes, payload
        self._address, self._consumer = address, consumer

    def __reduce__(self):
        if self._ref is None:
            raise RuntimeError("this PooledBatch was already turned into "
                               "tensors")
        return (_receive_pooled, (self._ref, self._payload, self._address,
                                  self._consumer))

    def _materialize(self, client=None):
        ref_bytes, self._ref = self._ref, None
        if ref_bytes is None:
            raise RuntimeError("this PooledBatch was already turned into "
                               "tensors")
        return _pooled_batch(ref_bytes, self._payload, self._address, client)


def _pooled_batch(ref_bytes, payload, address, client=None):
    from .. import ObjectRef
    c = client if client is not None else local_client(address)
    view = c.get(ObjectRef(ref_bytes))  # The exclusive take: writable.
    flat = view.tensor()
    view.close()  # flat (and every tensor cut from it) holds the lease.
    return _batch.unpack(payload, flat)


def _receive_pooled(ref_bytes, payload, address, consumer):
    return _deliver(consumer, _pooled_batch, (ref_bytes, payload, address))


class RingBatch:
    """A batch a DataLoader worker collated into a slot of its batch ring:
    the ring's ref and shape, the slot and its generation, and the batch's
    structure (batch.py's payload). Where it is unpickled it adopts the slot
    (no daemon call; the first batch of a ring joins the ring, one call) and
    turns into the batch: from then on the batch's memory is the receiving
    process's, whatever becomes of the worker. A slot is free for the worker
    again when the last tensor over it dies."""

    __slots__ = ("_args", "_used", "_form")

    def __init__(self, ring, slots, slot_bytes, align, slot, gen, nbytes,
                 payload, address, consumer, form=None):
        """`form`: ring_form() of the same arguments, or None."""
        self._args = (ring, slots, slot_bytes, align, slot, gen, nbytes,
                      payload, address, consumer)
        self._used = False
        self._form = form

    def __reduce__(self):
        if self._form is not None:
            return (_receive_ring_form, (self._form, self._args[4],
                                         self._args[5]))
        return (_receive_ring, self._args)

    def _materialize(self, client=None):
        if self._used:
            raise RuntimeError("this RingBatch was already turned into "
                               "tensors")
        self._used = True
        return _ring_batch(*self._args, client=client)


_UNKNOWN = object()


def _ring_batch(ring_ref, slots, slot_bytes, align, slot, gen, nbytes,
                payload, address, consumer, client=None, typed=_UNKNOWN):
    """`typed`: _batch.typed_leaf(payload, nbytes), when the caller has it."""
    cache = _rings.RingCache.find(consumer)
    if cache is None:
        cache = _rings.RingCache(register=False)  # Joined for this batch only.
    ring = cache.ring(ring_ref, slots, slot_bytes, align, address, client)
    _torch_sharing.install()
    if typed is _UNKNOWN:
        typed = _batch.typed_leaf(payload, nbytes)
    if typed is not None:  # The batch is one tensor: the slot taken as it.
        return _batch.typed_tensor(ring.adopt(slot, gen, nbytes, *typed),
                                   typed[0])
    flat = _batch.from_capsule(ring.adopt(slot, gen, max(nbytes, 1)))
    return _batch.unpack(payload, flat)


def _receive_ring(*args):
    return _deliver(args[9], _ring_batch, args)


def ring_form(ring, slots, slot_bytes, align, nbytes, payload, address,
              consumer):
    """What a RingBatch says besides its slot and generation, pickled: a
    producer that hands over batch after batch alike makes it once and gives
    it to each (form=). Such a batch pickles as the form, its slot and its
    generation, and the receiving process unpickles each form once
    (_forms): a batch then costs three small objects to pickle and to
    unpickle, whatever its structure and dtype take."""
    return pickle.dumps((ring, slots, slot_bytes, align, nbytes, payload,
                         address, consumer), pickle.HIGHEST_PROTOCOL)


# Forms this process received, unpickled (with the batch's typed_leaf):
# form -> (its tuple, typed). A form names a worker's ring and a shape of
# batch it makes batch after batch, so a process sees one per worker and
# such shape; past _MAX_FORMS (iterator after iterator) the cache starts
# afresh. Read and written under the interpreter lock alone: two threads
# that miss at once both unpickle, and either result serves.
_forms = {}
_MAX_FORMS = 256


def _receive_ring_form(form, slot, gen):
    # Only a DataLoader's worker makes forms (a ring needs a consumer), so
    # every failure here is torch's ExceptionWrapper, as in _deliver.
    try:
        known = _forms.get(form)
        if known is None:
            _torch_sharing.install()  # As _ring_batch, before any tensor.
            args = pickle.loads(form)
            if len(_forms) >= _MAX_FORMS:
                _forms.clear()
            known = _forms[form] = (args, _batch.typed_leaf(args[5], args[4]))
        (ring_ref, slots, slot_bytes, align, nbytes, payload, address,
         consumer), typed = known
        return _ring_batch(ring_ref, slots, slot_bytes, align, slot, gen,
                           nbytes, payload, address, consumer, typed=typed)
    except Exception:  # noqa: BLE001 - re-raised by torch, with traceback.
        return _failure()


def _deliver(consumer, make, args):
    """make(*args), the batch. In a DataLoader (`consumer` set) a failure
    becomes torch's ExceptionWrapper, which torch's iterator re-raises for
    this batch (as for a worker's error) instead of the receiving thread
    (torch's pin-memory thread, perhaps) dying of it."""
    if consumer is None:
        return make(*args)
    try:
        return make(*args)
    except Exception:  # noqa: BLE001 - re-raised by torch, with traceback.
        return _failure()


def _failure():
    """torch's ExceptionWrapper of the exception being handled."""
    from torch._utils import ExceptionWrapper
    return ExceptionWrapper(
        where="in the training process, taking a batch shmtensor handed over")


def to_tensors(batch, client=None):
    """The batch of a PooledBatch or RingBatch that this process made and
    did not send (anything else, a batch that came through a queue included,
    is returned as is): ordinary writable CPU tensors over the pool memory,
    in the structure the collate function produced. The memory returns to
    the pool (a ring slot: to its worker) when the last of them (or of
    tensors viewing them) dies. Works once per handle."""
    if isinstance(batch, (PooledBatch, RingBatch)):
        return batch._materialize(client)
    return batch

