"""Memory that reaches another process without a get of its own: inherited
through fork (P18), or moved by torch's own sharing, a torch.multiprocessing
queue, Process arguments or share_memory_() (P19). Each test drops every
reference the sending or forking process had, churns the pool so that any
range let go is written again with other bytes, and then reads what the
other process kept. Each scenario also runs against torch's own memory (or
torch's own DataLoader), which must give the same values."""

import os
import pickle
import signal
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader as TorchLoader, Dataset

import shmtensor
import shmtensor.torch as st

from conftest import spawn_python, used, wait_until
from test_dataloader import in_pool

MiB = 1 << 20


def churn(client, nbytes, value, keep):
    """Fills the pool with objects of `nbytes` holding `value` until it is
    full, keeping them in `keep`: every range freed before now holds
    `value` afterwards."""
    n = nbytes // 4
    while True:
        try:
            keep.append(client.put(np.full(n, value, dtype=np.float32),
                                   timeout=0))
        except (shmtensor.PoolExhaustedError, shmtensor.LargerThanPoolError):
            return


def child_check(check):
    """Forks; the child waits for a byte on a pipe, runs check() and exits 0
    when it returned True (1 when False, 2 when it raised). Returns
    (pid, go): go() lets the child run and returns its exit status."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        code = 2
        try:
            os.read(r, 1)
            code = 0 if check() else 1
        finally:
            os._exit(code)
    os.close(r)

    def go():
        os.write(w, b"x")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    return pid, go


# -- fork -------------------------------------------------------------------

@pytest.mark.parametrize("memory", ["shmtensor", "torch"])
def test_a_forked_child_keeps_what_it_inherited_after_the_parent_drops_it(
        daemon, memory):  # P18
    client = shmtensor.connect(daemon.address)
    if memory == "shmtensor":
        view = client.get(client.put(np.full(MiB // 4, 1.0, np.float32)))
        a, t = np.asarray(view), view.tensor()
        del view
    else:
        t = torch.full((MiB // 4,), 1.0).share_memory_()
        a = t.numpy()
    # The child reads the tensor through NumPy: a torch operation in a child
    # forked after the parent ran a parallel one (torch.full above) hangs
    # in GNU OpenMP where torch has more than one thread (Debian 13's torch
    # 2.6 does), shmtensor or not.
    _, go = child_check(lambda: bool((a == 1.0).all()) and
                        bool((t.numpy() == 1.0).all()))
    del a, t
    keep = []
    churn(client, MiB, 5.0, keep)
    assert go() == 0
    del keep
    assert wait_until(lambda: used(client) == 0, 2.0)


def test_a_child_keeps_its_inherited_views_after_the_parent_exits(
        daemon, tmp_path):  # P18
    client = shmtensor.connect(daemon.address)
    ref = client.put(np.full(MiB // 4, 1.0, np.float32))
    go, result = tmp_path / "go", tmp_path / "result"
    script = f"""
import os, pickle, sys, time, numpy as np, shmtensor
c = shmtensor.connect({daemon.address!r})
a = np.asarray(c.get(pickle.loads(bytes.fromhex(sys.argv[1]))))
if os.fork() == 0:
    while not os.path.exists({str(go)!r}):
        time.sleep(0.01)
    with open({str(result)!r}, "w") as f:
        f.write("ok" if (a == 1.0).all() else "CHANGED")
    os._exit(0)
print("forked", flush=True)
time.sleep(1000)
"""
    p = spawn_python(script, daemon.address, pickle.dumps(ref).hex())
    assert p.stdout.readline().strip() == "forked", p.stderr.read()
    p.kill()  # The parent dies; its session ends.
    p.wait()
    del ref
    assert wait_until(lambda: client.stats()["sessions"] == 1, 5.0)
    keep = []
    churn(client, MiB, 5.0, keep)
    go.write_text("")
    assert wait_until(lambda: result.exists() and result.read_text(), 30.0)
    assert result.read_text() == "ok"
    del keep


class _Tensors(Dataset):
    """Samples cut from the tensor the dataset holds now."""

    def __init__(self, t):
        self.t = t

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.t[i]


@pytest.mark.parametrize("loader", ["shmtensor", "torch"])
@pytest.mark.parametrize("memory", ["shmtensor", "torch"])
def test_persistent_fork_workers_read_the_dataset_tensor_they_inherited(
        daemon, loader, memory):  # P18
    client = shmtensor.connect(daemon.address)

    def tensor(value):
        if memory == "torch":
            return torch.full((8, MiB // 32), value)
        return client.get(client.put(torch.full((8, MiB // 32),
                                                value))).tensor()
    ds = _Tensors(tensor(1.0))
    kwargs = dict(batch_size=4, num_workers=2, persistent_workers=True,
                  multiprocessing_context="fork")
    dl = (st.DataLoader(ds, shmtensor_address=daemon.address, **kwargs)
          if loader == "shmtensor" else TorchLoader(ds, **kwargs))
    first = [b.clone() for b in dl]
    assert all(bool((b == 1.0).all()) for b in first)
    # Between epochs the training process replaces the dataset's tensor;
    # the workers keep the copy of the dataset they were forked with.
    ds.t = tensor(2.0)
    keep = []
    churn(client, 8 * MiB // 4, 5.0, keep)
    churn(client, MiB, 5.0, keep)
    second = [b.clone() for b in dl]
    assert [float(b.min()) for b in second] == [1.0, 1.0]
    assert [float(b.max()) for b in second] == [1.0, 1.0]
    del dl, keep


class _Indexed(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((MiB // 16,), float(i))


@pytest.mark.parametrize("loader", ["shmtensor", "torch"])
def test_a_batch_inherited_by_a_forked_child_keeps_its_bytes(daemon, loader):
    # P18: the training process forks while it holds a batch, drops it and
    # goes on; the worker writes later batches into the memory it let go.
    kwargs = dict(batch_size=4, num_workers=1, multiprocessing_context="fork")
    dl = (st.DataLoader(_Indexed(), shmtensor_address=daemon.address,
                        **kwargs)
          if loader == "shmtensor" else TorchLoader(_Indexed(), **kwargs))
    it = iter(dl)
    batch = next(it)
    a = batch.numpy()
    expected = np.repeat(np.arange(4, dtype=np.float32), MiB // 16)
    assert (a.reshape(-1) == expected).all()
    _, go = child_check(lambda: bool((a.reshape(-1) == expected).all()))
    del a, batch
    rest = [float(b.sum()) for b in it]  # The worker reuses its slots.
    assert len(rest) == 15
    assert go() == 0


def test_an_inherited_unsealed_buffer_never_changes_the_sealed_object(
        daemon):  # P1, P18
    client = shmtensor.connect(daemon.address)
    buf = client.create((MiB // 4,), "float32")
    np.asarray(buf)[:] = 1.0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        a = np.asarray(buf)
        os.read(r, 1)  # The parent sealed it.
        a[:] = 7.0     # Faults: the range is not writable in this child.
        os._exit(0)
    os.close(r)
    ref = buf.seal()
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) in (
        signal.SIGSEGV, signal.SIGBUS), status
    assert (np.asarray(client.get(ref)) == 1.0).all()


def test_a_fork_whose_hold_is_refused_fails_closed(tmp_path, capfd):  # P5
    """The daemon refuses a fork hold (the uid's holds are used up): the
    child never reads bytes a later put wrote. What it inherited faults,
    and a new array of an inherited view raises. On the old code the child
    read the churned pool's 7.0."""
    from conftest import Daemon
    cfg = tmp_path / "d.toml"
    cfg.write_text('[[pool]]\nname = "default"\nsize = "16MiB"\n'
                   '[limits]\nmax_fork_holds_per_uid = 1\n')
    with Daemon(config=str(cfg)) as d:
        client = shmtensor.connect(d.address)
        view = client.get(client.put(np.full(MiB // 4, 1.0, np.float32)))
        a = np.asarray(view)
        # The first fork takes the uid's only hold, and keeps it.
        _, go_held = child_check(lambda: float(a.sum()) == MiB // 4)
        assert client.stats()["fork_holds"] == 1
        capfd.readouterr()
        # Refused: the child reads what it inherited, or makes an array of
        # the view it inherited.
        _, go_read = child_check(lambda: float(a[-1]) == 1.0)
        err = capfd.readouterr().err
        assert "could not pin them for the child" in err, err
        assert "made inaccessible" in err, err

        def export():
            try:
                np.asarray(view)
            except shmtensor.StaleReferenceError as e:
                return "fork whose hold the daemon refused" in str(e)
            return False
        _, go_export = child_check(export)
        # The parent lets go and the pool is written with other bytes.
        del a, view
        keep = []
        churn(client, MiB, 7.0, keep)
        status = go_read()
        assert status in (-signal.SIGSEGV, -signal.SIGBUS), status
        assert go_export() == 0
        assert go_held() == 0
        del keep


def test_a_fork_without_views_asks_the_daemon_nothing(daemon):
    client = shmtensor.connect(daemon.address)
    ref = client.put(np.ones(4))
    del ref
    _, go = child_check(lambda: True)
    assert go() == 0
    assert client.stats()["fork_holds"] == 0
    view = client.get(client.put(np.ones(4)))
    pid, go = child_check(lambda: True)
    assert client.stats()["fork_holds"] == 1  # One for the one fork.
    assert go() == 0
    assert wait_until(lambda: client.stats()["fork_holds"] == 0, 2.0)
    del view


# -- torch's own sharing ----------------------------------------------------

def _receive_sum(q, out):
    t = q.get()
    # Summed through NumPy: a forked child's torch operation may hang in GNU
    # OpenMP (see the first fork test).
    out.put((float(t.numpy().sum()), in_pool(t.data_ptr()), type(t).__name__,
             t.is_shared()))
    time.sleep(0.5)  # Hold it while the sender checks.


def _send_through_queue(daemon, method):
    """Sends a tensor over pool memory through a torch.multiprocessing
    queue, drops every reference but a NumPy array of it, churns the pool;
    returns what the receiver said, whether the sender's tensor stayed
    where it was, and whether the array kept its bytes."""
    client = shmtensor.connect(daemon.address)
    view = client.get(client.put(torch.full((MiB // 4,), 1.0)))
    t = view.tensor()
    a = t.numpy()
    ptr = t.data_ptr()
    del view
    ctx = tmp.get_context(method)
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_receive_sum, args=(q, out))
    p.start()
    q.put(t)
    received = out.get(timeout=60)
    stayed = t.data_ptr() == ptr and t.is_shared()
    del t
    keep = []
    churn(client, MiB, 5.0, keep)
    kept = bool((a == 1.0).all())
    p.join(30)
    assert p.exitcode == 0
    return received, stayed, kept


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_tensor_through_a_torch_queue_keeps_every_view_of_it(
        daemon, method):  # P19: torch moved it, and the array read others'
    (total, _, _, _), stayed, kept = _send_through_queue(daemon, method)
    assert total == MiB // 4
    assert stayed  # The sender's tensor was not moved.
    assert kept


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_tensor_through_a_torch_queue_travels_by_reference(
        daemon, method):  # P19
    (_, by_reference, kind, _), _, _ = _send_through_queue(daemon, method)
    assert by_reference and kind == "ReadOnlyTensor"


def _receive_args(t, out):
    out.put((float(t.sum()), in_pool(t.data_ptr())))


def _send_as_argument(daemon, method):
    client = shmtensor.connect(daemon.address)
    t = client.get(client.put(torch.full((MiB // 4,), 2.0))).tensor()
    a = t.numpy()
    ctx = tmp.get_context(method)
    out = ctx.Queue()
    p = ctx.Process(target=_receive_args, args=(t, out))
    p.start()
    got = out.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    del t
    keep = []
    churn(client, MiB, 5.0, keep)
    return got, bool((a == 2.0).all())


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_tensor_as_a_process_argument_keeps_every_view_of_it(
        daemon, method):  # P19
    (total, _), kept = _send_as_argument(daemon, method)
    assert total == MiB // 2
    assert kept


def test_a_tensor_as_a_process_argument_travels_by_reference(daemon):
    (_, by_reference), _ = _send_as_argument(daemon, "spawn")
    assert by_reference


def _send_and_exit(address, q, done):
    """A sender that puts a tensor over pool memory into `q` and exits at
    once: whatever it held goes with it."""
    client = shmtensor.connect(address)
    q.put(client.get(client.put(torch.full((MiB // 4,), 3.0))).tensor())
    q.close()
    q.join_thread()  # The message is in the pipe.
    done.set()


def test_a_tensor_sent_by_reference_outlives_its_sender(daemon):  # P19
    ctx = tmp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_send_and_exit, args=(daemon.address, q, done))
    p.start()
    assert done.wait(60)
    p.join(30)
    assert p.exitcode == 0
    client = shmtensor.connect(daemon.address)
    # The sender's session ended with it; its offer still pins the object.
    assert wait_until(lambda: client.stats()["sessions"] == 1, 5.0)
    t = q.get(timeout=60)
    assert type(t).__name__ == "ReadOnlyTensor" and in_pool(t.data_ptr())
    a = t.numpy()
    keep = []
    churn(client, MiB, 5.0, keep)
    assert (a == 3.0).all() and float(t.sum()) == 3.0 * (MiB // 4)
    del keep
    del t, a
    assert wait_until(lambda: used(client) == 0, 5.0)  # Nothing left over.


def test_geometry_and_dtypes_survive_the_reference(daemon):  # P19
    from multiprocessing.reduction import ForkingPickler
    client = shmtensor.connect(daemon.address)
    base = torch.arange(4 * 6 * 5, dtype=torch.float64).reshape(4, 6, 5)
    v = client.get(client.put(base))
    t = v.tensor()
    cases = {
        "whole": t,
        "slice": t[1:3, 2:, ::2],
        "transposed": t.transpose(0, 2),
        "offset": t[3],
        "as int32": t.view(torch.int32)[2:, 1],
        "as bool": t.view(torch.uint8)[1].view(torch.bool),
        "as float16": t.view(torch.float16)[0, :, 3:7],
        "empty": t[2:2],
    }
    for what, sent in cases.items():
        got = ForkingPickler.loads(ForkingPickler.dumps(sent))
        assert type(got).__name__ == "ReadOnlyTensor", what
        assert got.dtype == sent.dtype and got.shape == sent.shape, what
        assert got.stride() == sent.stride(), what
        assert torch.equal(got, sent), what
        if got.numel():
            assert in_pool(got.data_ptr()), what
        with pytest.raises(RuntimeError):
            got.add_(1)  # Read-only, like the sender's.
    storage = (t.untyped_storage() if hasattr(t, "untyped_storage")
               else t.storage()._storage)
    got = ForkingPickler.loads(ForkingPickler.dumps(storage))
    assert in_pool(got.data_ptr())
    assert got.nbytes() == storage.nbytes()
    assert bytes(torch.empty(0, dtype=torch.uint8).set_(got).numpy()) == \
        bytes(torch.empty(0, dtype=torch.uint8).set_(storage).numpy())
    # Every offer was taken (by this process's other client: the object's
    # lease the sender finds may be either's).
    from shmtensor._local import local_client
    other = local_client(daemon.address)
    assert client.stats()["offers"] + other.stats()["offers"] == 0


def test_what_cannot_go_by_reference_goes_as_a_copy(daemon):  # P19
    from multiprocessing.reduction import ForkingPickler
    client = shmtensor.connect(daemon.address)
    buf = client.create((MiB // 4,), "float32")  # Unsealed: writable.
    w = buf.tensor()
    w.fill_(4.0)
    got = ForkingPickler.loads(ForkingPickler.dumps(w))
    assert type(got) is torch.Tensor and not in_pool(got.data_ptr())
    assert float(got.sum()) == 4.0 * (MiB // 4)
    # A Parameter: an optimizer would write into the read-only memory.
    view = client.get(client.put(torch.ones(8)))
    p = torch.nn.Parameter(torch.utils.dlpack.from_dlpack(view),
                           requires_grad=False)
    got = ForkingPickler.loads(ForkingPickler.dumps(p))
    assert type(got) is torch.nn.Parameter and not in_pool(got.data_ptr())
    # A lazy conjugate: its values are not its bytes.
    z = client.get(client.put(torch.tensor([1 + 2j, 3 - 4j]))).tensor()
    got = ForkingPickler.loads(ForkingPickler.dumps(z.conj()))
    assert torch.equal(got, torch.tensor([1 - 2j, 3 + 4j]))
    # A shared-writable object taken read-only: the daemon refuses its
    # offer, and it goes as a copy without a word.
    sw = client.create((8,), "float32", shared_writable=True)
    np.asarray(sw)[:] = 6.0
    ro = client.get(shmtensor.ObjectRef(sw.ref_bytes), writable=False)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ForkingPickler.loads(ForkingPickler.dumps(ro.tensor()))
    assert not in_pool(got.data_ptr()) and float(got.sum()) == 48.0
    assert client.stats()["offers"] == 0


def test_past_the_offer_limit_tensors_go_as_copies(tmp_path):  # P19
    from multiprocessing.reduction import ForkingPickler
    import shmtensor._torch_sharing as sharing
    from conftest import Daemon
    cfg = tmp_path / "d.toml"
    cfg.write_text('[[pool]]\nname = "default"\nsize = "16MiB"\n'
                   '[limits]\nmax_offers_per_session = 2\n')
    with Daemon(config=str(cfg)) as d:
        client = shmtensor.connect(d.address)
        t = client.get(client.put(torch.ones(1024))).tensor()
        sharing._warned = False
        sent = [ForkingPickler.dumps(t) for _ in range(2)]  # Untaken.
        assert client.stats()["offers"] == 2
        with pytest.warns(RuntimeWarning, match="max_offers_per_session"):
            third = ForkingPickler.loads(ForkingPickler.dumps(t))
        assert not in_pool(third.data_ptr()) and float(third.sum()) == 1024
        got = [ForkingPickler.loads(b) for b in sent]
        assert all(in_pool(g.data_ptr()) for g in got)
        assert client.stats()["offers"] == 0


def test_an_untaken_offer_ends_grace_after_its_sender(tmp_path):  # P19
    from multiprocessing.reduction import ForkingPickler
    from conftest import Daemon
    cfg = tmp_path / "d.toml"
    cfg.write_text('[[pool]]\nname = "default"\nsize = "16MiB"\n'
                   '[limits]\noffer_grace_ms = 500\n')
    with Daemon(config=str(cfg)) as d:
        code = (
            "import sys, torch, shmtensor\n"
            "from multiprocessing.reduction import ForkingPickler\n"
            f"c = shmtensor.connect({d.address!r})\n"
            "t = c.get(c.put(torch.ones(MiB))).tensor()\n".replace(
                "MiB", str(MiB // 4)) +
            "sys.stdout.buffer.write(bytes(ForkingPickler.dumps(t)))\n")
        import subprocess
        import sys
        from conftest import child_env
        out = subprocess.run([sys.executable, "-c", code], env=child_env(),
                             stdout=subprocess.PIPE, check=True,
                             timeout=120).stdout
        watcher = shmtensor.connect(d.address)
        assert used(watcher) == MiB  # Pinned after the sender exited.
        assert wait_until(lambda: used(watcher) == 0, 10.0)
        with pytest.raises(shmtensor.StaleReferenceError,
                           match="offer was taken by another receiver or "
                                 "expired"):
            ForkingPickler.loads(out)


def test_share_memory_of_pool_memory_changes_nothing(daemon):  # P19
    client = shmtensor.connect(daemon.address)
    view = client.get(client.put(torch.full((MiB // 4,), 1.0)))
    t = view.tensor()
    a = t.numpy()
    ptr = t.data_ptr()
    assert t.is_shared()
    assert t.share_memory_() is t and t.data_ptr() == ptr
    t.untyped_storage().share_memory_() if hasattr(
        t, "untyped_storage") else t.storage().share_memory_()
    assert t.data_ptr() == ptr
    del view, t
    keep = []
    churn(client, MiB, 5.0, keep)
    assert (a == 1.0).all()


@pytest.mark.parametrize("loader", ["shmtensor", "torch"])
def test_kept_batches_sent_through_a_torch_queue_keep_their_bytes(
        daemon, loader):  # P19: 4 of 4 kept batches read others' bytes
    kwargs = dict(batch_size=4, num_workers=2)
    dl = (st.DataLoader(_Indexed(), shmtensor_address=daemon.address,
                        **kwargs)
          if loader == "shmtensor" else TorchLoader(_Indexed(), **kwargs))
    ctx = tmp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_receive_many, args=(q, out, 4))
    p.start()
    kept = []
    for i, batch in enumerate(dl):
        if i < 4:
            kept.append((i, batch.numpy()))
            q.put(batch)
    got = out.get(timeout=60)
    expected = [float(sum(range(4 * i, 4 * i + 4)) * (MiB // 16))
                for i in range(4)]
    assert got == expected
    for i, a in kept:
        want = np.repeat(np.arange(4 * i, 4 * i + 4, dtype=np.float32),
                         MiB // 16)
        assert (a.reshape(-1) == want).all(), f"kept batch {i} changed"
    p.join(30)
    assert p.exitcode == 0


def _receive_many(q, out, n):
    out.put([float(q.get().sum()) for _ in range(n)])
