#!/usr/bin/python3
"""Trains a few steps of a small model with shmtensor.torch.DataLoader.

The one-line change from a plain PyTorch loop is the import: batches come
from 2 worker processes through a shmtensord pool instead of a fresh
shared-memory segment per batch. The second half shows the same mechanism
without the wrapper, for a loader loop of your own.

Run (with a daemon: ./deploy/run.sh in another terminal, or the address of
one in SHMTENSOR_ADDRESS):
    PYTHONPATH=build/python /usr/bin/python3 examples/train_dataloader.py
"""

import multiprocessing as mp

import torch
from torch import nn
from torch.utils.data import Dataset

from shmtensor.torch import DataLoader, PoolCollate


class Spirals(Dataset):
    """Two interleaved spirals: points and their class."""

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % 2
        r = torch.rand((), generator=g) * 3 + 0.2
        angle = r * 3 + label * torch.pi
        point = torch.stack([r * torch.cos(angle), r * torch.sin(angle)])
        return {"x": point + 0.05 * torch.randn(2, generator=g), "y": label}


def train(steps=60):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(Spirals(), batch_size=128, shuffle=True,
                        num_workers=2, persistent_workers=True)
    step = 0
    while step < steps:
        for batch in loader:  # batch["x"]: (128, 2) float32 in the pool
            loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 20 == 0:
                print(f"step {step:3d}  loss {loss.item():.3f}")
            step += 1
            if step == steps:
                break
    return loss.item()


def _producer(queue, indices, received):
    """A loader loop of your own: collate with PoolCollate, send the handle.
    A batch not yet received goes with this process's session, so it stays
    until the consumer says it has them all."""
    collate = PoolCollate()
    data = Spirals()
    for chunk in indices:
        queue.put(collate([data[i] for i in chunk]))
    queue.put(None)
    received.wait()


def own_loop():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=4)
    chunks = [range(k, k + 256) for k in range(0, 1024, 256)]
    received = ctx.Event()
    proc = ctx.Process(target=_producer, args=(queue, chunks, received))
    proc.start()
    # Each handle turns into its batch as it is unpickled here: writable
    # tensors over the pool buffer (to_tensors is for a handle that stayed
    # in the process that made it).
    while (batch := queue.get()) is not None:
        print("own loop: batch", tuple(batch["x"].shape),
              "labels", int(batch["y"].sum()), "of", len(batch["y"]))
    received.set()
    proc.join()


if __name__ == "__main__":
    final = train()
    print(f"final loss {final:.3f}")
    own_loop()
