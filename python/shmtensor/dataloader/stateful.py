"""The drop-in for torchdata's StatefulDataLoader: its loader, iterator,
workers and state, with batches handed over through the pool as by our
DataLoader. Needs torchdata (PyPI: `pip install torchdata`); importing
this module without it raises ImportError saying so."""

import typing

try:
    from torchdata.stateful_dataloader import \
        StatefulDataLoader as _TorchdataLoader
except ImportError as e:  # torchdata is not in Debian's archive.
    raise ImportError(
        "shmtensor's StatefulDataLoader is a drop-in for torchdata's, which "
        f"is not installed here ({e}): pip install torchdata") from e

from .loader import PoolBatches, _set_signature

__all__ = ["StatefulDataLoader"]

_T_co = typing.TypeVar("_T_co", covariant=True)


class StatefulDataLoader(PoolBatches, _TorchdataLoader[_T_co]):
    """torchdata.stateful_dataloader.StatefulDataLoader with batches handed
    over through a shmtensord pool: the installed torchdata's arguments and
    defaults (see inspect.signature), its iterator, its state_dict() and
    load_state_dict() (mid-epoch, with workers: a loader resumed from a
    state gives exactly the batches torchdata's would), plus shmtensor's
    keyword-only `shmtensor_address` and `pool_timeout`, as for
    shmtensor.dataloader.DataLoader, whose rules for pool memory, dying
    workers and num_workers=0 hold here too. A state holds no pool memory
    and no reference to it: it is torchdata's (samplers', datasets' and
    workers' states), and loads into either loader. Generic, as
    torchdata's is (StatefulDataLoader[T])."""


_set_signature(StatefulDataLoader, _TorchdataLoader)
