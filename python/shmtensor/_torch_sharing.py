"""torch's own sharing, made safe for tensors over pool memory
(docs/pitfalls.md, P19).

torch shares a CPU tensor between processes by moving its storage into
shared memory of torch's own: ``share_memory_()`` does it, and so does
pickling through ``multiprocessing``'s ForkingPickler (a
``torch.multiprocessing`` queue, ``Process`` arguments). The move copies the
bytes and frees the old data pointer. For a tensor over a shmtensor pool
that frees the tensor's lease, while every NumPy array (``t.numpy()``) and
DLPack tensor made from it still points into the pool: once the pool reuses
the range they read another object's bytes.

install() (called when this process makes its first tensor over pool
memory) changes three things, for storages in this process's pool mappings
only; every other tensor goes torch's way, unchanged:

- ``share_memory_()`` does nothing, and ``is_shared()`` is True: the memory
  is shared already;
- ForkingPickler sends such a tensor (``torch.Tensor`` and the read-only
  ``ReadOnlyTensor``) or storage by reference when a read-only view holds
  its memory (a view of a sealed object, what get() and the DataLoader's
  pool objects give): the sender offers the object (client/offer.h; the
  daemon pins it until the receiver takes it, whatever the sender does
  meanwhile, exit included, for up to the daemon's limits.offer_grace_ms
  after the sender's session ended) and the message carries the ref, the
  offer's token and the tensor's geometry. The receiver takes the object
  with a lease of its own, through its process's client of the same daemon
  (shmtensor._local), and gets a ReadOnlyTensor over the same bytes: no
  byte is copied, and its tensor stays valid however long it lives.
- Everything else over pool memory (an unsealed buffer's tensor, a
  shared-writable object's, a DataLoader batch-ring slot's, a
  ``Parameter``, whose optimizer would write into read-only memory, and any
  tensor whose offer failed, e.g. at the daemon's
  limits.max_offers_per_session, said once as a warning) goes as a copy of
  its bytes in the message itself. The sender's storage never moves either
  way, so every view of it stays valid. (Not a clone handed to torch's
  reduction: that sends a descriptor of the clone's memory, which with
  spawn and forkserver children is read only when the child starts, after
  the clone is gone.)

Thread safety: install() is idempotent and thread-safe.
"""

import threading
import warnings

import numpy as np
import torch
import torch.multiprocessing  # Registers torch's reductions first.
import torch.utils.dlpack
from multiprocessing.reduction import ForkingPickler

from . import _core, errors

_lock = threading.Lock()
_installed = False


def _in_pool(ptr):
    return ptr != 0 and _core._in_pool(ptr)


def _storage_in_pool(storage):
    return storage.device.type == "cpu" and _in_pool(storage.data_ptr())


def _tensor_in_pool(t):
    return (t.device.type == "cpu" and t.layout == torch.strided
            and _in_pool(_untyped(t).data_ptr()))


if hasattr(torch.Tensor, "untyped_storage"):  # torch >= 2.0
    def _untyped(t):
        return t.untyped_storage()
else:  # torch 1.13
    def _untyped(t):
        return t.storage()._storage


def _offer(storage, itemsize):
    """(ref_bytes, token, byte offset of `storage` in its object, daemon
    address) when a read-only view holds the storage's memory and the
    daemon took the offer; None: send a copy."""
    ptr = storage.data_ptr()
    if ptr % itemsize:
        return None  # The receiver could not view it as that dtype.
    try:
        offer = _core._offer_at(ptr, storage.nbytes())
    except errors.PreconditionError:
        # The daemon's word that this read-only view's object may not go
        # by reference (a shared-writable object taken read-only, an
        # exclusive take): a copy, as for a writable one.
        return None
    except errors.Error as e:
        _warn_once(e)
        return None
    if offer is None:
        return None
    ref_bytes, token, base, _, address = offer
    return ref_bytes, token, ptr - base, address


_warned = False


def _warn_once(error):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"shmtensor: a tensor over pool memory is sent as a "
                      f"copy, not by reference: {error}", RuntimeWarning,
                      stacklevel=3)


def _taken(address, ref_bytes, token, offset, nbytes):
    """The receiving side of an offer: a uint8 tensor over the `nbytes`
    bytes at `offset` of the object, under a lease of this process."""
    install()
    from . import ObjectRef
    from ._local import local_client
    view = _core._take(local_client(address), ObjectRef(ref_bytes), token)
    # The capsule's share of the lease keeps the object; the view may go.
    return torch.utils.dlpack.from_dlpack(_core._bytes_of(view, offset,
                                                          nbytes))


_itemsizes = {}


def _itemsize(dtype):
    size = _itemsizes.get(dtype)
    if size is None:
        size = _itemsizes[dtype] = torch.empty(0, dtype=dtype).element_size()
    return size


def _rebuild_by_reference(address, ref_bytes, token, offset, nbytes, dtype,
                          shape, stride, storage_offset, requires_grad):
    """The receiving side of a tensor sent by reference: a ReadOnlyTensor
    over the sender's bytes, with its geometry."""
    flat = _taken(address, ref_bytes, token, offset, nbytes)
    itemsize = _itemsize(dtype)
    typed = flat[:nbytes - nbytes % itemsize].view(dtype)
    t = torch.as_strided(typed, shape, stride, storage_offset)
    from ._readonly import ReadOnlyTensor
    t = ReadOnlyTensor.wrap(t)
    return t.requires_grad_() if requires_grad else t


def _rebuild_storage_by_reference(address, ref_bytes, token, offset, nbytes):
    return _untyped(_taken(address, ref_bytes, token, offset, nbytes))


def _bytes_of(t):
    """The bytes of `t`'s elements, in C order."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def _rebuild_tensor(data, dtype, shape, requires_grad):
    """The receiving side of a tensor sent as a copy."""
    flat = torch.from_numpy(np.frombuffer(data, np.uint8).copy())
    t = flat.view(dtype).reshape(shape) if len(data) else torch.empty(
        shape, dtype=dtype)
    return t.requires_grad_(requires_grad)


def _rebuild_parameter(data, dtype, shape, requires_grad):
    return torch.nn.Parameter(_rebuild_tensor(data, dtype, shape, False),
                              requires_grad)


def _rebuild_storage(data):
    return _untyped(_rebuild_tensor(data, torch.uint8, (len(data),), False))


def install():
    """Makes torch's sharing leave pool storages where they are (see the
    module docstring). Idempotent."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        _wrap_reductions()
        _wrap_storage_methods()
        _installed = True


def _wrap_reductions():
    reducers = ForkingPickler._extra_reducers
    torch_tensor = reducers.get(torch.Tensor)
    torch_parameter = reducers.get(torch.nn.Parameter)
    torch_storage = reducers.get(torch.UntypedStorage)

    def reduce_tensor(t):
        # Plain torch below: a ReadOnlyTensor's __torch_function__ would
        # run on every attribute read and call here, and this reduction
        # writes nothing of the tensor for it to guard.
        with torch._C.DisableTorchFunction():
            if not _tensor_in_pool(t) or (t.requires_grad and not t.is_leaf):
                return torch_tensor(t)  # Torch's way (and its errors).
            if t.is_conj() or t.is_neg():
                # A lazy conjugate or negation: its values are not its
                # bytes. Resolved into new memory, it goes torch's way.
                return torch_tensor(t.resolve_conj().resolve_neg())
            storage = _untyped(t)
            offer = _offer(storage, t.element_size())
            if offer is not None:
                ref_bytes, token, offset, address = offer
                return (_rebuild_by_reference,
                        (address, ref_bytes, token, offset, storage.nbytes(),
                         t.dtype, tuple(t.shape), tuple(t.stride()),
                         t.storage_offset(), t.requires_grad))
            return (_rebuild_tensor,
                    (_bytes_of(t), t.dtype, tuple(t.shape), t.requires_grad))

    def reduce_parameter(p):
        if not _tensor_in_pool(p):
            return torch_parameter(p)
        return (_rebuild_parameter,
                (_bytes_of(p), p.dtype, tuple(p.shape), p.requires_grad))

    def reduce_storage(s):
        if not _storage_in_pool(s):
            return torch_storage(s)
        offer = _offer(s, 1)
        if offer is not None:
            ref_bytes, token, offset, address = offer
            return (_rebuild_storage_by_reference,
                    (address, ref_bytes, token, offset, s.nbytes()))
        data = _bytes_of(torch.empty(0, dtype=torch.uint8).set_(s))
        return (_rebuild_storage, (data,))

    if torch_tensor is not None:
        from ._readonly import ReadOnlyTensor
        ForkingPickler.register(torch.Tensor, reduce_tensor)
        # Pickled by its exact type: without this, its __reduce_ex__
        # (torch.save's copy).
        ForkingPickler.register(ReadOnlyTensor, reduce_tensor)
    if torch_parameter is not None:
        ForkingPickler.register(torch.nn.Parameter, reduce_parameter)
    if torch_storage is not None:
        ForkingPickler.register(torch.UntypedStorage, reduce_storage)


def _wrap_storage_methods():
    # Tensor.share_memory_ and is_shared, and TypedStorage's, end here (on
    # torch 1.13 and 2.x alike).
    cls = torch.UntypedStorage
    torch_share = cls.share_memory_
    torch_is_shared = cls.is_shared

    def share_memory_(self, *args, **kwargs):
        if _storage_in_pool(self):
            return self  # Shared already: nothing moves.
        return torch_share(self, *args, **kwargs)

    def is_shared(self):
        return _storage_in_pool(self) or torch_is_shared(self)

    share_memory_.__doc__ = torch_share.__doc__
    is_shared.__doc__ = torch_is_shared.__doc__
    cls.share_memory_ = share_memory_
    cls.is_shared = is_shared
