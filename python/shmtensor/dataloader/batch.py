"""A batch as one run of pool bytes and its structure as a pickle.

The producing side (a DataLoader worker) plans each tensor of a batch into
one buffer, every leaf at a 64-byte aligned offset, and pickles the batch
with each planned tensor replaced by a persistent id that names its leaf
(`Plan` and `pack`; a batch that is one tensor is just that id, no
pickle); then it gets the buffer (a batch ring slot or a pool object) and
runs the fills (`fill`). The consuming side unpickles the structure with
each persistent id resolved to a tensor cut from that buffer (`unpack`).

Pickle, not a walk over containers we know, rebuilds the batch: whatever
torch's DataLoader can return (a PackedSequence, a dataclass, a class of the
user's whose constructor checks its tensors) is rebuilt the way pickle
rebuilds it, around real tensors, in the consuming process. What is not a
pooled tensor is pickled as torch's worker queue pickles it (ForkingPickler,
with torch's reductions: tensors of other devices, sparse, quantized or
subclassed tensors go torch's own way).

Which tensors go into the pool: CPU, strided (dense) tensors of exactly type
torch.Tensor, except non-leaf tensors that require grad (pickling those is an
error in torch, and stays one). Each comes back contiguous, with its dtype,
shape and requires_grad; two references to one tensor come back as one.

Thread safety: a Plan belongs to one batch on one thread; the functions
are thread-safe.
"""

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import torch
# The generic collate of torch >= 1.13 (public as the function default_collate
# is made of; its registry is documented for extending default_collate).
from torch.utils.data._utils import collate as _torch_collate

from .. import _dtypes, _torch_sharing

# Offsets of leaves in the buffer are multiples of this (a cache line, and a
# multiple of every dtype's element size).
ALIGN = 64


def _poolable(t):
    return (type(t) is torch.Tensor and t.is_cpu
            and t.layout == torch.strided and not t.is_quantized
            and not getattr(t, "is_nested", False))


def stackable(elem):
    """Whether a stack of tensors like `elem` is made in the pool (else
    torch's collate_tensor_fn makes it, with torch's errors: a stack with
    out= of tensors that require grad raises in a worker)."""
    return _poolable(elem) and not elem.requires_grad


def _stack_fill(batch):
    """A plan's fill that stacks `batch` into the leaf, as torch's
    collate_tensor_fn stacks it into shared memory."""
    def fill(out):
        torch.stack(batch, 0, out=out)
    return fill


def torch_registry_only():
    """Whether torch's collate registry holds torch's functions alone
    (judged again only when its functions change: by identity, the ids of
    functions the cache keeps alive)."""
    global _registry_seen
    fns = tuple(_torch_collate.default_collate_fn_map.values())
    ids = tuple(map(id, fns))
    _, seen, torch_only = _registry_seen
    if ids != seen:
        torch_only = all(
            getattr(fn, "__module__", None) == _torch_collate.__name__
            for fn in fns)
        _registry_seen = (fns, ids, torch_only)
    return torch_only


# (the registry's functions, their ids, torch_registry_only of them)
_registry_seen = ((), (), True)


# The torch dtypes the binding hands over typed (BatchRing.target, adopt):
# those of shmtensor's table. Others that torch has (complex32, float8) go
# as bytes, viewed as their dtype.
_TYPED = frozenset(_dtypes.torch_dtype(row[0]) for row in _dtypes.TABLE
                   if row[0] and row[5])


def _nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * _itemsize(dtype)


_itemsizes = {}  # dtype -> bytes of one element (torch 1.13 has no itemsize)


def _itemsize(dtype):
    size = _itemsizes.get(dtype)
    if size is None:
        size = _itemsizes[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


class Plan:
    """The leaves of one batch: where each lies in the buffer, and how to
    fill it. `size` is the buffer's length in bytes."""

    def __init__(self):
        self.size = 0
        self._fills = []  # (offset, nbytes, dtype, shape, fill(out))
        self._pids = {}   # id(tensor or placeholder) -> persistent id
        self._keep = []   # What those ids belong to, alive while we are.

    def __bool__(self):
        return bool(self._fills)

    def _leaf(self, key, dtype, shape, requires_grad, fill):
        offset = -(-self.size // ALIGN) * ALIGN
        nbytes = _nbytes(dtype, shape)
        self.size = offset + nbytes
        pid = (len(self._fills), offset, nbytes, dtype, shape, requires_grad)
        self._fills.append((offset, nbytes, dtype, shape, fill))
        self._pids[id(key)] = pid
        self._keep.append(key)
        return pid

    def typed_leaf(self):
        """(dtype, shape, fill) when the plan is one leaf that spans the
        whole buffer, of a dtype the binding hands over typed (a batch that
        is one tensor, the common case: filled through a tensor of its
        dtype and shape, no view cut from bytes); else None."""
        if len(self._fills) != 1:
            return None
        offset, nbytes, dtype, shape, fill_leaf = self._fills[0]
        if offset or not nbytes or dtype not in _TYPED:
            return None
        return dtype, shape, fill_leaf

    def stack(self, samples):
        """When default_collate(samples) is one stack of tensors for the
        pool (a batch of same-shaped tensors, the common case), plans that
        stack (made into the buffer by `fill`; torch.stack's own errors come
        from there) and returns its leaf's persistent id, the batch's whole
        payload; None otherwise, for `collate` and `pack`."""
        if not torch_registry_only() or type(samples[0]) is not torch.Tensor:
            return None
        elem = samples[0]
        if not stackable(elem):
            return None
        return self._leaf(samples, elem.dtype,
                          (len(samples),) + tuple(elem.shape), False,
                          _stack_fill(samples))

    def collate(self, samples):
        """default_collate of the installed torch (its own walk, and its
        registry as it stands, default_collate_fn_map changes included) with
        each stack of tensors planned into the pool: the stack comes back as
        a placeholder on the meta device, and is made straight into the
        buffer by `fill`. Only while the registry holds torch's functions
        alone: with one of the user's, torch's collate runs as it is (its
        tensors are copied in). Raises what default_collate raises for the
        same samples (torch.stack's own errors: from `fill`)."""
        registry = _torch_collate.default_collate_fn_map
        if not torch_registry_only():
            # A collate function of the user's may compute on what a stack
            # returns; it gets real tensors (copied in by `pack`), never a
            # placeholder.
            return _torch_collate.collate(samples, collate_fn_map=registry)
        if type(samples[0]) is torch.Tensor:  # What collate() does first.
            return self._stack(samples)
        fn_map = dict(registry)
        fn_map[torch.Tensor] = self._stack
        return _torch_collate.collate(samples, collate_fn_map=fn_map)

    def _stack(self, batch, *, collate_fn_map=None):
        elem = batch[0]
        if not stackable(elem):
            return _torch_collate.collate_tensor_fn(
                batch, collate_fn_map=collate_fn_map)
        shape = (len(batch),) + tuple(elem.shape)
        placeholder = torch.empty(shape, dtype=elem.dtype, device="meta")
        self._leaf(placeholder, elem.dtype, shape, False, _stack_fill(batch))
        return placeholder

    def persistent_id(self, obj):
        """The leaf `obj` is (planned now if it is a tensor for the pool and
        not yet planned), or None: pickle it as torch would."""
        pid = self._pids.get(id(obj))
        if pid is not None or not _poolable(obj):
            return pid
        if obj.requires_grad and not obj.is_leaf:
            return None  # ForkingPickler raises torch's error for it.
        t = obj.detach()

        def fill(out):
            out.copy_(t)
        return self._leaf(obj, t.dtype, tuple(t.shape), obj.requires_grad,
                          fill)


def _reductions():
    """ForkingPickler's dispatch table (copyreg's and torch's reductions),
    made once; again only if a reduction is registered later (what
    ForkingPickler.__init__ would copy for every batch)."""
    global _table, _table_from
    _torch_sharing.install()  # Before the table copies torch's reductions.
    extra = ForkingPickler._extra_reducers
    if _table is None or _table_from != len(extra):
        table = ForkingPickler._copyreg_dispatch_table.copy()
        table.update(extra)
        _table, _table_from = table, len(extra)
    return _table


_table, _table_from = None, 0


class _Packer(pickle.Pickler):
    """Pickles as torch's worker queue does (ForkingPickler's reductions),
    with the pool's tensors as persistent ids."""

    def __init__(self, file, plan):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = _reductions()
        self._plan = plan

    def persistent_id(self, obj):
        if type(obj) is torch.Tensor:  # Exactly: the rest goes torch's way.
            return self._plan.persistent_id(obj)
        return None


def _leaf_tensor(flat, pid):
    """The tensor of leaf `pid` over `flat`."""
    _, offset, nbytes, dtype, shape, requires_grad = pid
    if offset < 0 or nbytes < 0 or offset + nbytes > flat.numel():
        raise pickle.UnpicklingError(
            f"batch leaf at {offset}+{nbytes} outside its {flat.numel()}-byte "
            f"buffer")
    if nbytes:
        t = flat[offset:offset + nbytes].view(dtype).view(shape)
    else:
        t = torch.empty(shape, dtype=dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Unpacker(pickle.Unpickler):
    """Unpickles a packed batch, each persistent id a tensor over `flat`."""

    def __init__(self, payload, flat):
        super().__init__(io.BytesIO(payload))
        self._flat = flat
        self._made = {}  # Leaf index -> its tensor: one met twice is one.

    def persistent_load(self, pid):
        t = self._made.get(pid[0])
        if t is None:
            t = self._made[pid[0]] = _leaf_tensor(self._flat, pid)
        return t


def pack(plan, obj):
    """`obj` pickled with each tensor for the pool planned into `plan` and
    replaced by its leaf's id; for a batch that is one such tensor (the
    common case, and worth no pickle), just that id. Raises what pickling
    `obj` raises."""
    if type(obj) is torch.Tensor:
        pid = plan.persistent_id(obj)
        if pid is not None:
            return pid
    out = io.BytesIO()
    _Packer(out, plan).dump(obj)
    return out.getvalue()


def fill(plan, flat):
    """Runs the plan's fills into `flat` (a uint8 tensor of at least
    plan.size bytes); keeps no reference to it."""
    for offset, nbytes, dtype, shape, fill_leaf in plan._fills:
        if nbytes:
            out = flat[offset:offset + nbytes].view(dtype).view(shape)
        else:
            out = torch.empty(shape, dtype=dtype)
        fill_leaf(out)


def typed_leaf(payload, nbytes):
    """(dtype, shape) when `payload` is one leaf spanning all `nbytes` (> 0)
    of its buffer, of a dtype handed over typed, with nothing else to
    restore (what Plan.typed_leaf planned): the consumer takes the buffer as
    that tensor. Else None: `unpack` it."""
    if type(payload) is not tuple or not nbytes:
        return None
    _, offset, leaf_bytes, dtype, shape, requires_grad = payload
    if (offset or leaf_bytes != nbytes or requires_grad
            or dtype not in _TYPED):
        return None
    return dtype, shape


# The tensor over a DLPack capsule. torch.from_dlpack looks for __dlpack__
# on its argument first, a failed attribute lookup on a capsule that costs
# more than the rest; the function it then calls, where this torch has it.
from_capsule = getattr(torch._C, "_from_dlpack", torch.from_dlpack)


def typed_tensor(capsule, dtype):
    """The tensor of a capsule the binding described as `dtype`
    (BatchRing.target, adopt): a bool one comes as uint8, as every export
    does for torch's DLPack, and is viewed as bool here."""
    t = from_capsule(capsule)
    return t.view(torch.bool) if dtype is torch.bool else t


def unpack(payload, flat):
    """The batch `pack` pickled, each leaf a tensor over `flat` (a uint8
    tensor of the buffer the plan was filled into). Every such tensor keeps
    `flat`'s memory alive."""
    if type(payload) is tuple:
        return _leaf_tensor(flat, payload)
    return _Unpacker(payload, flat).load()
