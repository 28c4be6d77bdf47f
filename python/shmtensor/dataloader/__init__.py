"""shmtensor.dataloader: DataLoader batches handed over by reference
through shmtensord pools.

One-line change for a training job:

    from shmtensor.dataloader import DataLoader  # instead of torch.utils.data
    loader = DataLoader(dataset, batch_size=64, num_workers=4, shuffle=True)
    for batch in loader:                          # same batches, same order
        ...

The arguments, their defaults and the iterator are the installed torch's own
(the loader is torch's, with only its collate_fn wrapped). Each worker
collates its batch straight into pool memory (torch.stack into it: no extra
copy) and sends only a small handle through torch's worker queue; the
training process receives it as the batch itself: ordinary writable torch
tensors over that memory, in the structure torch gives, which is reused when
the last of those tensors (and of any tensor viewing them) dies, never
earlier, whatever becomes of the worker that made it. The memory is a slot
of the worker's batch ring: one shared-writable pool object per worker,
joined once by the training process, so a batch costs no call to the daemon
at all (docs/shm_layout.md, "Batch rings"). A batch that does not fit its
worker's slots (or finds them all in use) goes into a pool buffer of its
own, sealed for exclusive hand-off and taken by the training process.

Without the wrapper, for your own loader loops: `PoolCollate` is a collate_fn
for the producing side; what it returns turns into the batch's tensors where
it is unpickled (or, in the process that made it, through `to_tensors`):

    collate = PoolCollate()                        # in the producer process
    handle = collate([dataset[i] for i in idx])    # picklable, small
    queue.put(handle)
    ...
    batch = queue.get()                            # in the consumer process

(PoolCollate on its own hands each batch over as a pool object of its own;
batch rings need the DataLoader, which knows which process consumes them.)

What goes into the pool: with the default collate_fn (or batch_size=None's
default_convert), torch's own collate runs, each stack of tensors made
straight in the pool; with your `collate_fn`, its result is taken as it is.
Either way every CPU tensor of the result (see batch.py for the exact
rule) lies in the pool, and everything else (NumPy arrays, numbers, strings,
tensors on other devices, your own objects around the tensors) is passed
through the worker queue as torch passes it, so the batch comes out equal to
torch's.

The parts: batch.py (torch's collate ported to plan a batch into one run of
pool bytes, and its structure as a pickle), handles.py (what a worker sends,
and how it turns into the batch), rings.py (batch rings, both sides),
advice.py (the pool-too-small message), collate.py (PoolCollate),
loader.py (DataLoader, and PoolBatches, what a drop-in adds to a loader
class) and stateful.py (StatefulDataLoader, over torchdata's).
`shmtensor.torch` re-exports the public names.
"""

from .collate import PoolCollate
from .handles import PooledBatch, RingBatch, to_tensors
from .loader import DataLoader

__all__ = ["DataLoader", "PoolCollate", "PooledBatch", "RingBatch",
           "StatefulDataLoader", "to_tensors"]


def __getattr__(name):
    # stateful.py needs torchdata (PyPI), imported on first use only.
    if name == "StatefulDataLoader":
        from .stateful import StatefulDataLoader
        return StatefulDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
