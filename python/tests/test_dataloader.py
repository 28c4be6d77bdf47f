"""shmtensor.torch.DataLoader against torch's own, with real worker
processes (fork and spawn), a real daemon, SIGKILLed workers and loops that
stop early; docs/pitfalls.md P2, P8 and P17."""

import collections
import gc
import multiprocessing as mp
import os
import signal
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader, Dataset

import shmtensor
import shmtensor.torch as st
from conftest import Daemon, used, wait_until

Pair = collections.namedtuple("Pair", "index weight")


class Mixed(Dataset):
    """Every kind of sample default_collate handles."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": torch.full((3, 8, 8), float(i)) + torch.arange(8.0),
            "mask": torch.arange(6) % (i + 2) == 0,
            "array": np.arange(5, dtype=np.int16) * i,
            "label": i,
            "score": i / 3,
            "flag": i % 2 == 0,
            "name": f"sample-{i}",
            "pair": Pair(i, np.float32(i) / 2),
            "nested": [torch.tensor([i, -i]), (np.int64(i), "x")],
        }


class Arrays(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return np.random.default_rng(i).standard_normal((4, 5)).astype(
            np.float32)


def assert_same(a, b, where="batch"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
        return
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def both(dataset, daemon, **kwargs):
    """Batches of torch's loader and of ours, same arguments and seed."""
    ours_kwargs = dict(kwargs)
    theirs = list(TorchLoader(dataset, generator=torch.Generator().manual_seed(7),
                              **kwargs))
    ours = list(st.DataLoader(dataset,
                              generator=torch.Generator().manual_seed(7),
                              shmtensor_address=daemon.address, **ours_kwargs))
    return theirs, ours


# Sessions left once workers are gone: the test's client and the one client
# the training process keeps for taking batches ("sessions == 2" below).


def in_pool(ptr):
    """True when address `ptr` lies in this process's mapping of a
    shmtensord pool: zero-copy from the pool, not a private copy. A pool is
    a memfd ("/memfd:shmtensor:<pool> (deleted)" in /proc/self/maps) or an
    unnamed file of a pool directory ("<dir>/#<inode> (deleted)")."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi:
                return len(fields) >= 6 and (
                    fields[5].startswith("/memfd:shmtensor:") or
                    "/#" in fields[5])
    return False


def pooled_ptrs(batch):
    """Data pointers of a batch's tensors."""
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x.data_ptr())
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(batch)
    return out


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_same_batches_as_torch_for_every_kind_of_sample(daemon, context):
    theirs, ours = both(Mixed(), daemon, batch_size=4, shuffle=True,
                        num_workers=2, multiprocessing_context=context)
    assert len(theirs) == len(ours) == 10
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")
    # Ordinary writable tensors, every one in pool memory.
    image = ours[0]["image"]
    image += 1  # Writable: the batch is the training process's.
    assert all(in_pool(p) for b in ours for p in pooled_ptrs(b))
    c = shmtensor.connect(daemon.address)
    del ours, image, a, b
    assert wait_until(lambda: used(c) == 0, 2.0), c.stats()


class OneTensor(Dataset):
    """Samples that are one tensor each, of `dtype`: batches that are one
    stack, the DataLoader's short way (handed over typed)."""

    def __init__(self, dtype, n=10):
        self.dtype, self.n = dtype, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t = torch.arange(i * 15, i * 15 + 15).reshape(3, 5) % 7
        if self.dtype.is_complex:
            return (t + 1j * t).to(self.dtype)
        return (t > 2) if self.dtype == torch.bool else t.to(self.dtype)


@pytest.mark.parametrize("dtype", [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, torch.complex32])
def test_a_batch_of_one_tensor_keeps_its_dtype(daemon, dtype):
    """A batch that is one stack is filled and adopted as a tensor of its
    own dtype (bools travel as uint8 through DLPack and must come back
    bool; complex32, which shmtensor's table lacks, as bytes), equal to
    torch's byte for byte, contiguous, not requiring grad, writable and in
    pool memory."""
    theirs, ours = both(OneTensor(dtype), daemon, batch_size=4,
                        num_workers=2)
    assert len(theirs) == len(ours) == 3
    for i, (a, b) in enumerate(zip(theirs, ours)):
        where = f"batch {i}"
        assert type(b) is torch.Tensor and b.dtype == a.dtype == dtype, where
        assert b.shape == a.shape and b.stride() == a.stride(), where
        assert b.is_contiguous() and not b.requires_grad, where
        # Bytes: torch.equal has no complex32 on the CPU.
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), where
        assert in_pool(b.data_ptr()), where
    ours[0][0, 0] = ours[0][0, 1]  # Writable.
    c = shmtensor.connect(daemon.address)
    del ours, a, b
    assert wait_until(lambda: used(c) == 0, 2.0), c.stats()


def test_numpy_samples_and_drop_last_match(daemon):
    theirs, ours = both(Arrays(), daemon, batch_size=3, shuffle=True,
                        drop_last=True, num_workers=2)
    assert len(ours) == 6
    for a, b in zip(theirs, ours):
        assert_same(a, b)


def _init_worker(worker_id):
    torch.manual_seed(1000 + worker_id)


class RandomPerWorker(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.rand(4) + i  # Depends on each worker's seed.


def test_loader_options_work(daemon):
    opts = dict(batch_size=4, shuffle=True, num_workers=2, prefetch_factor=3,
                persistent_workers=True, timeout=30, pin_memory=True,
                worker_init_fn=_init_worker)
    # Without CUDA nothing is pinned (torch 2.x warns so, for both).
    theirs = TorchLoader(RandomPerWorker(),
                         generator=torch.Generator().manual_seed(5), **opts)
    ours = st.DataLoader(RandomPerWorker(),
                         generator=torch.Generator().manual_seed(5),
                         shmtensor_address=daemon.address, **opts)
    for _epoch in range(2):  # Persistent workers: two epochs.
        with warnings.catch_warnings(record=True) as theirs_warned:
            warnings.simplefilter("always")
            a_batches = list(theirs)
        with warnings.catch_warnings(record=True) as ours_warned:
            warnings.simplefilter("always")
            b_batches = list(ours)
        assert ([str(w.message) for w in ours_warned] ==
                [str(w.message) for w in theirs_warned])
        assert len(a_batches) == len(b_batches) == 6
        for a, b in zip(a_batches, b_batches):
            assert_same(a, b)


def _custom_collate(samples):
    return {"stacked": torch.stack(samples) * 2,
            "raw": np.stack([s.numpy() for s in samples]),
            "count": len(samples)}


def test_custom_collate_output_moves_into_the_pool(daemon):
    theirs, ours = both(RandomPerWorker(), daemon, batch_size=6,
                        num_workers=2, collate_fn=_custom_collate,
                        worker_init_fn=_init_worker)
    for a, b in zip(theirs, ours):
        assert torch.equal(a["stacked"], b["stacked"])
        np.testing.assert_array_equal(a["raw"], b["raw"])  # Passed through.
        assert b["count"] == 6
    assert all(in_pool(b["stacked"].data_ptr()) for b in ours)


class KillsAWorker(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 40:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((1024,), float(i))


def _error_of(loader):
    """The error iterating `loader` raises, as text and type (the traceback,
    which keeps the iterator and its workers alive, is dropped). torch's
    SIGCHLD handler may raise its RuntimeError while the first error is being
    handled (seen once in torch's own loader): that one is the error then."""
    try:
        try:
            list(loader)
        except Exception as e:  # noqa: BLE001
            return type(e), str(e)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None, ""


def test_killed_worker_raises_like_torch_and_leaks_nothing(daemon):
    theirs = _error_of(TorchLoader(KillsAWorker(), batch_size=4, num_workers=2))
    ours = _error_of(st.DataLoader(KillsAWorker(), batch_size=4, num_workers=2,
                                   shmtensor_address=daemon.address))
    # torch's own loader raises RuntimeError naming the worker, or now and
    # then a ConnectionError (reset, refused): a batch of the dead worker
    # still queued is unpickled by fetching its file descriptor from that
    # worker's process. Ours hands over refs, not descriptors, and always
    # raises the RuntimeError.
    assert theirs[0] is RuntimeError or issubclass(theirs[0],
                                                   ConnectionError), theirs
    if theirs[0] is RuntimeError:
        assert "DataLoader worker" in theirs[1], theirs
    assert ours[0] is RuntimeError and "DataLoader worker" in ours[1], ours
    gc.collect()
    c = shmtensor.connect(daemon.address)
    assert wait_until(lambda: used(c) == 0 and c.stats()["sessions"] == 2,
                      5.0), c.stats()


class Big(Dataset):
    def __init__(self, n=40, elems=64 * 1024):
        self.n, self.elems = n, elems

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.elems,), float(i))


@pytest.mark.parametrize("persistent", [False, True])
def test_breaking_out_early_leaks_nothing(daemon, persistent):
    loader = st.DataLoader(Big(), batch_size=2, num_workers=2,
                           prefetch_factor=4, persistent_workers=persistent,
                           shmtensor_address=daemon.address)
    c = shmtensor.connect(daemon.address)
    for epoch in range(3):
        for i, batch in enumerate(loader):
            if i == 2:
                break
        del batch
        # The two workers' rings, and at most the batches that went through
        # the pool on their own for the abandoned epoch; nothing accumulates
        # from epoch to epoch. (Polled: the dropped batch's release reaches
        # the daemon a moment later. That ring slots are not lost either is
        # test_persistent_workers_get_back_the_slots_an_abandoned_epoch_left.)
        assert wait_until(lambda: c.stats()["objects"] <= 2 * 4, 2.0), (
            epoch, c.stats())
    del loader
    assert wait_until(lambda: used(c) == 0 and c.stats()["sessions"] == 2,
                      5.0), c.stats()


def test_interrupted_loop_leaks_nothing(daemon):
    loader = st.DataLoader(Big(), batch_size=2, num_workers=2,
                           shmtensor_address=daemon.address)
    with pytest.raises(KeyboardInterrupt):
        for i, batch in enumerate(loader):
            if i == 3:
                raise KeyboardInterrupt
    del batch  # The batch in hand stays valid until dropped (P2).
    c = shmtensor.connect(daemon.address)
    assert wait_until(lambda: used(c) == 0 and c.stats()["sessions"] == 2,
                      5.0), c.stats()


def _exhaustion_message(pool, dataset):
    """What PoolExhaustedError says to a loop that keeps every 2-sample
    batch of `dataset` (2 workers) from a daemon with a pool of `pool`."""
    d = Daemon(pool)
    try:
        loader = st.DataLoader(dataset, batch_size=2, num_workers=2,
                               shmtensor_address=d.address, pool_timeout=0.5)
        with pytest.raises(shmtensor.PoolExhaustedError) as e:
            list(loader)
        msg = str(e.value)
        del e  # Its frames hold the batches.
        return msg
    finally:
        d.kill()


@pytest.mark.parametrize("pool", ["1MiB", "5MiB"])
def test_pool_too_small_says_how_large_it_should_be(pool):
    # 1 MiB: a 2 MiB batch never fits. 5 MiB: two fit, but not the batches
    # in flight while the loop holds every batch it got.
    msg = _exhaustion_message(pool, Big(elems=256 * 1024))
    assert "A batch needs 2097152 bytes" in msg, msg
    assert "--pool-size 12MiB" in msg, msg  # 2 MiB x (4 in flight + 2).


def test_pool_large_enough_says_the_loop_keeps_too_many_batches():
    # 40 MiB: the two workers' rings (4 slots of 2 MiB each, and the slot
    # headers) take 16 MiB, the rest holds 12 batches more; a loop that
    # keeps all 40 runs out, and the message counts the rings and blames the
    # batches kept.
    msg = _exhaustion_message("40MiB", Big(n=80, elems=256 * 1024))
    # 2 MiB x (4 + 2) and the rings: 4 x 2 MiB + 4 x 64 bytes each.
    assert "2 batch rings of 8388864 bytes" in msg, msg
    assert "at least 29360640 bytes" in msg, msg
    assert "keeps more batches than that alive" in msg, msg
    assert "--pool-size" not in msg, msg


def test_a_kept_batch_survives_100_later_batches_of_recycled_memory():  # P2
    d = Daemon("8MiB")
    try:
        loader = st.DataLoader(Big(n=220, elems=32 * 1024), batch_size=2,
                               num_workers=2, shmtensor_address=d.address)
        it = iter(loader)
        kept = next(it)
        expected = kept.clone()
        kept_ptr = kept.data_ptr()
        seen = collections.Counter()
        for _ in range(100):
            b = next(it)
            b.fill_(-1.0)  # The training step scribbles on its batch.
            seen[b.data_ptr()] += 1
            del b
        assert torch.equal(kept, expected)
        assert kept_ptr not in seen  # Never handed out while kept alive...
        assert max(seen.values()) > 1  # ...while the pool was recycled.
        del it, loader
    finally:
        d.kill()


class Cached(Dataset):
    """n samples of `elems` float32s, one tensor made once per process: a
    sample costs no new memory, so every page fault counted below is the
    batches' own."""

    def __init__(self, n, elems):
        self.n, self.elems, self._t = n, elems, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._t is None:
            self._t = torch.zeros(self.elems)
        return self._t


def _minor_faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _faults_over(loader, batches, settle):
    """Minor page faults the training process and the workers took while
    `batches` batches came in and every page of each was read, after a
    warm-up of 4 batches (settle: until 8 in a row took none, at most 200)."""
    it = iter(loader)
    pids = [os.getpid()] + [w.pid for w in it._workers]

    def faults():
        return sum(_minor_faults(p) for p in pids)

    def touch(batch):
        return float(batch.reshape(-1)[::1024].sum())  # A float per page.

    warm = quiet = 0
    while warm < 4 or (settle and quiet < 8 and warm < 200):
        before = faults()
        touch(next(it))
        warm += 1
        quiet = quiet + 1 if faults() == before else 0
    before = faults()
    for _ in range(batches):
        touch(next(it))
    took = faults() - before
    del it
    return took


# [P8] 1 MiB batches: 256 pages each.
P8_BATCHES, P8_PAGES = 20, 256


def test_p8_trap_torch_batches_fault_in_a_fresh_segment_each():
    loader = TorchLoader(Cached(1000, 128 * 1024), batch_size=2,
                         num_workers=2)
    took = _faults_over(loader, P8_BATCHES, settle=False)
    # Every batch is a new segment, faulted in page by page: a worker's
    # writes fault on each page (the training process's reads fewer, the
    # kernel maps up to 16 cached pages a read fault). Measured: ~5,400.
    assert took >= P8_BATCHES * P8_PAGES // 2, took


def test_p8_pool_batches_take_no_page_faults_once_warm(daemon):
    loader = st.DataLoader(Cached(1000, 128 * 1024), batch_size=2,
                           num_workers=2, shmtensor_address=daemon.address)
    took = _faults_over(loader, P8_BATCHES, settle=True)
    # Recycled buffers, mapped and touched already in every process (measured:
    # 3-7, the processes' own small allocations). Slack for one buffer a
    # worker may still touch for the first time: which buffers a worker gets
    # depends on timing (docs/shm_layout.md, placement).
    assert took < P8_PAGES + 64, took


def _producer(address, q, received):
    collate = st.PoolCollate(address)
    for k in range(3):
        q.put(collate([torch.full((2, 3), float(k + j)) for j in range(4)]))
    received.wait(60)  # A hand-off not yet received goes with this session.


def test_without_the_wrapper_collate_fn_and_to_tensors(daemon):
    ctx = mp.get_context("spawn")
    q, received = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_producer, args=(daemon.address, q, received))
    p.start()
    # Each handle is the batch once unpickled here; to_tensors passes a
    # batch through as it is.
    batches = [q.get(timeout=60) for _ in range(3)]
    received.set()
    p.join(60)
    for k, b in enumerate(batches):
        assert type(b) is torch.Tensor and b.shape == (4, 2, 3)
        assert st.to_tensors(b) is b
        assert torch.equal(b[:, 0, 0], torch.arange(4.0) + k)
        assert in_pool(b.data_ptr())
    handle = st.PoolCollate(daemon.address)([torch.ones(2)])
    assert st.to_tensors(handle).sum() == 2
    with pytest.raises(RuntimeError, match="already turned into tensors"):
        st.to_tensors(handle)


def test_huge_page_pool_gives_the_same_batches_aligned(huge_daemon):
    """The configuration the benchmark's figures come from: a pool on a
    tmpfs with 2 MiB pages. Same batches as torch, each batch a whole huge
    page on a huge-page boundary, nothing left in the pool afterwards."""
    c = shmtensor.connect(huge_daemon.address)
    assert c.stats()["pools"][0]["huge_page_size"] == 2 << 20
    # Samples of 512 KiB: a batch of 4 is 2 MiB, one huge page.
    theirs, ours = both(Big(n=24, elems=128 << 10), huge_daemon, batch_size=4,
                        shuffle=True, num_workers=2)
    assert len(ours) == len(theirs) == 6
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")
        assert b.data_ptr() % (2 << 20) == 0, f"batch {i} is not aligned"
        assert in_pool(b.data_ptr()), f"batch {i} is not in the pool"
    del ours, a, b
    gc.collect()
    assert wait_until(lambda: used(c) == 0, timeout=10), used(c)


class Growing(Dataset):
    """Samples that grow after the first eight: later batches outgrow the
    slots of the ring each worker made for its first batch."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.arange(1024 * (1 if i < 8 else 3), dtype=torch.float32) + i


def test_batches_come_through_each_workers_ring_with_no_object_each(daemon):
    loader = st.DataLoader(Big(n=80, elems=16 * 1024), batch_size=2,
                           num_workers=2, shmtensor_address=daemon.address)
    c = shmtensor.connect(daemon.address)
    for i, b in enumerate(loader):
        assert torch.equal(b[:, 0], torch.tensor([2.0 * i, 2.0 * i + 1])), i
        assert in_pool(b.data_ptr()), i
        if i >= 2:  # Both workers have made their ring by now.
            assert c.stats()["objects"] == 2, (i, c.stats())
    del b, loader
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_batches_that_outgrow_the_ring_go_through_the_pool(daemon):
    theirs, ours = both(Growing(), daemon, batch_size=4, num_workers=2)
    assert len(ours) == 6
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")
        assert in_pool(b.data_ptr()), i
    c = shmtensor.connect(daemon.address)
    del ours, a, b
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


# Changing's batches (batch_size 4; index // 4) that differ from the one
# before them in one thing each, after batches alike: a worker stacks
# batches alike into its ring without planning them again, and each change
# must end that. From batch 19 on (index 76) the worker's registry holds a
# function of the user's for tensors.
_CHANGES = {3: "int32", 6: "shape", 9: "short", 12: "strided", 13: "tuple",
            16: "float16"}
_USERS_FROM = 76


def _doubled(batch, *, collate_fn_map=None):
    return torch.stack(batch) * 2


class Changing(Dataset):
    """Samples of batches alike (float32, 3 x 5) but for _CHANGES."""

    def __len__(self):
        return 84

    def __getitem__(self, i):
        change = _CHANGES.get(i // 4)
        t = torch.arange(15, dtype=torch.float32).reshape(3, 5) + i
        if change == "int32":  # Same bytes, another dtype.
            return t.to(torch.int32)
        if change == "shape":  # Same bytes, another shape.
            return t.reshape(5, 3)
        if change == "strided":  # Same dtype and shape, not contiguous:
            return t.reshape(5, 3).t()  # still a batch alike.
        if change == "tuple":  # Another structure: [stack].
            return (t,)
        if change == "float16":  # Fewer bytes: the same slots.
            return t.to(torch.float16)
        if i == _USERS_FROM:
            from torch.utils.data._utils.collate import default_collate_fn_map
            default_collate_fn_map[torch.Tensor] = _doubled
        return t


def test_batches_alike_follow_every_change_of_their_samples(daemon,
                                                            monkeypatch):
    """One worker, so that batches alike follow each other in it, each batch
    dropped before the next: every batch is torch's, whatever changed (dtype,
    shape, strides, structure, the batch's length, the collate registry),
    each comes through the worker's ring (the pool holds no object but it),
    and the batches alike after the first took the short way (no Plan)."""
    from shmtensor.dataloader import batch as batch_module
    sampler = [list(range(k, k + 4)) for k in range(0, 84, 4)]
    sampler[9] = [36, 37, 38]  # One sample short.
    theirs = list(TorchLoader(Changing(), batch_sampler=sampler,
                              num_workers=1, multiprocessing_context="fork"))
    assert len(theirs) == 21
    plans = mp.get_context("fork").Value("i", 0)  # Counted in the worker.
    plan_init = batch_module.Plan.__init__

    def counted(self):
        with plans.get_lock():
            plans.value += 1
        plan_init(self)
    monkeypatch.setattr(batch_module.Plan, "__init__", counted)
    loader = st.DataLoader(Changing(), batch_sampler=sampler, num_workers=1,
                           multiprocessing_context="fork",
                           shmtensor_address=daemon.address)
    c = shmtensor.connect(daemon.address)
    got = 0
    for i, b in enumerate(loader):
        assert_same(theirs[i], b, f"batch {i}")
        assert all(in_pool(p) for p in pooled_ptrs(b)), i
        assert c.stats()["objects"] == 1, (i, c.stats())  # The ring alone.
        got += 1
    assert got == 21
    assert torch.equal(b[0], 2 * Changing()[80])  # The user's function.
    # The short way: batches 1, 2, 5, 8, 11, 12 (strided samples), 15 and
    # 18. Every other batch was planned; from 19 on, torch's collate ran.
    assert plans.value == 21 - 8
    del b, loader
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


class ThenSparse(Dataset):
    """Batches alike (float32, 3 x 5; batch_size 4), then one of sparse
    samples of that dtype and shape: a stack that torch's collate refuses,
    in a way of its own."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        t = torch.arange(15, dtype=torch.float32).reshape(3, 5) + i
        return t.to_sparse() if i >= 12 else t


def _first_error(loader):
    """(batches before it, its type, the last line of its message)."""
    n = 0
    try:
        for _ in loader:
            n += 1
    except Exception as e:  # noqa: BLE001 - compared, not handled.
        return n, type(e), str(e).strip().splitlines()[-1]
    return n, None, None


def test_a_sparse_batch_after_batches_alike_fails_as_torchs(daemon):
    theirs = _first_error(TorchLoader(ThenSparse(), batch_size=4,
                                      num_workers=1))
    ours = _first_error(st.DataLoader(ThenSparse(), batch_size=4,
                                      num_workers=1,
                                      shmtensor_address=daemon.address))
    assert theirs[0] == 3 and theirs[1] is not None, theirs
    assert ours == theirs


def test_a_batch_handed_over_alike_is_taken_once(daemon, monkeypatch):
    """The second batch alike takes the short way (no Plan, the first
    batch's tensor over its slot) and pickles as the form its worker made
    once (the ring, the batch's dtype and shape), its slot and its
    generation; the receiving side takes it once (the form cached): a
    second delivery is a stale handle, which in a DataLoader becomes torch's
    ExceptionWrapper for that batch, never a second tensor over the slot;
    so does a form that does not unpickle. A forked child of the worker
    never takes the short way into the parent's ring."""
    import pickle
    from multiprocessing.reduction import ForkingPickler
    from torch._utils import ExceptionWrapper
    from shmtensor.dataloader import PoolCollate
    from shmtensor.dataloader import batch as batch_module
    from shmtensor.dataloader import handles
    from shmtensor.dataloader.rings import RingCache
    rings = RingCache()
    collate = PoolCollate(daemon.address).with_consumer(rings.token, 2)
    samples = [torch.full((8,), float(k)) for k in range(4)]
    first_handle = collate(samples)
    assert first_handle._form is None  # Planned: its batch has no form.
    first = pickle.loads(ForkingPickler.dumps(first_handle))
    plans = []
    plan_init = batch_module.Plan.__init__
    monkeypatch.setattr(batch_module.Plan, "__init__",
                        lambda self: plans.append(1) or plan_init(self))
    handle = collate(samples)
    assert handle._form is not None and not plans  # The short way.
    sent = bytes(ForkingPickler.dumps(handle))
    assert handle._form in sent
    batch = pickle.loads(sent)
    assert torch.equal(batch, torch.stack(samples)) and torch.equal(first,
                                                                    batch)
    again = pickle.loads(sent)
    assert type(again) is ExceptionWrapper
    assert "stale batch handle" in again.exc_msg
    broken = handles._receive_ring_form(b"not a pickle", 0, 1)
    assert type(broken) is ExceptionWrapper
    batch[0, 0] = -1
    del batch, first
    # The slots are free again: two more batches alike come through the
    # ring, the short way, and the old handle stays stale.
    more = [pickle.loads(ForkingPickler.dumps(collate(samples)))
            for _ in range(2)]
    assert all(torch.equal(m, torch.stack(samples)) for m in more)
    assert not plans
    assert "stale batch handle" in pickle.loads(sent).exc_msg
    # A child forked from a worker with batches alike never writes the
    # parent's ring (its mapping is the parent's memory): its batch goes
    # the whole way, into a ring of its own.
    ring_ref = handle._args[0]
    pid = os.fork()
    if pid == 0:
        try:
            child = collate([torch.full((8,), 9.0)] * 4)
            ok = (not isinstance(child, handles.RingBatch)
                  or child._args[0] != ring_ref) and plans
        except BaseException:  # noqa: BLE001 - the exit status says it.
            ok = False
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert all(torch.equal(m, torch.stack(samples)) for m in more)
    c = shmtensor.connect(daemon.address)
    del more, rings, collate
    gc.collect()
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


RING_POOL_JOB = """
import json, sys
import shmtensor
from shmtensor.dataloader.rings import WorkerRing, pool_of
c = shmtensor.connect(sys.argv[1])
ring = WorkerRing(4).get(c, 4 << 20, 1)  # 16 MiB of slots.
by_name = {p["name"]: p for p in c.stats()["pools"]}
print(json.dumps({"uid": __import__("os").getuid(), "ring": ring is not None,
                  "pool": pool_of(c)["name"],
                  "objects": {n: p["objects"] for n, p in by_name.items()}}))
"""


def test_a_ring_is_sized_by_the_pool_it_lands_in_not_the_first(tmp_path):
    """A worker whose user may only read the daemon's first pool (16 MiB)
    and write its second (256 MiB): its batches, and so its ring, go to the
    second, and the ring is sized against that pool. 16 MiB of slots fit in
    half of 256 MiB, not in half of 16 MiB: a ring sized by the first pool
    would be refused and every batch would cost a daemon call. Needs root
    (the worker runs as uid 4321, setpriv); skipped without."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile
    from conftest import child_env
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    config = tmp_path / "two.toml"
    config.write_text('socket_mode = "0666"\n'
                      '[[pool]]\nname = "small"\nsize = "16MiB"\n'
                      'read_only_users = [4321]\n'
                      '[[pool]]\nname = "big"\nsize = "256MiB"\n'
                      'users = [4321]\n')
    sockets = tempfile.mkdtemp(prefix="shmtensor-ring-")
    os.chmod(sockets, 0o755)  # The worker's user may reach the socket.
    try:
        with Daemon(config=str(config), path=sockets + "/d.sock") as d:
            out = subprocess.run(
                ["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups",
                 sys.executable, "-c", RING_POOL_JOB, d.address],
                env=child_env(HOME="/tmp"), capture_output=True, text=True,
                timeout=60, cwd="/")
            assert out.returncode == 0, out.stderr
            r = json.loads(out.stdout)
            assert r["uid"] == 4321 and r["pool"] == "big", r
            assert r["ring"], r
            assert r["objects"] == {"small": 0, "big": 1}, r
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def test_ring_slot_is_reused_only_after_its_last_tensor_dies(daemon):
    """The ring protocol in one process: a handed slot is adopted once (a
    second adoption is a stale handle), stays taken while any tensor over it
    lives, in this process only (a forked child's copies free nothing), and
    then is the producer's to fill again; unless the process forked while
    it had the slot: then it is retired for good (P18)."""
    from shmtensor import _core
    c = shmtensor.connect(daemon.address)
    size = _core.BatchRing.bytes(1, 4096, 4096)
    buf = c.create_bytes(size, shared_writable=True)
    with pytest.raises(shmtensor.Error, match="never sealed"):
        buf.seal()
    producer = _core.BatchRing.create(buf, 1, 4096, 4096)
    view = c.get(shmtensor.ObjectRef(buf.ref_bytes))
    assert view.writable
    consumer = _core.BatchRing.join(view, 1, 4096, 4096)
    slot = producer.claim()
    assert slot == 0 and producer.claim() == -1
    torch.from_dlpack(producer.target(slot, 4096)).fill_(7)
    gen = producer.generation(slot)
    producer.hand(slot)
    batch = torch.from_dlpack(consumer.adopt(slot, gen, 4096))
    assert int(batch.sum()) == 7 * 4096
    with pytest.raises(shmtensor.Error, match="stale batch handle"):
        consumer.adopt(slot, gen, 4096)
    part = batch[100:200]
    del batch
    assert producer.claim() == -1  # `part` still views the slot.
    assert int(part.sum()) == 700
    del part
    assert producer.claim() == 0  # Free again, for the next batch.
    assert producer.generation(0) == gen + 1
    with pytest.raises(shmtensor.Error, match="stale batch handle"):
        consumer.adopt(0, gen, 4096)  # The old handle.
    # P18: a fork while the slot is adopted. The child's copies free
    # nothing; and since the child may read the batch for as long as it
    # lives, the parent's last tensor retires the slot instead of freeing
    # it: the producer never writes it again.
    gen = producer.generation(0)
    producer.hand(0)
    part = torch.from_dlpack(consumer.adopt(0, gen, 4096))[100:200]
    pid = os.fork()
    if pid == 0:  # The child drops its copy of the tensor, then exits.
        del part
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert producer.claim() == -1  # Not freed by the child.
    assert int(part.sum()) == 700
    del part
    assert producer.claim() == -1  # Retired, not freed.
    del producer, consumer, view, buf
    assert wait_until(lambda: used(c) == 0, 2.0), c.stats()


def test_a_typed_slot_spans_exactly_its_batch_or_is_refused(daemon):
    """A batch that is one tensor is filled and adopted as that tensor (no
    bytes view cut by Python); the description comes from the handle, so a
    dtype and shape that do not span exactly the handle's bytes (larger,
    smaller, negative, overflowing, too many dimensions, a dtype not ours)
    are refused naming them, never a view past the batch; a refused
    adoption leaves the slot handed for the true handle."""
    from shmtensor import _core
    from shmtensor.dataloader import handles
    c = shmtensor.connect(daemon.address)
    buf = c.create_bytes(_core.BatchRing.bytes(2, 4096, 4096),
                         shared_writable=True)
    producer = _core.BatchRing.create(buf, 2, 4096, 4096)
    view = c.get(shmtensor.ObjectRef(buf.ref_bytes))
    consumer = _core.BatchRing.join(view, 2, 4096, 4096)
    slot = producer.claim()
    out = torch.from_dlpack(producer.target(slot, 4096, torch.float32,
                                            (4, 256)))
    assert out.dtype == torch.float32 and out.shape == (4, 256)
    out.copy_(torch.arange(1024, dtype=torch.float32).view(4, 256))
    del out
    # Each a lie that a check less would let through: larger, smaller,
    # negative twice (a product of 4096), a product that wraps to 4096 in 64
    # bits, 65 dimensions spanning 4096.
    lies = [(torch.float32, (4, 257)), (torch.float32, (2, 256)),
            (torch.float32, (-4, -256)), (torch.uint8, (2 ** 62 + 1024, 4)),
            (torch.uint8, (1,) * 64 + (4096,))]
    for dtype, shape in lies:
        with pytest.raises(shmtensor.InvalidArgumentError,
                           match="a batch of 4096 bytes is not a"):
            producer.target(slot, 4096, dtype, shape)
    with pytest.raises(shmtensor.InvalidArgumentError,
                       match="a batch of 0 bytes is not a"):
        producer.target(slot, 0, torch.float32, (0, 2 ** 62, 4))
    with pytest.raises(ValueError, match="nonsense"):
        producer.target(slot, 4096, "nonsense", (4096,))
    with pytest.raises(ValueError, match="do not fit a slot"):
        producer.target(slot, 8192, torch.float32, (2048,))
    gen = producer.generation(slot)
    producer.hand(slot)
    for dtype, shape in lies:
        with pytest.raises(shmtensor.InvalidArgumentError,
                           match="a batch of 4096 bytes is not a"):
            consumer.adopt(slot, gen, 4096, dtype, shape)
    with pytest.raises(shmtensor.Error, match="do not fit a slot"):
        consumer.adopt(slot, gen, 8192, torch.float32, (2048,))
    # A handle whose leaf lies about its shape, through the DataLoader's
    # receiving path: refused the same way, the slot still handed.
    ring_args = (bytes(buf.ref_bytes), 2, 4096, 4096, slot, gen, 4096)
    with pytest.raises(shmtensor.InvalidArgumentError,
                       match=r"float32 tensor of shape \(2048\)"):
        handles._ring_batch(*ring_args,
                            (0, 0, 4096, torch.float32, (2048,), False),
                            daemon.address, None, client=c)
    # A dtype torch lacks (NumPy's uint16) is refused before the slot is
    # adopted, not after.
    with pytest.raises(shmtensor.InvalidArgumentError,
                       match="torch 1.13 has no uint16"):
        consumer.adopt(slot, gen, 4096, "uint16", (2048,))
    batch = handles._ring_batch(*ring_args,
                                (0, 0, 4096, torch.float32, (4, 256), False),
                                daemon.address, None, client=c)
    assert batch.shape == (4, 256) and batch.dtype == torch.float32
    assert torch.equal(batch.reshape(-1),
                       torch.arange(1024, dtype=torch.float32))
    batch[0, 0] = -1  # Writable: the training process's now.
    with pytest.raises(shmtensor.Error, match="stale batch handle"):
        consumer.adopt(slot, gen, 4096, torch.float32, (4, 256))
    with pytest.raises(shmtensor.InvalidArgumentError,
                       match="shape is a sequence of ints, not a NoneType"):
        consumer.adopt(slot, gen, 4096, torch.float32, None)
    # A 0-d batch (a collate_fn's scalar tensor) is a tensor of no
    # dimensions.
    other = producer.claim()
    torch.from_dlpack(producer.target(other, 8, torch.float64, ())).fill_(2.5)
    gen2 = producer.generation(other)
    producer.hand(other)
    scalar = torch.from_dlpack(consumer.adopt(other, gen2, 8, torch.float64,
                                              ()))
    assert scalar.dim() == 0 and float(scalar) == 2.5
    del batch, scalar
    assert producer.claim() >= 0 and producer.claim() >= 0  # Both freed.
    del producer, consumer, view, buf
    assert wait_until(lambda: used(c) == 0, 2.0), c.stats()


def test_persistent_workers_get_back_the_slots_an_abandoned_epoch_left(daemon):
    """Breaking out of an epoch leaves batches handed and never read; with
    persistent workers (whose rings outlive the epoch) their slots come back
    (a dropped handle frees its slot, a new epoch whatever is left), so the
    rings keep carrying every batch instead of filling up with orphans and
    sending batches through the pool one by one."""
    loader = st.DataLoader(Big(n=60, elems=16 * 1024), batch_size=2,
                           num_workers=2, prefetch_factor=2,
                           persistent_workers=True,
                           shmtensor_address=daemon.address)
    c = shmtensor.connect(daemon.address)
    for _epoch in range(4):
        for i, b in enumerate(loader):
            if i == 3:
                break
        del b
    for i, b in enumerate(loader):
        assert torch.equal(b[:, 0], torch.tensor([2.0 * i, 2.0 * i + 1])), i
        assert c.stats()["objects"] == 2, (i, c.stats())  # The two rings.
    del b, loader
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


# -- P17: batch_size=None, early-finishing workers, custom collate results ------

class Samples(Dataset):
    """One kind of sample per index, for batch_size=None: torch converts
    each (NumPy to tensors, tuples to lists) and collates nothing."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        kind = i % 6
        if kind == 0:  # An (input, target) pair of same-shape tensors.
            return torch.full((3,), float(i)), torch.full((3,), -float(i))
        if kind == 1:
            return i
        if kind == 2:
            return {"x": np.arange(4, dtype=np.float32) + i, "id": f"s{i}"}
        if kind == 3:
            return Pair(torch.tensor([i]), i / 2)
        if kind == 4:
            return np.float64(i)
        return [torch.arange(i), "tail"]


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_p17_batch_size_none_gives_torch_samples(daemon, context):
    theirs, ours = both(Samples(), daemon, batch_size=None, num_workers=2,
                        multiprocessing_context=context)
    assert len(theirs) == len(ours) == 12
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"sample {i}")
    assert type(ours[0]) is list and len(ours[0]) == 2  # Not stacked.
    assert in_pool(ours[0][0].data_ptr()) and in_pool(ours[2]["x"].data_ptr())


class Shards(torch.utils.data.IterableDataset):
    """A sharded stream whose shards end at different times: worker 1 has
    one sample, workers 0 and 2 three each, and take a second over their
    first. torch keeps worker 1's batch (out of order: batch 0 is worker
    0's), retires worker 1, whose process exits, and only a second later
    yields that batch: the first of worker 1's ring, which the training
    process has not joined yet. With `big`, the batch is too large for a
    ring (three rings of its slots would take more than half the pool): it
    goes in a pool object of its own."""

    def __init__(self, big=False):
        self.big = big

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info.id == 1:
            yield torch.full(((4 << 20) if self.big else 1024,), 1.0)
            return
        import time
        time.sleep(1.0)
        for k in range(3):
            yield torch.full((1024,), 10.0 * info.id + k)


@pytest.mark.parametrize("big", [False, True], ids=["ring", "pool-object"])
def test_p17_batch_of_a_retired_worker_stays_valid(daemon, big):
    theirs, ours = both(Shards(big), daemon, batch_size=1, num_workers=3)
    assert len(theirs) == len(ours) == 7
    assert float(ours[1][0, 0]) == 1.0  # Worker 1's, kept back by torch.
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")
        assert in_pool(b.data_ptr()), i
    c = shmtensor.connect(daemon.address)
    del ours, a, b
    gc.collect()
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_p17_uneven_shards_with_persistent_workers_every_epoch(daemon):
    """Persistent workers whose shards end at different times: torch keeps
    them (no exit) and starts each epoch again; every epoch has all batches,
    in torch's order."""
    loader_args = dict(batch_size=1, num_workers=3, persistent_workers=True)
    theirs = TorchLoader(Shards(), **loader_args)
    ours = st.DataLoader(Shards(), shmtensor_address=daemon.address,
                         **loader_args)
    for epoch in range(2):
        a_batches, b_batches = list(theirs), list(ours)
        assert len(a_batches) == len(b_batches) == 7, epoch
        for i, (a, b) in enumerate(zip(a_batches, b_batches)):
            assert_same(a, b, f"epoch {epoch} batch {i}")


def test_custom_batch_sampler_of_uneven_batches(daemon):
    sampler = [[0, 3], [1, 2, 5], [4], list(range(6, 20))]
    theirs, ours = both(Mixed(), daemon, batch_sampler=sampler, num_workers=2)
    assert [len(b["label"]) for b in ours] == [2, 3, 1, 14]
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")


def _pack_collate(samples):
    """A collate_fn returning a PackedSequence, whose constructor reads its
    tensors' devices."""
    from torch.nn.utils.rnn import pack_sequence
    seqs = sorted((s[: 1 + int(s[0]) % 5] for s in samples), key=len,
                  reverse=True)
    return pack_sequence(seqs)


class Checked:
    """A collate result that checks its tensors in its constructor."""

    def __init__(self, x, names):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            raise TypeError(f"Checked wants a CPU tensor, got {x!r}")
        self.x, self.names, self.rows = x, names, x.shape[0]

    def __eq__(self, other):
        return (type(other) is Checked and torch.equal(self.x, other.x)
                and self.names == other.names and self.rows == other.rows)


def _checked_collate(samples):
    x = torch.stack(samples)
    return {"checked": Checked(x, [f"n{int(s[0])}" for s in samples]),
            "view": x[:, :2],  # Another tensor over the same memory.
            "same": x}


@pytest.mark.parametrize("collate", [_pack_collate, _checked_collate],
                         ids=["PackedSequence", "own-class"])
def test_p17_custom_collate_results_come_out_as_torch_gives_them(daemon,
                                                                 collate):
    theirs, ours = both(RandomPerWorker(), daemon, batch_size=4,
                        num_workers=2, collate_fn=collate,
                        worker_init_fn=_init_worker)
    assert len(theirs) == len(ours) == 6
    for a, b in zip(theirs, ours):
        assert type(a) is type(b)
        if collate is _pack_collate:
            for field in a._fields:
                x, y = getattr(a, field), getattr(b, field)
                assert (x is None and y is None) or torch.equal(x, y), field
            assert in_pool(b.data.data_ptr())
        else:
            assert a["checked"] == b["checked"]
            assert torch.equal(a["view"], b["view"])
            assert b["same"] is b["checked"].x  # One tensor stays one.
            assert in_pool(b["checked"].x.data_ptr())


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


def _collate_points(batch, *, collate_fn_map=None):
    return torch.tensor([[p.x, p.y] for p in batch])


class Scaled:
    def __init__(self, t):
        self.t = t


def _collate_scaled(batch, *, collate_fn_map=None):
    """Computes on what the registry's tensor entry returns (in place)."""
    from torch.utils.data._utils.collate import collate
    return collate([s.t for s in batch], collate_fn_map=collate_fn_map).div_(2)


class Points(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"p": Point(i, -i), "t": torch.tensor(float(i)),
                "s": Scaled(torch.full((3,), float(i)))}


def test_default_collate_follows_torchs_registry(daemon):
    """default_collate_fn_map, extended as torch documents it, is used by
    ours too (fork: the workers see the change), and a function of the
    user's there computes on real tensors."""
    from torch.utils.data._utils.collate import default_collate_fn_map
    default_collate_fn_map[Point] = _collate_points
    default_collate_fn_map[Scaled] = _collate_scaled
    try:
        theirs, ours = both(Points(), daemon, batch_size=4, num_workers=2,
                            multiprocessing_context="fork")
    finally:
        del default_collate_fn_map[Point], default_collate_fn_map[Scaled]
    for a, b in zip(theirs, ours):
        assert_same(a, b)
    assert torch.equal(ours[1]["s"][0], torch.full((3,), 2.0))  # 4 / 2.
    assert in_pool(ours[0]["p"].data_ptr())
    assert in_pool(ours[0]["s"].data_ptr())


def test_signature_and_defaults_are_the_installed_torchs():
    import inspect
    import typing
    theirs = inspect.signature(TorchLoader).parameters
    ours = inspect.signature(st.DataLoader).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    assert list(ours)[len(theirs):] == ["shmtensor_address", "pool_timeout"]
    alias = st.DataLoader[typing.List[torch.Tensor]]  # Generic, like torch's.
    assert typing.get_origin(alias) is st.DataLoader


def _construct(cls, **kwargs):
    try:
        cls(RandomPerWorker(), batch_size=4, **kwargs)
    except Exception as e:  # noqa: BLE001
        return type(e)
    return None


@pytest.mark.parametrize("kwargs", [
    {}, {"num_workers": 2, "prefetch_factor": None},
    {"prefetch_factor": 3}, {"num_workers": 2, "prefetch_factor": 0}],
    ids=["defaults", "workers-prefetch-None", "prefetch-without-workers",
         "prefetch-0"])
def test_arguments_are_checked_as_torch_checks_them(daemon, kwargs):
    assert (_construct(st.DataLoader, shmtensor_address=daemon.address,
                       **kwargs) == _construct(TorchLoader, **kwargs))


def test_iterator_is_torchs_own(daemon):
    loader = st.DataLoader(RandomPerWorker(), batch_size=4, num_workers=2,
                           shmtensor_address=daemon.address)
    it = iter(loader)
    assert type(it) is type(iter(TorchLoader(RandomPerWorker(), batch_size=4,
                                             num_workers=2)))
    assert len(it) == 6
    next(it)
    assert it._num_yielded == 1
    del it
    # collate_fn stays torch's, for code that reads or rebuilds the loader;
    # without workers the loader is torch's, batches and all.
    assert loader.collate_fn is torch.utils.data.default_collate
    loader.num_workers = 0
    batch = next(iter(loader))
    assert type(batch) is torch.Tensor and batch.shape == (4, 4)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA: torch pins nothing")
def test_pin_memory_pins_on_torchs_thread_and_frees_the_pool(daemon):
    """torch's pin-memory thread receives the batch itself and pins it (the
    overlap torch has); the pool memory is free again once it is pinned,
    though the loop holds every batch."""
    theirs, ours = both(Mixed(), daemon, batch_size=4, num_workers=2,
                        pin_memory=True)
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")
        assert b["image"].is_pinned() and not in_pool(b["image"].data_ptr())
    c = shmtensor.connect(daemon.address)
    assert wait_until(lambda: used(c) == 0, 5.0), c.stats()
