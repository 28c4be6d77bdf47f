"""Jobs outlive their daemon (docs/operations.md, "Restarts"): a DataLoader
with worker processes, and clients holding arrays and refs, across daemon
take-overs, with a real daemon each time."""

import numpy as np
import pytest
import torch

import shmtensor
import shmtensor.torch as st
from conftest import Daemon, used, wait_until
from test_dataloader import Mixed, assert_same


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_gives_the_same_batches_across_a_take_over(daemon,
                                                              context):
    def loader():
        return st.DataLoader(Mixed(), batch_size=4, shuffle=True,
                             num_workers=2, multiprocessing_context=context,
                             generator=torch.Generator().manual_seed(7),
                             shmtensor_address=daemon.address)
    plain = list(loader())
    across = []
    for i, batch in enumerate(loader()):
        across.append(batch)
        if i in (2, 6):
            # Workers and the training process keep their sessions: the
            # loader goes on with the next daemon.
            daemon.take_over()
    assert len(plain) == len(across) == 10
    for i, (a, b) in enumerate(zip(plain, across)):
        assert_same(a, b, f"batch {i}")
    c = shmtensor.connect(daemon.address)
    del plain, across, batch, a, b
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_arrays_refs_and_names_survive_take_overs(daemon):
    c = shmtensor.connect(daemon.address)
    x = np.arange(1 << 16, dtype=np.float32)
    ref = c.put(x)
    view = np.asarray(c.get(ref))
    c.put(x * 2, name="doubled")
    epoch = c.daemon_epoch
    for _ in range(3):
        daemon.take_over()
        # The view never changed; the ref and the name resolve to the same
        # bytes; the session was never ended.
        assert np.array_equal(view, x)
        again = c.get(ref)
        assert np.array_equal(np.asarray(again), x)
        assert np.array_equal(np.asarray(c.get("doubled")), x * 2)
    assert shmtensor.connect(daemon.address).daemon_epoch == epoch
    c.delete("doubled")
    del view, again
