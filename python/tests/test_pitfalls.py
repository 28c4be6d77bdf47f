"""docs/pitfalls.md P1-P7, P9 and P14: each trap shown real with plain
NumPy/torch, then shown closed through shmtensor."""

import gc
import os
import pickle
import signal
import weakref

import numpy as np
import pytest
import torch

import shmtensor
from conftest import (pool_memfds, run_python, shmtensor_shm_files,
                      spawn_python, used, wait_until)


# -- P1: memory shared without anyone noticing --------------------------------

def test_p1_trap_from_numpy_shares_memory_both_ways():
    a = np.zeros(4)
    t = torch.from_numpy(a)
    t[0] = 5
    assert a[0] == 5  # The trap: the write went through to the array.


def test_p1_reader_numpy_view_is_read_only(client):
    ref = client.put(np.arange(8.0))
    a = np.asarray(client.get(ref))
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 99
    assert np.asarray(client.get(ref))[0] == 0


def test_p1_reader_tensor_refuses_in_place_writes(client):
    ref = client.put(torch.arange(8.0))
    t = client.get(ref).tensor()
    for write in (lambda: t.add_(1), lambda: t.__setitem__(0, 9.0),
                  lambda: t[2:].fill_(1), lambda: torch.add(t, 1, out=t),
                  lambda: t.view(2, 4).zero_(),
                  lambda: t.view(2, 4).T.copy_(torch.ones(4, 2))):
        with pytest.raises(RuntimeError, match="read-only"):
            write()
    assert t.numpy().flags.writeable is False
    assert torch.equal(client.get(ref).tensor(), torch.arange(8.0))
    fresh = t * 2  # New memory: an ordinary, writable tensor.
    fresh.add_(1)
    assert type(fresh) is torch.Tensor


def test_p1_write_through_raw_dlpack_tensor_faults_in_child(client, daemon):
    ref = client.put(np.full(1024, 7, dtype=np.int32))
    child = run_python(
        "import pickle, sys, torch, shmtensor\n"
        "c = shmtensor.connect()\n"
        "v = c.get(pickle.loads(bytes.fromhex(sys.argv[1])))\n"
        "t = torch.from_dlpack(v)\n"  # A plain tensor, bypassing the guard.
        "t.fill_(0)\n"
        "print('WROTE')\n",
        daemon.address, pickle.dumps(ref).hex())
    assert child.returncode == -signal.SIGSEGV, child.stdout + child.stderr
    assert "WROTE" not in child.stdout
    assert (np.asarray(client.get(ref)) == 7).all()


# -- P2: a buffer reused while an old tensor still points into it -------------

def test_p2_trap_reused_buffer_changes_old_batch():
    buffer = np.zeros(4, dtype=np.float32)
    batch = torch.from_numpy(buffer)
    buffer[:] = 1  # The loader writes the next batch into the same buffer.
    assert batch.sum() == 4  # The trap: the previous batch changed silently.


def test_p2_producer_waits_never_overwrites(client):
    # The pool is 256 MiB: two 100 MiB batches fit, a third must wait.
    old = client.put(np.full(100 << 20, 1, dtype=np.uint8))
    old_view = client.get(old)
    old_tensor = old_view.tensor()
    second = client.put(np.full(100 << 20, 2, dtype=np.uint8))
    del second  # Freed at once: nobody else holds it.
    third = client.put(np.full(100 << 20, 3, dtype=np.uint8))
    with pytest.raises(shmtensor.PoolExhaustedError, match="pool 'default'"):
        client.put(np.full(100 << 20, 4, dtype=np.uint8), timeout=0.2)
    old.release()
    del old_view
    # The tensor alone keeps the first batch: still full, still unchanged.
    with pytest.raises(shmtensor.PoolExhaustedError):
        client.create(100 << 20, "uint8", timeout=0.2)
    assert int(old_tensor.min()) == 1 and int(old_tensor.max()) == 1
    del old_tensor
    client.create(100 << 20, "uint8", timeout=0)  # Now it fits.
    del third


# -- P3: views of slices and non-contiguous data ------------------------------

def test_p3_trap_slices_share_memory_and_view_fails():
    a = np.arange(12.0).reshape(3, 4)
    assert np.may_share_memory(a, a[::2])
    with pytest.raises(RuntimeError):
        torch.from_numpy(a).T.view(-1)


def test_p3_put_copies_strided_data_to_c_contiguous(client):
    a = np.arange(24.0).reshape(4, 6)
    for src in (a[::2], a.T, a[:, 1::3]):
        view = client.get(client.put(src))
        out = np.asarray(view)
        assert np.array_equal(out, src)
        assert out.flags.c_contiguous
        assert not np.may_share_memory(out, a)
        t = view.tensor()
        assert t.is_contiguous()
        assert t.view(-1).numel() == src.size  # .view() works on what we hand out.


def test_p3_created_buffer_is_c_contiguous(client):
    buf = client.create((3, 5), "int16")
    assert buf.strides == (10, 2)
    assert np.asarray(buf).flags.c_contiguous


# -- P4: stale handles --------------------------------------------------------

def test_p4_stale_ref_never_returns_new_objects_bytes(client):
    old = client.put(np.full(4096, 1, dtype=np.uint8))
    wire = pickle.dumps(old)
    old.release()
    new = client.put(np.full(4096, 2, dtype=np.uint8))  # Same memory, reused.
    with pytest.raises(shmtensor.StaleReferenceError, match="stale reference"):
        client.get(pickle.loads(wire))
    assert (np.asarray(client.get(new)) == 2).all()


def test_p4_deleted_name_gives_not_found(client):
    client.put(np.ones(3), name="weights")
    client.delete("weights")
    with pytest.raises(shmtensor.NotFoundError, match="weights"):
        client.get("weights", timeout=0)


# -- P5: gradients and devices ------------------------------------------------

def test_p5_trap_numpy_of_grad_tensor_raises():
    with pytest.raises(RuntimeError, match="requires grad"):
        torch.ones(2, requires_grad=True).numpy()


def test_p5_put_detaches_and_keeps_no_graph(client):
    w = torch.ones(4, requires_grad=True)
    y = w * 3  # Part of an autograd graph.
    ref = client.put(y)
    probe = weakref.ref(y)  # y holds the graph (y.grad_fn).
    del y
    gc.collect()
    assert probe() is None  # shmtensor kept no reference to the graph.
    t = client.get(ref).tensor()
    assert not t.requires_grad
    assert torch.equal(t, torch.full((4,), 3.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_p5_put_copies_cuda_tensor_to_host(client):
    ref = client.put(torch.arange(4.0, device="cuda"))
    assert torch.equal(client.get(ref).tensor(), torch.arange(4.0))


# -- P6: dtypes ---------------------------------------------------------------

def test_p6_trap_default_float_differs():
    assert np.zeros(1).dtype == np.float64
    assert torch.zeros(1).dtype == torch.float32


def test_p6_dtype_survives_both_ways(client):
    for obj in (np.zeros(3), torch.zeros(3)):
        view = client.get(client.put(obj))
        expected = np.float64 if isinstance(obj, np.ndarray) else np.float32
        assert np.asarray(view).dtype == expected
        assert view.tensor().dtype == (torch.float64 if expected == np.float64
                                       else torch.float32)


def test_p6_big_endian_refused_with_fix(client):
    with pytest.raises(shmtensor.InvalidArgumentError, match="newbyteorder"):
        client.put(np.arange(3, dtype=">f8"))
    with pytest.raises(shmtensor.InvalidArgumentError, match="big-endian"):
        client.create(3, np.dtype(">i4"))


def test_p6_dtype_one_side_lacks_says_what_to_do(client):
    bf = client.get(client.put(torch.ones(2, dtype=torch.bfloat16)))
    with pytest.raises(TypeError, match="bfloat16 has no NumPy equivalent"):
        np.asarray(bf)
    assert bf.tensor().dtype == torch.bfloat16
    u32 = client.get(client.put(np.arange(3, dtype=np.uint32)))
    with pytest.raises(TypeError, match="uint32 has no torch equivalent"):
        u32.tensor()
    for bad in (np.array(["a"]), np.array([object()]),
                np.zeros(2, dtype=np.longdouble),
                np.zeros(2, dtype=[("x", "i4")])):
        with pytest.raises(shmtensor.InvalidArgumentError, match="dtype"):
            client.put(bad)
    with pytest.raises(shmtensor.InvalidArgumentError, match="complex32"):
        client.put(torch.zeros(2, dtype=torch.complex32))


# -- P7: zero-size, 0-d and very large arrays ---------------------------------

def test_p7_zero_size_and_scalar(client):
    for src in (np.zeros((0, 3), dtype=np.int16), np.array(2.5),
                np.zeros((2, 0, 4))):
        out = np.asarray(client.get(client.put(src)))
        assert out.shape == src.shape and out.dtype == src.dtype
        assert np.array_equal(out, src)
    t = client.get(client.put(torch.tensor(7))).tensor()
    assert t.shape == () and t.item() == 7


def test_p7_array_larger_than_4gib():
    with open("/proc/meminfo") as f:
        free = next(int(line.split()[1]) << 10 for line in f
                    if line.startswith("MemAvailable:"))
    if free < (12 << 30):
        pytest.skip(f"{free >> 20} MiB of memory available; need 12 GiB for "
                    f"a 4.5 GiB pool plus headroom")
    from conftest import Daemon
    d = Daemon(pool_size="4608MiB")
    try:
        c = shmtensor.connect(d.address)
        n = (4 << 30) + (64 << 20)  # Past every 32-bit size and offset.
        buf = c.create(n, "uint8")
        a = np.asarray(buf)
        assert a.nbytes == n
        a[:: 1 << 20] = 7
        a[-1] = 9
        del a
        view = c.get(buf.seal())
        out = np.asarray(view)
        assert out.shape == (n,)
        assert out[-1] == 9 and out[(4 << 30)] == 7 and out[1 << 20] == 7
    finally:
        d.stop()


# -- P9: processes that die while holding buffers ------------------------------

HOLDER = (
    "import numpy as np, shmtensor, sys, time\n"
    "c = shmtensor.connect()\n"
    "half = c.create(1 << 20, 'uint8', name='half')\n"
    "np.asarray(half)[:] = 1\n"  # Half-written, never sealed.
    "held = c.get(c.put(np.ones(1 << 20, dtype=np.uint8)))\n"
    "xfer = c.put(np.ones(1 << 20, dtype=np.uint8), exclusive=True)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n")


def test_p9_sigkilled_holder_reclaimed_within_a_second(client, daemon):
    holder = spawn_python(HOLDER, daemon.address)
    assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
    # Its puts seal one way: another session sees each sealed once the
    # holder's stream message arrives.
    assert wait_until(lambda: used(client) == 3 << 20, timeout=2.0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # Everything goes, its stock (buffers granted ahead of puts) included.
    assert wait_until(
        lambda: client.stats()["pools"][0]["used_bytes"] == 0, timeout=1.0)
    stats = client.stats()
    assert stats["leases"] == 0 and stats["pending_transfers"] == 0
    with pytest.raises(shmtensor.NotFoundError):
        client.get("half", timeout=0)  # Never visible, not now either.


def test_p9_daemon_stop_leaves_no_segment(daemon):
    # P9/P16: a pool is a memfd, in no file system: there is never a file to
    # leak, whether the daemon stops or is killed (tests/daemon_test.cc
    # follows the memory itself across a SIGKILL).
    c = shmtensor.connect(daemon.address)
    c.put(np.ones(10))
    assert not shmtensor_shm_files()
    assert pool_memfds(daemon.proc.pid) and pool_memfds(os.getpid())
    assert daemon.stop() == 0
    assert not shmtensor_shm_files()
    with pytest.raises(shmtensor.DaemonUnavailableError):
        c.stats()


def _break_daemon_connections(socket_path):
    """Shuts down every connection of this process to the daemon, as a
    network fault would, while the process lives on."""
    import socket as socket_module
    broken = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            s = socket_module.fromfd(fd, socket_module.AF_UNIX,
                                     socket_module.SOCK_STREAM)
        except OSError:
            continue
        try:
            if s.getpeername() == socket_path:
                s.shutdown(socket_module.SHUT_RDWR)
                broken += 1
        except OSError:
            pass
        finally:
            s.close()
    return broken


def test_p14_broken_connection_never_changes_a_live_view(daemon):
    # The trap: a daemon that reclaims when the connection ends hands a live
    # process's memory to the next writer. Its views then read their bytes.
    a = shmtensor.connect(daemon.address)
    ref = a.put(np.full(1 << 20, 0xAA, dtype=np.uint8))
    view = np.asarray(a.get(ref))
    tensor = a.get(ref).tensor()
    assert _break_daemon_connections(daemon.path) > 0
    b = shmtensor.connect(daemon.address)
    filled = []
    with pytest.raises(shmtensor.errors.PoolExhaustedError):
        while True:
            filled.append(b.put(np.full(1 << 20, 0xBB, dtype=np.uint8),
                                timeout=0))
    assert filled, "the other client got no memory at all"
    assert (view == 0xAA).all()
    assert bool((tensor == 0xAA).all())
    # The session resumes: at most one call fails, saying so; then a's
    # releases reach the daemon and its memory comes back.
    try:
        a.stats()
    except shmtensor.errors.DaemonUnavailableError as e:
        assert "resumed" in str(e)
    held = used(a)
    del filled
    gc.collect()
    wait_until(lambda: used(a) <= held - (1 << 20))
    assert (view == 0xAA).all()
    del view, tensor
    ref.release()
    gc.collect()
    assert wait_until(lambda: used(a) == 0)


def test_read_only_tensor_warns_nothing_and_saves_as_a_plain_tensor(client,
                                                                    tmp_path):
    """torch 2.x: no TypedStorage deprecation warning from our guard, and
    torch.load (weights_only, 2.6's default) loads a saved read-only view,
    as a plain tensor in new memory."""
    import warnings
    ref = client.put(torch.arange(8.0))
    t = client.get(ref).tensor()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float((t[2:] * 2).sum()) == 54
        with pytest.raises(RuntimeError, match="read-only"):
            t.add_(1)
    # An empty read-only tensor guards no other (empty) tensor.
    empty = client.get(client.put(torch.zeros(0))).tensor()
    out = torch.empty(0)
    torch.add(empty, torch.zeros(0), out=out)
    path = tmp_path / "t.pt"
    torch.save({"t": t[1:]}, path)
    loaded = torch.load(path, weights_only=True)["t"]
    assert type(loaded) is torch.Tensor
    assert torch.equal(loaded, torch.arange(1.0, 8.0))
    loaded.add_(1)  # Its own memory.
    assert torch.equal(t, torch.arange(8.0))
