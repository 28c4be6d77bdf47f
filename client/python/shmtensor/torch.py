"""DataLoader batches handed over by reference through shmtensord pools.

One-line change for a training job:

    from shmtensor.torch import DataLoader      # instead of torch.utils.data
    loader = DataLoader(dataset, batch_size=64, num_workers=4, shuffle=True)
    for batch in loader:                          # same batches, same order
        ...

Each worker collates its batch straight into pool memory (torch.stack into
it: no extra copy) and sends only a small handle through torch's worker
queue; the training process gets ordinary writable torch tensors over that
memory, which is reused when the last of those tensors (and of any tensor
viewing them) dies, never earlier. The memory is a slot of the worker's
batch ring: one shared-writable pool object per worker, joined once by the
training process, so a batch costs no call to the daemon at all
(docs/shm_layout.md, "Batch rings"). A batch that does not fit its worker's
slots (or finds them all in use) goes into a pool buffer of its own, sealed
for exclusive hand-off and taken by the training process.

Without the wrapper, for your own loader loops: `PoolCollate` is a collate_fn
for the producing side, `to_tensors` turns what it produced back into tensors
on the consuming side:

    collate = PoolCollate()                        # in the producer process
    handle = collate([dataset[i] for i in idx])    # picklable, small
    queue.put(handle)
    ...
    batch = to_tensors(queue.get())                # in the consumer process

(PoolCollate on its own hands each batch over as a pool object of its own;
batch rings need the DataLoader, which knows when no handle of a ring can
still arrive.)

What goes into the pool: every tensor that default_collate would produce
(stacked tensors and NumPy arrays, batched numbers, NumPy scalars). Strings
and bytes stay Python lists, as with default_collate. With a custom
`collate_fn`, its output is walked after it ran: each CPU tensor in it is
copied into the pool (one copy, as torch itself makes when it moves a tensor
to shared memory); anything else (NumPy arrays, numbers, strings, your own
objects) is passed through the worker queue as torch would pass it.
"""

import collections.abc
import os
import sys
import weakref

import torch
import torch.utils.data

from . import _core
from ._local import local_client
from .errors import Error, InvalidArgumentError, PoolExhaustedError

__all__ = ["DataLoader", "PoolCollate", "to_tensors"]

# Leaves are packed in one buffer at this alignment (cache line, and enough
# for every dtype's element size).
_ALIGN = 64


# -- the producer side --------------------------------------------------------

class _Leaf:
    """Placeholder for one tensor inside a pooled batch: where it lies in the
    batch's buffer."""

    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset, dtype, shape):
        self.offset, self.dtype, self.shape = offset, dtype, tuple(shape)

    def __reduce__(self):
        return (_Leaf, (self.offset, self.dtype, self.shape))

    @property
    def nbytes(self):
        n = torch.Size(self.shape).numel()
        return n * torch.empty((), dtype=self.dtype).element_size()


class _Plan:
    """Leaves to allocate and how to fill each (collect first, then one
    buffer, then fill)."""

    def __init__(self):
        self.fills = []  # (leaf, fill(out_tensor))
        self.size = 0

    def leaf(self, dtype, shape, fill):
        self.size = (self.size + _ALIGN - 1) // _ALIGN * _ALIGN
        leaf = _Leaf(self.size, dtype, shape)
        self.size += leaf.nbytes
        self.fills.append((leaf, fill))
        return leaf


def _stack_leaf(plan, tensors):
    elem = tensors[0]
    shape = (len(tensors),) + tuple(elem.shape)

    def fill(out):
        torch.stack(tensors, 0, out=out)  # Raises as default_collate would.
    return plan.leaf(elem.dtype, shape, fill)


def _tensor_leaf(plan, t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()

    def fill(out):
        out.copy_(t)
    return plan.leaf(t.dtype, t.shape, fill)


_NP_STR_OBJ = ("S", "a", "U", "O")
_COLLATE_ERR = ("default_collate: batch must contain tensors, numpy arrays, "
                "numbers, dicts or lists; found {}")


def _collate(plan, batch):
    """default_collate of torch 1.13, with each resulting tensor planned into
    the pool instead of allocated."""
    elem = batch[0]
    elem_type = type(elem)
    if isinstance(elem, torch.Tensor):
        return _stack_leaf(plan, batch)
    if (elem_type.__module__ == "numpy" and elem_type.__name__ != "str_"
            and elem_type.__name__ != "string_"):
        if elem_type.__name__ in ("ndarray", "memmap"):
            if elem.dtype.char in _NP_STR_OBJ or elem.dtype.kind in "SaUO":
                raise TypeError(_COLLATE_ERR.format(elem.dtype))
            return _stack_leaf(plan, [torch.as_tensor(b) for b in batch])
        if elem.shape == ():  # NumPy scalars.
            return _tensor_leaf(plan, torch.as_tensor(batch))
    elif isinstance(elem, float):
        return _tensor_leaf(plan, torch.tensor(batch, dtype=torch.float64))
    elif isinstance(elem, int):
        return _tensor_leaf(plan, torch.tensor(batch))
    elif isinstance(elem, (str, bytes)):
        return batch
    elif isinstance(elem, collections.abc.Mapping):
        try:
            return elem_type({k: _collate(plan, [d[k] for d in batch])
                              for k in elem})
        except TypeError:
            return {k: _collate(plan, [d[k] for d in batch]) for k in elem}
    elif isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(_collate(plan, s) for s in zip(*batch)))
    elif isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        size = len(next(it))
        if not all(len(e) == size for e in it):
            raise RuntimeError(
                "each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [_collate(plan, s) for s in transposed]
        try:
            return elem_type([_collate(plan, s) for s in transposed])
        except TypeError:
            return [_collate(plan, s) for s in transposed]
    raise TypeError(_COLLATE_ERR.format(elem_type))


def _map_leaves(obj, fn):
    """`obj` with fn applied to every leaf, containers (mappings,
    namedtuples, tuples, lists) rebuilt around the results; strings and bytes
    are leaves."""
    if isinstance(obj, (str, bytes)):
        return fn(obj)
    if isinstance(obj, collections.abc.Mapping):
        try:
            return type(obj)({k: _map_leaves(v, fn) for k, v in obj.items()})
        except TypeError:
            return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_leaves(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_leaves(v, fn) for v in obj)
    return fn(obj)


def _move_tensors(plan, obj):
    """A custom collate_fn's output with its CPU tensors planned into the
    pool (copied); everything else as is."""
    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            return _tensor_leaf(plan, x)
        return x
    return _map_leaves(obj, move)


def _client(address):
    return local_client(address)


class PooledBatch:
    """What a worker sends: the ref of the batch's pool object (sealed for
    exclusive hand-off) and the batch's structure with _Leaf placeholders.
    A few hundred bytes, whatever the batch size.

    If the receiving process drops it without calling to_tensors (a loop
    that broke early, a persistent worker's leftovers), it takes the object
    and releases it, so the memory goes back at once instead of when the
    worker exits."""

    __slots__ = ("_ref", "_skeleton", "_address", "_owner_pid", "__weakref__")

    def __init__(self, ref_bytes, skeleton, address):
        self._ref, self._skeleton, self._address = ref_bytes, skeleton, address
        self._owner_pid = None  # Set where it is received (unpickled).

    def __reduce__(self):
        return (_received, (self._ref, self._skeleton, self._address))

    def pin_memory(self):  # torch's pin thread: nothing to pin yet.
        return self

    def _take(self):
        ref_bytes, self._ref = self._ref, None
        return ref_bytes

    def __del__(self):
        if self._ref is None or self._owner_pid != os.getpid():
            return
        if sys.is_finalizing():
            # Interpreter teardown: no new connection and no call now (gRPC
            # may be going away under us). The transfer is reclaimed when
            # its creator's session ends, at the latest as this job exits.
            return
        try:
            from . import ObjectRef
            _client(self._address).get(ObjectRef(self._ref),
                                       writable=False).close()
        except Exception:  # noqa: BLE001 - best effort at teardown.
            pass


def _received(ref_bytes, skeleton, address):
    b = PooledBatch(ref_bytes, skeleton, address)
    b._owner_pid = os.getpid()
    return b


class RingBatch:
    """What a DataLoader worker sends for a batch it collated into a slot of
    its batch ring (see PoolCollate): the ring's ref and shape, the slot and
    its generation, and the batch's structure. No daemon call on either side
    per batch: the training process joins each worker's ring once, and a slot
    is free for the worker again when the last tensor over it dies.

    A handle dropped unused where it was received (a loop that broke early,
    torch discarding an abandoned epoch's batches) frees its slot at once if
    this process has joined the ring; else the slot is reclaimed when no
    handle can still arrive (the next epoch of persistent workers, or the
    ring's end)."""

    __slots__ = ("_ring", "_slots", "_slot_bytes", "_align", "_slot", "_gen",
                 "_nbytes", "_skeleton", "_address", "_used", "_owner_pid")

    def __init__(self, ring, slots, slot_bytes, align, slot, gen, nbytes,
                 skeleton, address):
        self._ring, self._slots, self._slot_bytes = ring, slots, slot_bytes
        self._align = align
        self._slot, self._gen, self._nbytes = slot, gen, nbytes
        self._skeleton, self._address = skeleton, address
        self._used = False
        self._owner_pid = None  # Set where it is received (unpickled).

    def __reduce__(self):
        return (_ring_received, (self._ring, self._slots, self._slot_bytes,
                                 self._align, self._slot, self._gen,
                                 self._nbytes, self._skeleton, self._address))

    def __del__(self):
        if self._used or self._owner_pid != os.getpid():
            return
        ring = _joined_rings.get(self._ring)
        if ring is not None:
            ring.abandon(self._slot, self._gen)  # No-op if it moved on.

    def pin_memory(self):  # torch's pin thread: nothing to pin yet.
        return self

    def _adopt(self, rings, client):
        """The batch's tensors, over its slot; `rings` caches this process's
        joined rings by ref."""
        if self._used:
            raise RuntimeError("this RingBatch was already turned into tensors")
        self._used = True
        ring = rings.get(self._ring)
        if ring is None:
            from . import ObjectRef
            c = client if client is not None else _client(self._address)
            view = c.get(ObjectRef(self._ring))  # Writable: shared-writable.
            ring = _core.BatchRing.join(view, self._slots, self._slot_bytes,
                                        self._align)
            view.close()  # The ring, and each tensor from it, holds the lease.
            rings[self._ring] = ring
            _joined_rings[self._ring] = ring
        flat = torch.from_dlpack(ring.adopt(self._slot, self._gen,
                                            max(self._nbytes, 1)))
        return _rebuild(self._skeleton, flat)


def _ring_received(*args):
    b = RingBatch(*args)
    b._owner_pid = os.getpid()
    return b


# The rings this process joined and still holds (by ref), for handles dropped
# unused: weak, the DataLoader iterators' own dicts keep them.
_joined_rings = weakref.WeakValueDictionary()


class PoolCollate:
    """A collate_fn that collates into a shmtensord pool buffer and returns
    a small, picklable PooledBatch; `to_tensors` turns it into tensors in
    the process that receives it (once: the hand-off is exclusive).

    address: the daemon (None: $SHMTENSOR_ADDRESS or the default).
    collate_fn: None for default_collate semantics (tensors go straight into
      the pool); else your function, whose CPU tensors are then copied in.
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

    def _into_ring(self, client, plan, skeleton):
        """The batch collated into a free slot of this worker's ring, as a
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
            _fill(plan, torch.from_dlpack(ring.target(slot, plan.size)))
        except BaseException:
            ring.unclaim(slot)
            raise
        gen = ring.generation(slot)
        ring.hand(slot)
        return RingBatch(ref, ring.slots, ring.slot_bytes, ring.align, slot,
                         gen, plan.size, skeleton, self.address)

    def __call__(self, samples):
        plan = _Plan()
        if self.collate_fn is None:
            skeleton = _collate(plan, samples)
        else:
            skeleton = _move_tensors(plan, self.collate_fn(samples))
        if not plan.fills:
            return skeleton  # Nothing for the pool (strings only, ...).
        client = _client(self.address)
        ringed = self._into_ring(client, plan, skeleton)
        if ringed is not None:
            return ringed
        try:
            buf = client.create_bytes(max(plan.size, 1),
                                      timeout=self.pool_timeout)
        except PoolExhaustedError as e:
            raise PoolExhaustedError(self._advice(plan.size, str(e))) from None
        except InvalidArgumentError as e:  # Larger than the whole pool.
            if "exceeds pool" not in str(e):
                raise
            raise PoolExhaustedError(self._advice(plan.size, str(e))) from None
        _fill(plan, buf.tensor())
        ref = buf.seal(exclusive=True)
        return PooledBatch(bytes(ref), skeleton, self.address)

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


def _fill(plan, flat):
    """Runs the plan's fills into `flat` (uint8, at least plan.size long);
    keeps no reference to it."""
    for leaf, fill in plan.fills:
        n = leaf.nbytes
        out = flat[leaf.offset:leaf.offset + n]
        if n:
            out = out.view(leaf.dtype)
        else:
            out = torch.empty(0, dtype=leaf.dtype)
        fill(out.view(leaf.shape))


def _pool_size_arg(nbytes):
    """A --pool-size value of at least `nbytes`, in whole MiB or GiB."""
    mib = -(-nbytes // (1 << 20))
    return f"{-(-mib // 1024)}GiB" if mib >= 1024 else f"{mib}MiB"


# -- the consumer side ---------------------------------------------------------

def _rebuild(obj, flat):
    """The skeleton with each _Leaf replaced by its tensor, cut from `flat`."""
    def tensor(x):
        if not isinstance(x, _Leaf):
            return x
        n = x.nbytes
        if n == 0:
            return torch.empty(x.shape, dtype=x.dtype)
        return flat[x.offset:x.offset + n].view(x.dtype).view(x.shape)
    return _map_leaves(obj, tensor)


def to_tensors(batch, client=None, rings=None):
    """The tensors of a PooledBatch or RingBatch (anything else is returned
    as is): ordinary writable CPU tensors over the pool memory, in the
    structure the collate function produced. The memory returns to the pool
    (a ring slot: to its worker) when the last of them (or of tensors viewing
    them) dies. Works once per batch. `rings`: a dict in which the batch rings
    this process joined are kept (the DataLoader's iterator passes its own;
    without one, each RingBatch joins its ring anew, a daemon call)."""
    if isinstance(batch, RingBatch):
        return batch._adopt({} if rings is None else rings, client)
    if not isinstance(batch, PooledBatch):
        return batch
    from . import ObjectRef
    ref_bytes = batch._take()
    if ref_bytes is None:
        raise RuntimeError("this PooledBatch was already turned into tensors")
    c = client if client is not None else _client(batch._address)
    view = c.get(ObjectRef(ref_bytes))  # The exclusive take: writable.
    flat = view.tensor()
    view.close()  # flat (and every tensor cut from it) holds the lease.
    return _rebuild(batch._skeleton, flat)


# -- the drop-in DataLoader ----------------------------------------------------

class _Iter:
    """Wraps torch's iterator: turns each PooledBatch into tensors."""

    def __init__(self, inner, pin, rings):
        self._inner, self._pin, self._rings = inner, pin, rings

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._inner)

    def __next__(self):
        batch = to_tensors(next(self._inner), rings=self._rings)
        if self._pin:
            from torch.utils.data._utils.pin_memory import pin_memory
            batch = pin_memory(batch)
        return batch

    def __getattr__(self, name):
        return getattr(self._inner, name)


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader with batches handed over through a
    shmtensord pool. Same arguments, same batches in the same order (the
    sampler, workers and seeds are torch's own), plus:

    shmtensor_address: the daemon (None: $SHMTENSOR_ADDRESS or the default).
    pool_timeout: seconds a worker waits for pool memory before
      PoolExhaustedError says how large the pool should be (default 30).

    With num_workers=0 there is no other process to hand batches to, and it
    behaves exactly like torch's DataLoader. pin_memory=True pins the
    tensors after the hand-off when CUDA is available (a copy into page-
    locked memory, as torch makes); without CUDA torch's warning applies and
    nothing is pinned. A worker that dies, or a loop that stops early, leaves
    nothing behind in the pool (the daemon reclaims what the worker held;
    batches received but never used are given back).

    Pool memory: each worker keeps a batch ring of prefetch_factor + 2 slots
    the size of its first batch (when all the rings' slots take at most half
    the pool), for the life of the worker; the training process holds the
    rings while the iterator (persistent workers: the loader) lives, and each
    slot while a tensor over it does.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=2,
                 persistent_workers=False, pin_memory_device="",
                 shmtensor_address=None, pool_timeout=30.0):
        self._pool = num_workers > 0
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        # Batch rings joined, for persistent workers (whose rings outlive an
        # epoch); else each epoch's iterator has its own.
        self._rings = {}
        if self._pool:
            collate_fn = PoolCollate(shmtensor_address, collate_fn,
                                     pool_timeout,
                                     in_flight=num_workers * prefetch_factor)
            # Each worker's ring: its prefetched batches, and two more for
            # its batches the training loop holds (the one in hand, and the
            # last one until the loop variable moves on). A batch that finds
            # every slot taken goes through the pool instead.
            collate_fn._ring_slots = prefetch_factor + 2
        super().__init__(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory and not self._pool, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device)
        if self._pool and pin_memory and not self._pin:
            import warnings
            warnings.warn("pin_memory=True but CUDA is not available: "
                          "nothing is pinned")

    def __iter__(self):
        if not self._pool:
            return super().__iter__()
        if not self.persistent_workers:
            return _Iter(super().__iter__(), self._pin, {})
        # Persistent workers: a new epoch drops whatever the last one left
        # handed and unread (torch discards it while resetting its
        # iterator), so those slots are free again.
        for ring in self._rings.values():
            ring.reclaim_handed()
        return _Iter(super().__iter__(), self._pin, self._rings)
