"""Read-only torch tensors over sealed shmtensor objects.

torch 1.13 has no read-only tensors, and a write into a read-only mapping
kills the process (SIGSEGV). So view.tensor() of a shared (read-only) object
returns a ReadOnlyTensor: a torch.Tensor subclass whose __torch_function__
refuses every in-place operation on it (``add_``, ``copy_``, ``t[i] = x``,
``out=t``, ...) with a RuntimeError, before any byte is touched. Results that
share its memory (slices, views, transposes, ``.numpy()``) stay read-only;
results in new memory (``t + 1``, ``t.clone()``) are ordinary tensors, and
so is what loads from a saved or pickled one (a copy: torch.load's
weights_only default accepts it).

Out of its reach: torch.from_dlpack(view) gives a plain tensor (write to it
and the process faults), as do tricks like ``t.as_subclass(torch.Tensor)``.
"""

import numpy as np
import torch

_INPLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
    "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
})
# Named like in-place ops but change no element.
_HARMLESS = frozenset({"requires_grad_", "retain_grad", "detach_",
                       "share_memory_"})


def _writes(name):
    if name in _INPLACE_DUNDERS:
        return True
    return (name.endswith("_") and not name.startswith("_")
            and name not in _HARMLESS)


if hasattr(torch.Tensor, "untyped_storage"):  # torch >= 2.0
    def _storage_ptr(t):
        return t.untyped_storage().data_ptr()
else:  # torch 1.13, whose storage() is not deprecated.
    def _storage_ptr(t):
        return t.storage().data_ptr()


class ReadOnlyTensor(torch.Tensor):
    """A tensor over memory nobody may write. See the module docstring."""

    @staticmethod
    def wrap(t):
        return torch.Tensor._make_subclass(ReadOnlyTensor, t, False)

    def __reduce_ex__(self, protocol):
        # Saved (torch.save, pickle) as the plain tensor it is: what is
        # loaded is a copy in new memory, which nothing keeps read-only, and
        # which torch.load's weights_only unpickler accepts.
        with torch._C.DisableTorchFunction():
            plain = torch.Tensor.as_subclass(self, torch.Tensor)
        return plain.__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        # Everything below runs on plain tensors: no recursion into here.
        with torch._C.DisableTorchFunction():
            # An empty tensor's storage is at 0: it guards nothing.
            guarded = {_storage_ptr(a) for a in _tensors(args, kwargs)
                       if isinstance(a, ReadOnlyTensor)} - {0}
            target = kwargs.get("out")
            if target is None and _writes(name) and args:
                target = args[0]
            for t in _flatten(target):
                if isinstance(t, torch.Tensor) and _storage_ptr(t) in guarded:
                    raise RuntimeError(
                        f"{name}: this tensor is a read-only view of a sealed "
                        f"shmtensor object; write to a copy (.clone()) "
                        f"instead")
            ret = func(*args, **kwargs)
            return _rewrap(ret, guarded)


def _flatten(x):
    if isinstance(x, (tuple, list)):
        for item in x:
            yield from _flatten(item)
    elif x is not None:
        yield x


def _tensors(args, kwargs):
    for a in _flatten(list(args) + list(kwargs.values())):
        if isinstance(a, torch.Tensor):
            yield a


def _rewrap(ret, guarded):
    if isinstance(ret, ReadOnlyTensor):
        return ret  # The tensor itself (share_memory_ returns self).
    if isinstance(ret, torch.Tensor):
        if ret.device.type == "cpu" and _storage_ptr(ret) in guarded:
            return ReadOnlyTensor.wrap(ret)
        return ret
    if isinstance(ret, np.ndarray):
        # .numpy() of a read-only tensor: the array is read-only too.
        ret.flags.writeable = False
        return ret
    if isinstance(ret, tuple):
        return tuple(_rewrap(r, guarded) for r in ret)
    if isinstance(ret, list):
        return [_rewrap(r, guarded) for r in ret]
    return ret
