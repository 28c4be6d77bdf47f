"""The drop-in DataLoader: torch's, with its workers' collate_fn wrapped in
a PoolCollate and a ring cache per iterator."""

import inspect
import typing

import torch
import torch.utils.data

from .. import _autostart
from .collate import PoolCollate
from .rings import RingCache

__all__ = ["DataLoader", "PoolBatches"]

_T_co = typing.TypeVar("_T_co", covariant=True)
_TorchLoader = torch.utils.data.DataLoader


class PoolBatches:
    """What the drop-ins add to a loader class of torch's making (torch's
    DataLoader, torchdata's StatefulDataLoader): each iterator's workers
    collate into the pool, with a ring cache per iterator. Mixed in before
    the loader class; its __init__ takes our two keyword-only arguments
    and passes the rest to the loader's."""

    def __init__(self, *args, shmtensor_address=None, pool_timeout=30.0,
                 **kwargs):
        # torch checks and defaults every argument of its own; collate_fn
        # stays what torch made it (for code that reads or replaces it).
        super().__init__(*args, **kwargs)
        self._shmtensor_options = (shmtensor_address, pool_timeout)
        self._shmtensor_pool = None   # (the collate_fn wrapped, PoolCollate)

    def _pool_collate(self, consumer):
        """The PoolCollate over the loader's collate_fn as it stands now,
        for the iterator whose ring cache has the token `consumer`."""
        fn = self.collate_fn
        prefetch = self.prefetch_factor or 2
        if self._shmtensor_pool is None or self._shmtensor_pool[0] is not fn:
            address, timeout = self._shmtensor_options
            # Resolved here (a private daemon started now if need be) and
            # handed to the workers: a forkserver started before would not
            # have $SHMTENSOR_ADDRESS.
            address = _autostart.resolve(address)
            # torch's default_collate: the same, with stacks made in the pool.
            wrapped = None if fn is torch.utils.data.default_collate else fn
            self._shmtensor_pool = (fn, PoolCollate(
                address, wrapped, timeout,
                in_flight=self.num_workers * prefetch))
        # Each worker's ring: its prefetched batches, and two more for its
        # batches the training loop holds (the one in hand, and the last one
        # until the loop variable moves on). A batch that finds every slot
        # taken goes through the pool instead.
        return self._shmtensor_pool[1].with_consumer(consumer, prefetch + 2)

    def _get_iterator(self):
        """The loader's iterator; with workers, one whose workers collate
        into the pool. Every iterator the loader makes comes from here
        (torch's __iter__, and torchdata's state_dict before the first
        __iter__); persistent workers' is kept by the loader, and their
        rings with it. Not to be called from two threads at once (it hands
        the workers' collate_fn to the iterator through the loader's
        attribute)."""
        if self.num_workers == 0:
            return super()._get_iterator()
        rings = RingCache()
        pool = self._pool_collate(rings.token)
        own = self.collate_fn
        self.collate_fn = pool  # What the iterator gives its workers.
        try:
            it = super()._get_iterator()
        finally:
            self.collate_fn = own
        it._shmtensor_rings = rings  # Held while the iterator lives.
        return it


class DataLoader(PoolBatches, _TorchLoader[_T_co]):
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


def _signature_with_ours(loader_class):
    """`loader_class`'s __init__ signature, and our arguments after it."""
    sig = inspect.signature(loader_class.__init__)
    ours = [inspect.Parameter("shmtensor_address",
                              inspect.Parameter.KEYWORD_ONLY, default=None),
            inspect.Parameter("pool_timeout", inspect.Parameter.KEYWORD_ONLY,
                              default=30.0)]
    return sig.replace(parameters=list(sig.parameters.values()) + ours)


def _set_signature(cls, base):
    # Set on a function of the class's own (PoolBatches.__init__ is shared).
    def __init__(self, *args, **kwargs):
        PoolBatches.__init__(self, *args, **kwargs)

    __init__.__signature__ = _signature_with_ours(base)
    __init__.__doc__ = cls.__doc__
    cls.__init__ = __init__


_set_signature(DataLoader, _TorchLoader)
