"""shmtensor: zero-copy NumPy arrays and torch tensors out of shmtensord pools.

    import shmtensor, numpy as np
    client = shmtensor.connect()              # $SHMTENSOR_ADDRESS, the default,
                                              # or a daemon of its own
    buf = client.create((64, 1024), "float32")
    np.asarray(buf)[:] = 1.0                  # zero-copy, writable
    ref = buf.seal()                          # immutable from here on
    view = client.get(ref)                    # in any process (refs pickle)
    a = np.asarray(view)                      # zero-copy, read-only (and
                                              # memoryview(view): a View
                                              # exports the buffer protocol)
    t = view.tensor()                         # zero-copy torch tensor

Lifetimes follow Python's: an object stays alive while the ref returned by
seal()/put() lives, while any view of it lives, and while any array or tensor
made from one lives; then its memory goes back to the pool. A pickled ref
holds nothing until get(). Errors are shmtensor.Error subclasses (see
shmtensor.errors). Blocking calls release the GIL.

Timeouts are in seconds; None waits without limit (Ctrl-C still works), 0
does not wait.
"""

import atexit as _atexit
import os as _os

import numpy as _np

from . import errors
from ._core import ObjectRef, default_address
from . import _core
from . import _autostart

from . import _dtypes
from .errors import (AlreadyExistsError, AlreadyTakenError,
                     DaemonUnavailableError, Error, InvalidArgumentError,
                     LargerThanPoolError, LimitExceededError, NotFoundError,
                     PermissionDeniedError, PoolExhaustedError,
                     PreconditionError, StaleReferenceError, TimeoutError)

# At interpreter exit, live clients are kept rather than torn down: gRPC
# finishes a channel's teardown on its own threads, which would race with
# the process's static destructors and could crash the exiting process.
# Their sessions end as the process exits.
_atexit.register(_core._keep_clients_alive_until_exit)

# A client writes its releases and one-way seals (put) from a thread of its
# own, microseconds after the call returned. A multiprocessing child ends
# with os._exit, which runs no atexit hook: its finalizers write what is
# left, so a put just before the child ends is not lost with it.
_flush_hooked_pid = None


def _hook_flush_at_exit():
    global _flush_hooked_pid
    if _flush_hooked_pid == _os.getpid():
        return
    _flush_hooked_pid = _os.getpid()
    from multiprocessing import util
    util.Finalize(None, _core._flush_clients, exitpriority=0)

__version__ = "0.1.0"
__all__ = [
    "connect", "Client", "Buffer", "View", "ObjectRef", "default_address",
    "Error", "InvalidArgumentError", "LargerThanPoolError", "NotFoundError",
    "StaleReferenceError", "AlreadyExistsError", "PreconditionError",
    "AlreadyTakenError", "PermissionDeniedError", "PoolExhaustedError",
    "LimitExceededError",
    "TimeoutError", "DaemonUnavailableError",
]


def connect(address=None, client_name=None, connect_timeout=5.0,
            read_only=False):
    """Connects to shmtensord and opens a session.

    address: "unix:/path" or "host:port"; None means $SHMTENSOR_ADDRESS, else
    the daemon's default address if a daemon answers there, else a private
    daemon started for this process (and its children), which ends when
    this process ends; $SHMTENSOR_AUTOSTART=0 turns that off (see
    shmtensor._autostart). Raises DaemonUnavailableError if no daemon
    answers within connect_timeout seconds. After fork(), call connect()
    again in the child: a client does not cross fork (the child gets its own
    session).

    read_only: a session that may only read. The process receives only
    read-only descriptors of the pools (the kernel refuses any writable
    mapping of them) and create/put raise PermissionDeniedError. A user the
    daemon lets only read a pool (read_only_users, read_only_groups) is
    read-only there whatever this says. A user the daemon lets use no pool
    gets PermissionDeniedError naming its uid.
    """
    resolved = _autostart.resolve(address)
    _hook_flush_at_exit()
    try:
        return Client(resolved, client_name or "", float(connect_timeout),
                      bool(read_only))
    except DaemonUnavailableError as e:
        why = _autostart.why_unavailable(resolved)
        if why is None:
            raise
        raise DaemonUnavailableError(f"{e} ({why})", e.code, e.reason) from e


def _current_stream(device_name):
    """torch's current stream on a CUDA device, as a handle (0: the legacy
    default stream)."""
    torch = _dtypes._torch()
    if torch is None or not device_name.startswith("cuda"):
        return 0
    return torch.cuda.current_stream(torch.device(device_name)).cuda_stream


class Client(_core.Client):
    """A session with shmtensord. Thread-safe. Use shmtensor.connect().

    create(), create_bytes(), get(), delete(), stats() and the properties
    client_id, address, daemon_epoch and has_pool_on() are the native base
    class's (see help(shmtensor.Client.create)); put() is here. The
    session's own id is its secret and is never shown: only this process
    may act for the session, whoever learns it.
    """

    __slots__ = ()

    def __repr__(self):
        return f"<shmtensor.Client {self.client_id} of {self.address}>"

    def put(self, obj, name=None, exclusive=False, timeout=None, device=None):
        """Copies an array or tensor in and seals it; returns the ref.

        Into host memory the copy goes through this process's writable
        mapping of the pool (the range stays open, and faulted in, for the
        next object of its size: nothing points into it) and an unnamed
        object is sealed one way: with the client's stock of buffers (see
        docs/shm_layout.md, "Stock and one-way seals") a put makes no round
        trip to the daemon. The ref is valid at once: a get of it elsewhere
        waits for the seal.

        device: where the object goes. None: a CUDA tensor goes to a CUDA
        pool of its own device when the daemon has one (a device-to-device
        copy, queued on torch's current stream after the work that produced
        the tensor, and finished before the seal), else to the host; anything
        else goes to the host. "cpu" or "cuda:N" choose explicitly (host data
        is copied to the GPU, GPU data to the host).

        Rules: a tensor is detached (no autograd graph is kept); a tensor
        on another device than the CPU and CUDA is copied through the host,
        and a meta tensor (no data) is a TypeError naming the device; bfloat16
        keeps its dtype. Non-contiguous
        data (slices, transposes) is stored C-contiguous: values and shape
        round-trip, strides do not. A big-endian array, or a dtype one side
        lacks, raises InvalidArgumentError saying what to do. Anything else
        NumPy can make an array of (lists, scalars) is stored as that array.
        """
        ptr, shape, code, nbytes, keep, target, stream = self._source(
            obj, device)
        ref = self._put(ptr, shape, code, nbytes, name or "",
                        bool(exclusive), timeout, target, stream)
        del keep
        return ref

    def put_many(self, objs, exclusive=False, timeout=None):
        """put() of every array or tensor in `objs` into host memory, in at
        most one round trip for all (none when the stock has their buffers)
        and one message for their seals; returns their refs, in order. All
        or nothing: on an error no object is left. A CUDA tensor, or a list
        with one, is put one by one (put()'s rules)."""
        sources = [self._source(o, None) for o in objs]
        if any((s[5] or "cpu") != "cpu" for s in sources):
            return [self.put(o, exclusive=exclusive, timeout=timeout)
                    for o in objs]
        keep = [s[4] for s in sources]
        refs = self._put_many([(s[0], s[1], s[2], s[3]) for s in sources],
                              bool(exclusive), timeout)
        del keep
        return refs

    def _source(self, obj, device):
        """(ptr, shape, dtype code, nbytes, keep, target, stream) of what
        put() copies: C-contiguous data at ptr, alive while `keep` is."""
        torch = _dtypes._torch()
        target = None if device is None else _core._device_name(device)
        stream = 0
        if torch is not None and isinstance(obj, torch.Tensor):
            # Nothing of the autograd graph is kept either way; a detach
            # (a new tensor object) only keeps contiguous() from adding to it.
            t = obj.detach() if obj.requires_grad else obj
            # (is_meta and the like: t.device.type makes a string anew on
            # each read.)
            if t.is_meta:
                raise TypeError(
                    f"put of a tensor on device '{t.device}': it has a shape "
                    f"and dtype ({tuple(t.shape)}, {t.dtype}) but no data to "
                    f"copy; materialize it first (e.g. torch.empty_like(t, "
                    f"device='cpu'))")
            if not (t.is_cpu or t.is_cuda):
                t = t.to("cpu")  # Another accelerator's: through the host.
            own = f"cuda:{t.device.index}" if t.is_cuda else None
            if own is not None and target is None:
                target = own if self.has_pool_on(own) else "cpu"
            if own is not None and target == "cpu":
                t = t.to("cpu")
            code = _core._dtype_code(t.dtype)
            if t.is_conj() or t.is_neg():
                t = t.resolve_conj().resolve_neg()
            if not t.is_contiguous():
                t = t.contiguous()
            if own is not None and target == own:
                # The copy is queued after the work that produced t.
                stream = _current_stream(own)
            elif own is not None and target != "cpu":
                # Another device's pool: the copy runs on that device's
                # stream, so t's producer must be done first.
                torch.cuda.current_stream(t.device).synchronize()
            shape, nbytes, ptr, keep = (t.shape,
                                        t.numel() * t.element_size(),
                                        t.data_ptr(), t)
        else:
            keep = _np.asarray(obj)
            source = _core._array_source(keep)
            if source is None:  # (ascontiguousarray makes 0-d 1-d)
                keep = keep.copy(order="C")
                source = _core._array_source(keep)
            ptr, shape, code, nbytes = source
        return ptr, shape, code, nbytes, keep, target, stream




# -- Buffer and View: the native types, with their Python methods ----------

def _dtype_of(obj):
    dt = _dtypes.numpy_dtype(obj.dtype_code)
    if dt is not None:
        return dt
    if obj.dtype_code == 0:
        return _np.dtype(_np.uint8)
    return _dtypes.torch_dtype(obj.dtype_code)


def _to_tensor(obj, read_only):
    import torch
    from . import _torch_sharing
    _torch_sharing.install()
    t = torch.from_dlpack(obj)
    if obj.dtype_code == _dtypes.BOOL:
        t = t.view(torch.bool)  # DLPack carries bools as uint8 for torch.
    if read_only:
        from ._readonly import ReadOnlyTensor
        t = ReadOnlyTensor.wrap(t)
    return t


def _repr_of(obj, writable):
    kind = type(obj).__name__
    try:
        return (f"<shmtensor.{kind} shape={obj.shape} dtype={_dtype_of(obj)}"
                f"{' writable' if writable() else ''}>")
    except Error:
        return f"<shmtensor.{kind} (closed)>"


class Buffer(_core.Buffer):
    """A writable, unsealed object, visible to nobody until sealed (made by
    Client.create and create_bytes; the rest of its methods are the native
    base class's, help(shmtensor._core.Buffer)). As a context manager, an
    unsealed buffer is discarded at the end of the block."""

    __slots__ = ()

    @property
    def dtype(self):
        """The NumPy dtype, or torch.bfloat16 for bfloat16 objects."""
        return _dtype_of(self)

    def numpy(self):
        """numpy.asarray(self): zero-copy, keeps the object alive."""
        return _np.asarray(self)

    def tensor(self):
        """A zero-copy writable torch tensor over the unsealed buffer."""
        return _to_tensor(self, read_only=False)

    def __repr__(self):
        return _repr_of(self, lambda: True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.valid:
            self.discard()
        return False


class View(_core.View):
    """A view of a sealed object (made by Client.get; the rest of its
    methods are the native base class's, help(shmtensor._core.View)). As a
    context manager, closed at the end of the block."""

    __slots__ = ()

    @property
    def dtype(self):
        """The NumPy dtype, or torch.bfloat16 for bfloat16 objects."""
        return _dtype_of(self)

    @property
    def ref(self):
        """The object's ObjectRef (holding nothing)."""
        return ObjectRef(self.ref_bytes)

    def numpy(self):
        """numpy.asarray(self): zero-copy, keeps the object alive."""
        return _np.asarray(self)

    def tensor(self):
        """A zero-copy torch tensor that keeps the object alive while it
        lives.

        For a read-only view this is a ReadOnlyTensor: in-place operations
        on it raise RuntimeError (torch 1.13 has no read-only tensors, and a
        write into the read-only mapping would kill the process). For the
        consumer of an exclusive hand-off, or a view of a shared-writable
        object, it is an ordinary writable tensor. TypeError for
        uint16/32/64, which torch 1.13 lacks (use numpy.asarray)."""
        return _to_tensor(self, read_only=not self.writable)

    def __repr__(self):
        return _repr_of(self, lambda: self.writable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# An alias of ObjectRef, kept so that pickled refs that name
# shmtensor._unpickle_ref load as ObjectRef.
_unpickle_ref = ObjectRef

# create() and get() make these classes' instances.
_core._bind_object_classes(Buffer, View)
