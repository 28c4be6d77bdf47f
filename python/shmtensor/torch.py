"""shmtensor for torch: the DataLoader drop-in and its collate_fn.

    from shmtensor.torch import DataLoader      # instead of torch.utils.data

The same names as shmtensor.dataloader, where they live (help() there).
"""

from .dataloader import DataLoader, PoolCollate, to_tensors

__all__ = ["DataLoader", "PoolCollate", "to_tensors"]
