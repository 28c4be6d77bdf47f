"""DataLoader batches handed over by reference through shmtensord pools.

One-line change for a training job:

    from shmtensor.torch import DataLoader      # instead of torch.utils.data
    loader = DataLoader(dataset, batch_size=64, num_workers=4, shuffle=True)
    for batch in loader:                          # same batches, same order
        ...

The arguments, their defaults and the iterator are the installed torch's own
(the loader is torch's, with only its collate_fn wrapped). Each worker
collates its batch straight into pool memory (torch.stack into it: no extra
copy) and sends only a small handle through torch's worker queue; the
training process receives it as the batch itself: ordinary writable torch
tensors over that memory, in the structure torch gives, which is reused when
the last of those tensors (and of any tensor viewing them) dies, never
earlier, whatever becomes of the worker that made it. The memory is a slot
of the worker's batch ring: one shared-writable pool object per worker,
joined once by the training process, so a batch costs no call to the daemon
at all (docs/shm_layout.md, "Batch rings"). A batch that does not fit its
worker's slots (or finds them all in use) goes into a pool buffer of its
own, sealed for exclusive hand-off and taken by the training process.

Without the wrapper, for your own loader loops: `PoolCollate` is a collate_fn
for the producing side; what it returns turns into the batch's tensors where
it is unpickled (or, in the process that made it, through `to_tensors`):

    collate = PoolCollate()                        # in the producer process
    handle = collate([dataset[i] for i in idx])    # picklable, small
    queue.put(handle)
    ...
    batch = queue.get()                            # in the consumer process

(PoolCollate on its own hands each batch over as a pool object of its own;
batch rings need the DataLoader, which knows which process consumes them.)

What goes into the pool: with the default collate_fn (or batch_size=None's
default_convert), torch's own collate runs, each stack of tensors made
straight in the pool; with your `collate_fn`, its result is taken as it is.
Either way every CPU tensor of the result (see shmtensor/_batch.py for the
exact rule) lies in the pool, and everything else (NumPy arrays, numbers,
strings, tensors on other devices, your own objects around the tensors) is
passed through the worker queue as torch passes it, so the batch comes out
equal to torch's.
"""

import inspect
import itertools
import os
import threading
import typing
import weakref

import torch
import torch.utils.data

from . import _autostart, _batch, _core
from ._local import local_client
from .errors import (Error, LargerThanPoolError, PoolExhaustedError)

__all__ = ["DataLoader", "PoolCollate", "to_tensors"]


def _client(address):
    return local_client(address)


# -- handles: what a worker sends ----------------------------------------------

class PooledBatch:
    """What a producer sends for a batch in a pool object of its own: the
    object's ref (sealed for exclusive hand-off) and the batch's structure
    (shmtensor/_batch.py's payload).
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
    from . import ObjectRef
    c = client if client is not None else _client(address)
    view = c.get(ObjectRef(ref_bytes))  # The exclusive take: writable.
    flat = view.tensor()
    view.close()  # flat (and every tensor cut from it) holds the lease.
    return _batch.unpack(payload, flat)


def _receive_pooled(ref_bytes, payload, address, consumer):
    return _deliver(consumer, _pooled_batch, (ref_bytes, payload, address))


class RingBatch:
    """What a DataLoader worker sends for a batch it collated into a slot of
    its batch ring: the ring's ref and shape, the slot and its generation,
    and the batch's structure (shmtensor/_batch.py's payload). Where it is unpickled it adopts the slot (no
    daemon call; the first batch of a ring joins the ring, one call) and
    turns into the batch: from then on the batch's memory is the receiving
    process's, whatever becomes of the worker. A slot is free for the worker
    again when the last tensor over it dies."""

    __slots__ = ("_args", "_used")

    def __init__(self, ring, slots, slot_bytes, align, slot, gen, nbytes,
                 payload, address, consumer):
        self._args = (ring, slots, slot_bytes, align, slot, gen, nbytes,
                      payload, address, consumer)
        self._used = False

    def __reduce__(self):
        return (_receive_ring, self._args)

    def _materialize(self, client=None):
        if self._used:
            raise RuntimeError("this RingBatch was already turned into "
                               "tensors")
        self._used = True
        return _ring_batch(*self._args, client=client)


def _ring_batch(ring_ref, slots, slot_bytes, align, slot, gen, nbytes,
                payload, address, consumer, client=None):
    cache = _caches.get(consumer) if consumer is not None else None
    if cache is None or cache.pid != os.getpid():
        cache = _RingCache(register=False)  # Joined for this batch only.
    ring = cache.ring(ring_ref, slots, slot_bytes, align, address, client)
    flat = torch.from_dlpack(ring.adopt(slot, gen, max(nbytes, 1)))
    return _batch.unpack(payload, flat)


def _receive_ring(*args):
    return _deliver(args[9], _ring_batch, args)


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
        from torch._utils import ExceptionWrapper
        return ExceptionWrapper(
            where="in the training process, taking a batch shmtensor handed "
                  "over")


class _RingCache:
    """The batch rings one consumer joined, by ref: each is joined (a daemon
    call) once and kept while the cache lives, which is while the DataLoader
    iterator lives (persistent workers: the loader). Every tensor adopted
    from a ring also holds it, so batches outlive the cache. A cache is
    found by its token, which the DataLoader gives its workers' collate_fn.
    Thread-safe (torch's pin-memory thread receives batches too)."""

    _serial = itertools.count(1)

    def __init__(self, register=True):
        self.pid = os.getpid()
        self.token = f"{self.pid}.{next(self._serial)}"
        self._rings = {}
        self._lock = threading.Lock()
        if register:
            _caches[self.token] = self

    def ring(self, ring_ref, slots, slot_bytes, align, address, client=None):
        """The joined ring of `ring_ref`: joined now (through `client`, or
        this process's client of `address`) if it was not yet."""
        with self._lock:
            ring = self._rings.get(ring_ref)
            if ring is None:
                from . import ObjectRef
                c = client if client is not None else _client(address)
                view = c.get(ObjectRef(ring_ref))  # Shared-writable.
                ring = _core.BatchRing.join(view, slots, slot_bytes, align)
                view.close()  # The ring, and each tensor from it, holds it.
                self._rings[ring_ref] = ring
            return ring


# Ring caches of this process's live DataLoader iterators, by token.
_caches = weakref.WeakValueDictionary()


# -- the producer side ---------------------------------------------------------

class PoolCollate:
    """A collate_fn that collates into a shmtensord pool buffer and returns
    a small, picklable handle, which turns into the batch (writable tensors
    over the pool memory) where it is unpickled; in the process that made
    it, `to_tensors` does that (once: the hand-off is exclusive).

    address: the daemon (None: as shmtensor.connect() resolves it).
    collate_fn: None for the installed torch's default_collate, with its
      stacks made straight in the pool; else your function, whose result's
      CPU tensors are then copied in (see the module docstring).
    pool_timeout: seconds to wait for pool memory when the pool is full (the
      training loop may be holding batches) before PoolExhaustedError says
      how large the pool should be.
    in_flight: batches expected in flight at once, for that message.
    """

    def __init__(self, address=None, collate_fn=None, pool_timeout=30.0,
                 in_flight=None):
        self.address = address
        self.collate_fn = collate_fn
        self.pool_timeout = pool_timeout
        self.in_flight = in_flight
        # Batch ring of this worker process (the DataLoader turns it on):
        # slots in it, and the ring, made on the first batch.
        self._ring_slots = 0
        self._ring = None  # (BatchRing, ref bytes), or False: none to be had.
        self._ring_pid = None
        # The token of the consumer's ring cache (the DataLoader sets it).
        self._consumer = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_ring"], state["_ring_pid"] = None, None  # Per process.
        return state

    def _ring_for(self, client, nbytes):
        """This process's batch ring, made on first use with slots of
        `nbytes`; None when rings are off or none can be had. A ring is made
        only when the slots of every worker's ring take at most half the pool
        together, and without waiting for memory: batches that do not fit
        one go through the pool one by one."""
        if self._ring_slots == 0 or nbytes == 0:
            return None
        if self._ring_pid != os.getpid():
            self._ring, self._ring_pid = None, os.getpid()
        if self._ring is None:
            self._ring = False
            info = torch.utils.data.get_worker_info()
            workers = info.num_workers if info is not None else 1
            try:
                pool = client.stats()["pools"][0]
                align = max(pool["huge_page_size"], 4096)
                size = _core.BatchRing.bytes(self._ring_slots, nbytes, align)
                slots = self._ring_slots * -(-nbytes // align) * align
                if slots * workers <= pool["size_bytes"] // 2:
                    buf = client.create_bytes(size, timeout=0,
                                              shared_writable=True)
                    ring = _core.BatchRing.create(buf, self._ring_slots,
                                                  nbytes, align)
                    self._ring = (ring, bytes(buf.ref_bytes))
            except Error:
                pass  # Pool too full now: batch by batch.
        return self._ring or None

    def _into_ring(self, client, plan, payload):
        """The batch filled into a free slot of this worker's ring, as a
        RingBatch; None when it has no ring, the batch does not fit a slot
        or every slot is in use."""
        got = self._ring_for(client, plan.size)
        if got is None:
            return None
        ring, ref = got
        if plan.size > ring.slot_bytes:
            return None
        slot = ring.claim()
        if slot < 0:
            return None
        try:
            _batch.fill(plan, torch.from_dlpack(ring.target(slot, plan.size)))
        except BaseException:
            ring.unclaim(slot)
            raise
        gen = ring.generation(slot)
        ring.hand(slot)
        return RingBatch(ref, ring.slots, ring.slot_bytes, ring.align, slot,
                         gen, plan.size, payload, self.address,
                         self._consumer)

    def __call__(self, samples):
        plan = _batch.Plan()
        if self.collate_fn is None:
            batch = plan.collate(samples)
        else:
            batch = self.collate_fn(samples)
        payload = _batch.pack(plan, batch)
        if not plan:
            return batch  # Nothing for the pool: as torch passes it.
        client = _client(self.address)
        ringed = self._into_ring(client, plan, payload)
        if ringed is not None:
            return ringed
        try:
            buf = client.create_bytes(max(plan.size, 1),
                                      timeout=self.pool_timeout)
        except PoolExhaustedError as e:
            raise PoolExhaustedError(self._advice(plan.size, str(e))) from None
        except LargerThanPoolError as e:
            raise PoolExhaustedError(self._advice(plan.size, str(e))) from None
        _batch.fill(plan, buf.tensor())
        ref = buf.seal(exclusive=True)
        return PooledBatch(bytes(ref), payload, self.address, self._consumer)

    def _advice(self, nbytes, error):
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        in_flight = self.in_flight or 2 * workers
        need = nbytes * (in_flight + 2)
        rings = ""
        if self._ring:  # Every worker holds one like it for its life.
            ring = self._ring[0]
            ring_bytes = _core.BatchRing.bytes(ring.slots, ring.slot_bytes,
                                               ring.align)
            need += workers * ring_bytes
            rings = f" and {workers} batch rings of {ring_bytes} bytes"
        what = (f"{error}. A batch needs {nbytes} bytes; with about "
                f"{in_flight} batches in flight ({workers} workers x "
                f"prefetch_factor), 2 held by the training loop{rings}, the "
                f"pool should hold at least {need} bytes")
        try:
            size = _client(self.address).stats()["pools"][0]["size_bytes"]
        except Error:
            size = 0
        if size >= need:
            return (f"{what}, and it holds {size}: the training loop keeps "
                    f"more batches than that alive (a list of batches, or "
                    f"tensors from them); each keeps its memory until it is "
                    f"dropped")
        return (f"{what}: start shmtensord with --pool-size "
                f"{_pool_size_arg(need)} (or lower batch_size, num_workers "
                f"or prefetch_factor)")


def _pool_size_arg(nbytes):
    """A --pool-size value of at least `nbytes`, in whole MiB or GiB."""
    mib = -(-nbytes // (1 << 20))
    return f"{-(-mib // 1024)}GiB" if mib >= 1024 else f"{mib}MiB"


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


# -- the drop-in DataLoader ----------------------------------------------------

_T_co = typing.TypeVar("_T_co", covariant=True)
_TorchLoader = torch.utils.data.DataLoader


class DataLoader(_TorchLoader[_T_co]):
    """torch.utils.data.DataLoader with batches handed over through a
    shmtensord pool. The installed torch's arguments and defaults (see
    inspect.signature), its iterator, the same batches in the same order
    (the sampler, workers and seeds are torch's own), plus, keyword-only:

    shmtensor_address: the daemon (None: as shmtensor.connect() resolves
      it: $SHMTENSOR_ADDRESS, the default, or a private daemon).
    pool_timeout: seconds a worker waits for pool memory before
      PoolExhaustedError says how large the pool should be (default 30).

    With num_workers=0 there is no other process to hand batches to, and it
    is torch's DataLoader. pin_memory=True pins as torch does, on torch's
    pin-memory thread (a copy into page-locked memory, after which the pool
    memory is free again). A worker that dies, or a loop that stops early,
    leaves nothing behind in the pool (the daemon reclaims what the worker
    held; batches received and dropped give their memory back at once).

    Pool memory: each worker keeps a batch ring of prefetch_factor + 2 slots
    the size of its first batch (when all the rings' slots take at most half
    the pool), for the life of the worker; the training process holds the
    rings while the iterator (persistent workers: the loader) lives, and each
    slot while a tensor over it does.
    """

    def __init__(self, *args, shmtensor_address=None, pool_timeout=30.0,
                 **kwargs):
        # torch checks and defaults every argument of its own; collate_fn
        # stays what torch made it (for code that reads or replaces it).
        super().__init__(*args, **kwargs)
        self._shmtensor_options = (shmtensor_address, pool_timeout)
        self._shmtensor_pool = None   # (the collate_fn wrapped, PoolCollate)
        self._shmtensor_rings = None  # Persistent workers': the loader's.

    def _pool_collate(self):
        """The PoolCollate over the loader's collate_fn as it stands now."""
        fn = self.collate_fn
        if self._shmtensor_pool is None or self._shmtensor_pool[0] is not fn:
            address, timeout = self._shmtensor_options
            # Resolved here (a private daemon started now if need be) and
            # handed to the workers: a forkserver started before would not
            # have $SHMTENSOR_ADDRESS.
            address = _autostart.resolve(address)
            prefetch = self.prefetch_factor or 2
            # torch's default_collate: the same, with stacks made in the pool.
            wrapped = None if fn is torch.utils.data.default_collate else fn
            pool = PoolCollate(address, wrapped, timeout,
                               in_flight=self.num_workers * prefetch)
            # Each worker's ring: its prefetched batches, and two more for
            # its batches the training loop holds (the one in hand, and the
            # last one until the loop variable moves on). A batch that finds
            # every slot taken goes through the pool instead.
            pool._ring_slots = prefetch + 2
            self._shmtensor_pool = (fn, pool)
        return self._shmtensor_pool[1]

    def __iter__(self):
        """torch's iterator; with workers, one whose workers collate into
        the pool. Not to be called from two threads at once (it hands the
        workers' collate_fn to torch through the loader's attribute)."""
        if self.num_workers == 0:
            return super().__iter__()
        if self.persistent_workers and self._iterator is not None:
            return super().__iter__()  # torch resets it; workers stay.
        rings = _RingCache()
        pool = self._pool_collate()
        pool._consumer = rings.token
        own = self.collate_fn
        self.collate_fn = pool  # What torch's iterator gives its workers.
        try:
            it = super().__iter__()
        finally:
            self.collate_fn = own
        if self.persistent_workers:
            self._shmtensor_rings = rings  # The rings outlive the epoch.
        else:
            it._shmtensor_rings = rings  # Held while the iterator lives.
        return it


def _signature():
    """torch's DataLoader signature, and ours after it."""
    sig = inspect.signature(_TorchLoader.__init__)
    ours = [inspect.Parameter("shmtensor_address",
                              inspect.Parameter.KEYWORD_ONLY, default=None),
            inspect.Parameter("pool_timeout", inspect.Parameter.KEYWORD_ONLY,
                              default=30.0)]
    return sig.replace(parameters=list(sig.parameters.values()) + ours)


DataLoader.__init__.__signature__ = _signature()
