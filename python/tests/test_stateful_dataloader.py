"""shmtensor.torch.StatefulDataLoader against torchdata's own: a loader
saved mid-epoch, with workers, resumes with exactly the batches torchdata's
gives, in pool memory, and a state of either loader loads into the other.
Skipped where torchdata is not installed (it is on PyPI only); torchdata's
own suite runs against ours in deploy/test-pypi.sh."""

import gc

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import shmtensor
import shmtensor.torch as st
from conftest import used, wait_until
from test_dataloader import assert_same, in_pool, pooled_ptrs

try:
    from torchdata.stateful_dataloader import StatefulDataLoader as TheirLoader
except ImportError:
    TheirLoader = None

needs_torchdata = pytest.mark.skipif(
    TheirLoader is None,
    reason="torchdata is not installed (PyPI only; deploy/test-pypi.sh)")


@pytest.mark.skipif(TheirLoader is not None, reason="torchdata is installed")
def test_without_torchdata_it_says_what_to_install():
    with pytest.raises(ImportError, match="pip install torchdata"):
        st.StatefulDataLoader
    import shmtensor.dataloader
    with pytest.raises(ImportError, match="pip install torchdata"):
        shmtensor.dataloader.StatefulDataLoader
    assert st.DataLoader is shmtensor.dataloader.DataLoader  # Unaffected.


class Images(Dataset):
    def __len__(self):
        return 45

    def __getitem__(self, i):
        return {"image": torch.full((3, 16, 16), float(i)),
                "label": i, "array": np.arange(4, dtype=np.int32) * i}


class Counting(IterableDataset):
    """An iterable dataset with a state of its own (torchdata saves it in
    each worker's state): each worker yields its share of 0..n-1."""

    def __init__(self, n=40):
        self.n = n
        self.next = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        step, first = (info.num_workers, info.id) if info else (1, 0)
        while True:
            i = first + self.next * step
            if i >= self.n:
                return
            self.next += 1
            yield torch.full((8, 8), float(i))

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


def _loader(cls, dataset, daemon, **kwargs):
    if cls is st.StatefulDataLoader:
        kwargs["shmtensor_address"] = daemon.address
    return cls(dataset, **kwargs)


def _run(cls, dataset, daemon, stop_after, **kwargs):
    """Batches before the save, the state, the rest of that epoch, and the
    batches of a fresh loader of the same kind resumed from the state."""
    loader = _loader(cls, dataset, daemon, **kwargs)
    it = iter(loader)
    before = [next(it) for _ in range(stop_after)]
    state = loader.state_dict()
    rest = list(it)
    resumed = _loader(cls, dataset, daemon, **kwargs)
    resumed.load_state_dict(state)
    return before, state, rest, list(resumed)


CASES = [
    pytest.param(Images, dict(batch_size=4, shuffle=True, num_workers=0),
                 id="map-no-workers"),
    pytest.param(Images, dict(batch_size=4, shuffle=True, num_workers=2),
                 id="map-2-workers"),
    pytest.param(Images, dict(batch_size=4, shuffle=True, num_workers=3,
                              persistent_workers=True,
                              multiprocessing_context="spawn"),
                 id="map-3-persistent-spawn"),
    pytest.param(Counting, dict(batch_size=3, num_workers=2),
                 id="iterable-2-workers"),
]


@needs_torchdata
@pytest.mark.parametrize("dataset_class,kwargs", CASES)
def test_resumed_mid_epoch_gives_torchdatas_batches(daemon, dataset_class,
                                                    kwargs):
    def go(cls):
        torch.manual_seed(11)  # The sampler's seed, drawn at iter().
        return _run(cls, dataset_class(), daemon, stop_after=5, **kwargs)

    t_before, _, t_rest, t_resumed = go(TheirLoader)
    o_before, o_state, o_rest, o_resumed = go(st.StatefulDataLoader)
    assert len(t_resumed) > 0
    assert_same(o_before, t_before, "before the save")
    assert_same(o_rest, t_rest, "the rest of the saved epoch")
    assert_same(o_resumed, t_resumed, "resumed")
    if kwargs["num_workers"]:
        # Zero-copy: every tensor of every batch lies in the pool.
        for batch in o_before + o_rest + o_resumed:
            assert all(in_pool(p) for p in pooled_ptrs(batch))
    # Our state loads into torchdata's loader, and gives its batches.
    theirs = TheirLoader(dataset_class(), **kwargs)
    theirs.load_state_dict(o_state)
    assert_same(list(theirs), t_resumed, "ours loaded into torchdata's")


@needs_torchdata
def test_state_before_the_first_iteration_and_nothing_left_after(daemon):
    # state_dict() before iter() starts the workers (torchdata makes the
    # iterator to ask them): their batches must come through the pool too.
    loader = st.StatefulDataLoader(Images(), batch_size=5, num_workers=2,
                                   shmtensor_address=daemon.address)
    state = loader.state_dict()
    batches = list(loader)
    assert len(batches) == 9
    assert all(in_pool(p) for b in batches for p in pooled_ptrs(b))
    again = st.StatefulDataLoader(Images(), batch_size=5, num_workers=2,
                                  shmtensor_address=daemon.address)
    again.load_state_dict(state)
    assert_same(list(again), batches)
    client = shmtensor.connect(daemon.address)
    del loader, again, batches
    gc.collect()
    assert wait_until(lambda: used(client) == 0, 10.0), client.stats()


@needs_torchdata
def test_signature_is_torchdatas_plus_ours():
    import inspect
    theirs = inspect.signature(TheirLoader.__init__).parameters
    ours = inspect.signature(st.StatefulDataLoader.__init__).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    assert list(ours)[len(theirs):] == ["shmtensor_address", "pool_timeout"]
    assert issubclass(st.StatefulDataLoader, TheirLoader)
    # Generic, as torchdata's is (annotations say StatefulDataLoader[T]).
    assert st.StatefulDataLoader[list] is not None
    assert TheirLoader[list] is not None
