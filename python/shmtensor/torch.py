"""shmtensor for torch: the DataLoader drop-ins and their collate_fn.

    from shmtensor.torch import DataLoader      # instead of torch.utils.data
    from shmtensor.torch import StatefulDataLoader  # instead of torchdata's

The same names as shmtensor.dataloader, where they live (help() there).
StatefulDataLoader needs torchdata (PyPI); the others only torch.
"""

from .dataloader import DataLoader, PoolCollate, to_tensors

__all__ = ["DataLoader", "PoolCollate", "StatefulDataLoader", "to_tensors"]


def __getattr__(name):
    # StatefulDataLoader: imported by shmtensor.dataloader on first use
    # (torchdata is optional).
    if name == "StatefulDataLoader":
        from . import dataloader
        return dataloader.StatefulDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
