"""torch's own sharing, made safe for tensors over pool memory (PITFALLS P19).

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
- ForkingPickler sends such a tensor (``torch.Tensor``, ``Parameter``) or
  storage as a copy of its bytes, in the message itself. The sender's
  storage never moves, so every view of it stays valid; the receiver gets
  an ordinary tensor (in its own memory) with the same values. (Not a
  clone handed to torch's reduction: that sends a descriptor of the
  clone's memory, which with spawn and forkserver children is read only
  when the child starts, after the clone is gone.)

Sending by reference instead (the receiver mapping the same pool bytes
under a lease of its own) needs a hand-over the daemon holds while the
message is in flight; it is not built yet (docs/guide.md).

Thread safety: install() is idempotent and thread-safe.
"""

import threading

import numpy as np
import torch
import torch.multiprocessing  # Registers torch's reductions first.
from multiprocessing.reduction import ForkingPickler

from . import _core

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
        if not _tensor_in_pool(t) or (t.requires_grad and not t.is_leaf):
            return torch_tensor(t)  # Torch's way (and its error for those).
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
        data = _bytes_of(torch.empty(0, dtype=torch.uint8).set_(s))
        return (_rebuild_storage, (data,))

    if torch_tensor is not None:
        ForkingPickler.register(torch.Tensor, reduce_tensor)
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
