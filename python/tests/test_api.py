"""The Python API: lifetimes, errors, refs, hand-off, GIL."""

import ctypes
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import shmtensor
from conftest import Daemon, child_env, used, wait_until

ctypes_byte = ctypes.c_uint8


def test_connect_uses_env_address(daemon, monkeypatch):
    monkeypatch.setenv("SHMTENSOR_ADDRESS", daemon.address)
    assert shmtensor.default_address() == daemon.address
    assert shmtensor.connect().address == daemon.address


def test_connect_without_daemon_is_unavailable():
    with pytest.raises(shmtensor.DaemonUnavailableError, match="nobody.sock"):
        shmtensor.connect("unix:/tmp/nobody.sock", connect_timeout=0.2)


def test_lifecycle_create_seal_get_release(client):
    buf = client.create((64, 1024), "float32")
    np.asarray(buf)[:] = 1.5
    ref = buf.seal()
    assert ref.holds_lease and not buf.valid
    with pytest.raises(shmtensor.PreconditionError, match="sealed"):
        np.asarray(buf)
    view = client.get(ref)
    assert not view.writable
    assert np.asarray(view).sum() == 1.5 * 64 * 1024
    assert used(client) == 256 << 10
    ref.release()
    assert used(client) == 256 << 10  # The view still holds it.
    del view
    gc.collect()
    assert used(client) == 0


def test_lease_follows_arrays_and_tensors(client):
    ref = client.put(np.arange(1024.0))
    view = client.get(ref)
    a = np.asarray(view)[10:20]  # A slice keeps its base, which keeps the lease.
    t = view.tensor()[5]
    ref.release()
    view.close()
    assert view.closed
    assert used(client) == 8192
    del a
    assert used(client) == 8192  # The tensor still holds it.
    assert t.item() == 5.0
    del t
    gc.collect()
    assert used(client) == 0


def test_view_context_manager_and_close(client):
    ref = client.put(np.ones(4))
    with client.get(ref) as view:
        assert np.asarray(view).sum() == 4
    assert view.closed
    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        np.asarray(view)
    ref.release()
    assert used(client) == 0


def test_view_exports_the_buffer_protocol(client):
    """memoryview(view) and numpy.asarray(view) take the buffer protocol: the
    same bytes, read-only for a shared object, writable for the taker of a
    hand-off; the export holds the lease, not the view."""
    src = np.arange(12, dtype=np.int16).reshape(3, 4)
    ref = client.put(src)
    view = client.get(ref)
    m = memoryview(view)
    assert (m.format, m.shape, m.strides, m.readonly) == ("h", (3, 4),
                                                          (8, 2), True)
    a = np.asarray(view)
    assert a.__array_interface__["data"][0] == view.address
    assert not a.flags.writeable and (a == src).all()
    with pytest.raises(TypeError, match="not writable"):
        (ctypes_byte * 24).from_buffer(view)  # Wants a writable buffer.
    view.close()
    ref.release()
    assert used(client) == 4096  # The exports hold it.
    assert m.tolist() == src.tolist()
    del m, a
    gc.collect()
    assert used(client) == 0
    with pytest.raises(BufferError, match="closed"):
        memoryview(view)

    buf = client.create(8, "uint8")
    np.asarray(buf)[:] = 7
    taken = client.get(buf.seal(exclusive=True))
    w = np.asarray(taken)
    assert w.flags.writeable and not memoryview(taken).readonly
    w[:] = 9
    assert bytes(memoryview(taken)) == b"\x09" * 8

    # No buffer-protocol format for bfloat16: numpy falls back to __array__,
    # which says what to do.
    bf = client.get(client.put(torch.ones(2, dtype=torch.bfloat16)))
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(bf)
    with pytest.raises(TypeError, match="bfloat16 has no NumPy equivalent"):
        np.asarray(bf)


def test_buffer_context_manager_discards_unsealed(client):
    with client.create(1024, "uint8") as buf:
        np.asarray(buf)[:] = 1
    assert not buf.valid
    assert used(client) == 0


def test_object_ref_is_one_native_value(client):
    """ObjectRef is one native type: its bytes round-trip, equal refs hash
    alike (as dict keys), it pickles to the same ref holding nothing, and
    release() leaves a plain reference."""
    ref = client.put(np.arange(4, dtype=np.int32))
    assert type(ref) is shmtensor.ObjectRef
    assert type(ref).__module__ == "shmtensor"
    again = shmtensor.ObjectRef(bytes(ref))
    assert again == ref and hash(again) == hash(ref) and again is not ref
    assert {ref: 1}[again] == 1
    assert shmtensor.ObjectRef(bytearray(bytes(ref))) == ref
    assert ref != bytes(ref) and not (ref == 3)
    assert not again.holds_lease and ref.holds_lease
    assert "holds lease" in repr(ref) and "holds lease" not in repr(again)
    assert weakref.ref(ref)() is ref
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref and not copy.holds_lease
    assert shmtensor._unpickle_ref(bytes(ref)) == ref  # Older pickles.
    with pytest.raises(TypeError):
        type(ref).__hash__ = None  # An immutable type.
    exclusive = client.put(np.zeros(2), exclusive=True)
    assert exclusive.exclusive and not ref.exclusive
    assert "exclusive" in repr(exclusive)
    ref.release()
    assert not ref.holds_lease and ref == again
    ref.release()  # Idempotent.
    assert used(client) > 0  # The exclusive one, until taken.
    np.testing.assert_array_equal(np.asarray(client.get(exclusive)), [0, 0])


def test_pickled_ref_holds_nothing(client):
    ref = client.put(np.ones(4))
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref and hash(copy) == hash(ref)
    assert not copy.holds_lease and ref.holds_lease
    assert len(pickle.dumps(ref)) < 128
    del ref
    gc.collect()
    with pytest.raises(shmtensor.StaleReferenceError):
        client.get(copy)


def test_named_get_waits_for_seal_and_releases_the_gil(client):
    result = {}

    def waiter():
        result["view"] = client.get("late", timeout=10)

    thread = threading.Thread(target=waiter)
    thread.start()
    # While the waiter blocks in the daemon, this thread keeps running Python:
    # only possible if the wait released the GIL.
    spins, end = 0, time.monotonic() + 0.3
    while time.monotonic() < end:
        spins += 1
    assert thread.is_alive()
    assert spins > 10000
    client.put(np.full(3, 4.0), name="late")
    thread.join(10)
    assert np.asarray(result["view"]).tolist() == [4.0, 4.0, 4.0]


def test_named_get_timeout_and_immediate(client):
    with pytest.raises(shmtensor.TimeoutError, match="'missing'"):
        client.get("missing", timeout=0.1)
    with pytest.raises(shmtensor.NotFoundError, match="'missing'"):
        client.get("missing", timeout=0)


def test_names_are_never_rebound(client):
    client.put(np.ones(2), name="model")
    with pytest.raises(shmtensor.AlreadyExistsError, match="'model'"):
        client.put(np.zeros(2), name="model")
    assert np.asarray(client.get("model")).tolist() == [1.0, 1.0]


def test_deferred_delete(client):
    client.put(np.ones(512), name="w")
    view = client.get("w")
    client.delete("w")
    assert used(client) == 4096
    assert np.asarray(view).sum() == 512
    del view
    gc.collect()
    assert used(client) == 0


def test_exclusive_hand_off(client, daemon):
    ref = client.put(torch.arange(6.0), exclusive=True)
    assert ref.exclusive and not ref.holds_lease
    consumer = shmtensor.connect(daemon.address)
    view = consumer.get(ref)
    assert view.writable
    t = view.tensor()
    assert type(t) is torch.Tensor
    t.mul_(2)  # The one consumer owns it: writes are allowed.
    assert np.asarray(view).tolist() == [0, 2, 4, 6, 8, 10]
    with pytest.raises(shmtensor.AlreadyTakenError):
        client.get(ref)


def test_exclusive_take_read_only(client, daemon):
    ref = client.put(np.arange(4.0), exclusive=True)
    consumer = shmtensor.connect(daemon.address)
    view = consumer.get(ref, writable=False)
    assert not view.writable
    a = np.asarray(view)
    assert not a.flags.writeable and a.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(shmtensor.AlreadyTakenError):
        client.get(ref)


def _pool_perms(inode):
    """The permissions of every mapping of this process of the memory whose
    inode is `inode` (both mappings of a pool: one memfd)."""
    with open("/proc/self/maps") as f:
        return [line.split()[1] for line in f
                if len(line.split()) > 5 and line.split()[4] == inode]


def _inode_at(address):
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[4]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_put_views_read_through_the_read_only_mapping(client, daemon):
    # A put copies in through the writable mapping (and may leave that
    # range open there, where nothing points); every view of it, the
    # putter's own included, reads through the read-only mapping.
    ref = client.put(np.arange(3.0))
    view = client.get(ref)
    assert "w" not in _perms_at(view.address)
    assert np.asarray(view).tolist() == [0.0, 1.0, 2.0]
    assert not np.asarray(view).flags.writeable
    buf = client.create(4, "float32")  # A buffer's range is open, unsealed.
    assert "w" in _perms_at(buf.address)
    a = np.asarray(buf)
    buf.seal()  # With an array of it alive, the range closes at once.
    assert "w" not in _perms_at(a.__array_interface__["data"][0])
    assert not a.flags.writeable


def test_put_many_and_get_many_move_many_objects_per_call(client, daemon):
    arrays = [np.full(1000 + 37 * i, i, dtype=np.int32) for i in range(64)]
    refs = client.put_many(arrays)
    assert len(refs) == 64 and all(r.holds_lease for r in refs)
    other = shmtensor.connect(daemon.address)
    views = other.get_many(refs)
    assert [np.asarray(v).tolist() for v in views] == [a.tolist()
                                                       for a in arrays]
    def leases():
        # The stocks' buffers are leases too, and the refill threads make
        # them in the background: counted apart.
        s = client.stats()
        return s["leases"] - s["stock_objects"]

    before = leases()
    again = other.get_many(refs)  # Held already: shares, no new lease.
    assert leases() == before
    assert [v.address for v in again] == [v.address for v in views]
    with pytest.raises(TypeError, match="item 1"):
        other.get_many([refs[0], b"not a ref"])
    del views, again
    for r in refs:
        r.release()
    gc.collect()
    assert wait_until(lambda: used(client) == 0)
    # All or nothing: one array NumPy cannot store leaves no object.
    with pytest.raises(shmtensor.InvalidArgumentError):
        client.put_many([np.ones(4), np.ones(4, dtype=">f8")])
    assert used(client) == 0


WAITER = textwrap.dedent("""
    import shmtensor
    c = shmtensor.connect()
    full = c.create_bytes(c.stats()["pools"][0]["size_bytes"])  # All of it.
    print("full", flush=True)
    try:
        c.create_bytes(1 << 20, timeout=None)  # Waits for memory.
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def _waiters(address):
    from shmtensor import _commands
    out = subprocess.run([_commands.binary("shmtensorctl"), "--address",
                          address, "status", "--json"],
                         capture_output=True, text=True, timeout=10)
    return int(json.loads(out.stdout)["waiters"])


def test_a_wait_for_memory_is_one_call_that_ctrl_c_cancels(daemon):
    # The wait is one call the daemon parks (it answers when memory is
    # there), made on a helper thread while the caller answers signals:
    # Ctrl-C raises at once and the parked call ends with it.
    from conftest import spawn_python
    p = spawn_python(WAITER, daemon.address)
    try:
        assert p.stdout.readline().strip() == "full", p.stderr.read()
        assert wait_until(lambda: _waiters(daemon.address) == 1, 5.0)
        p.send_signal(signal.SIGINT)
        assert p.stdout.readline().strip() == "interrupted", p.stderr.read()
        assert wait_until(lambda: _waiters(daemon.address) == 0, 2.0)
    finally:
        p.kill()
        p.wait()


def test_a_get_of_a_held_object_shares_its_lease(client, daemon):
    ref = client.put(np.arange(10.0))
    first = client.get(ref)
    leases = client.stats()["leases"]
    second = client.get(ref)
    assert client.stats()["leases"] == leases
    assert second.address == first.address
    first.close()  # Not the last holder: nothing is released.
    ref.release()
    junk = [client.put(np.full(10, 7.0)) for _ in range(16)]
    assert np.asarray(second).tolist() == list(np.arange(10.0))
    del junk
    second.close()
    gc.collect()
    assert wait_until(lambda: used(client) == 0)



def test_shares_of_a_view_live_apart_and_the_last_release_waits(client):
    # Every Python get of a held object is another Python view of one C++
    # View (python/src/shared_view.h): each lives apart from the others, and
    # the one that closes last releases the lease and waits for the daemon.
    shares_of = shmtensor._core._shares_of
    x = np.arange(1 << 14, dtype=np.float32)
    ref = client.put(x)
    leases = client.stats()["leases"]
    views = [client.get(ref) for _ in range(5)]
    assert client.stats()["leases"] == leases
    assert shares_of(views[4]) == (5, 5)  # (open, alive)
    del ref  # The creator's share; the views keep the object.
    views[0].close()
    views[0].close()  # A second close of one view lets go of nothing more.
    assert shares_of(views[0]) == (4, 5)
    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        np.asarray(views[0])
    views[1] = None  # Deallocated, not closed.
    gc.collect()
    assert shares_of(views[0]) == (3, 4)
    a = np.asarray(views[2])  # An export of a share outlives its view.
    views[2].close()
    views[3].close()
    assert client.stats()["leases"] == leases
    assert np.array_equal(a, x) and np.array_equal(np.asarray(views[4]), x)
    del a
    views[4].close()  # The last share: back in the pool on return.
    assert used(client) == 0
    assert shares_of(views[4]) == (0, 4)
    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        views[4].shape


def test_a_view_its_own_dlpack_argument_closes_fails_cleanly(client):
    # Python code run by a method of a view (here the stream's __index__)
    # may close every view of the object: the method then finds it closed,
    # and reads nothing freed.
    ref = client.put(np.arange(8.0))
    v = client.get(ref)
    del ref

    class Closing:
        def __index__(self):
            v.close()
            return -1

    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        v.__dlpack__(stream=Closing())
    assert used(client) == 0


def test_shares_of_a_view_outlive_their_client(daemon):
    c = shmtensor.connect(daemon.address)
    ref = c.put(np.arange(64.0))
    views = [c.get(ref), c.get(ref)]
    assert shmtensor._core._shares_of(views[0]) == (2, 2)
    del c, ref  # The client goes first; its views stay valid.
    gc.collect()
    views[0].close()
    assert np.asarray(views[1]).tolist() == list(np.arange(64.0))
    del views
    gc.collect()
    assert wait_until(lambda: used(shmtensor.connect(daemon.address)) == 0)


def test_a_get_shares_only_its_own_clients_view_of_exactly_its_ref(daemon):
    shares_of = shmtensor._core._shares_of
    c = shmtensor.connect(daemon.address)
    other = shmtensor.connect(daemon.address)
    ref = c.put(np.arange(64.0))
    first = c.get(ref)
    # Another client's get is a lease of its own session, not a share of
    # this client's view.
    leases = other.stats()["leases"]
    theirs = other.get(ref)
    assert other.stats()["leases"] == leases + 1
    assert shares_of(theirs) == (1, 1) and shares_of(first) == (1, 1)
    # A ref that differs from the held one in its nonce is none the daemon
    # issued: it refuses it.
    b = bytearray(bytes(ref))
    b[25] ^= 0x01
    with pytest.raises(shmtensor.InvalidArgumentError, match="never issued"):
        c.get(shmtensor.ObjectRef(bytes(b)))
    # One that differs in its exclusive flag asks the daemon, which goes by
    # the object (shared, read-only): a lease of its own.
    b = bytearray(bytes(ref))
    b[17] ^= 0x01
    leases = c.stats()["leases"]
    flagged = c.get(shmtensor.ObjectRef(bytes(b)))
    assert not flagged.writable
    assert c.stats()["leases"] == leases + 1
    assert shares_of(flagged) == (1, 1) and shares_of(first) == (1, 1)
    # The ref itself, parsed anew from its bytes, shares the view.
    again = c.get(shmtensor.ObjectRef(bytes(ref)))
    assert np.array_equal(np.asarray(again), np.arange(64.0))
    assert shares_of(first) == (2, 2)
    del first, again, theirs, flagged, ref
    gc.collect()
    assert wait_until(lambda: used(c) == 0)


def test_a_forked_child_takes_no_share_of_its_parents_views(daemon):
    c = shmtensor.connect(daemon.address)
    ref = c.put(np.arange(64.0))
    first = c.get(ref)
    second = c.get(ref)  # The parent's gets share first's view.
    assert shmtensor._core._shares_of(first) == (2, 2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = b"shared"
        try:
            c.get(ref)
        except shmtensor.PreconditionError as e:
            out = str(e).encode()
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            out = repr(e).encode()
        os.write(w, out[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    assert "inherited across fork()" in said, said
    del first, second, ref
    gc.collect()
    assert wait_until(lambda: used(c) == 0)


def test_gets_and_closes_of_one_object_from_many_threads(client):
    x = np.arange(1 << 12, dtype=np.float32)
    ref = client.put(x)
    leases = client.stats()["leases"]
    failures = []

    def work(seed):
        try:
            held = []
            for i in range(3000):
                v = client.get(ref)
                if (i + seed) % 3 == 0:
                    held.append(v)
                elif (i + seed) % 3 == 1:
                    v.close()
                if len(held) > 8:
                    held.pop(seed % len(held)).close()
                if i % 500 == 0:
                    w = v if not v.closed else client.get(ref)
                    if not np.array_equal(np.asarray(w), x):
                        failures.append("bytes changed")
        except BaseException as e:  # noqa: BLE001 (asserted below)
            failures.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert client.stats()["leases"] == leases
    del ref
    gc.collect()
    assert wait_until(lambda: used(client) == 0)


def _perms_at(address):
    """The permissions of this process's mapping that holds `address`."""
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return perms
    raise AssertionError(f"no mapping holds {address:#x}")


def test_seal_without_live_exports_defers_closing_not_safety(client):
    # No array or tensor of the buffer is alive at seal: nothing can write
    # through it any more, so its range may stay open in the writable
    # mapping (no page-table change now, none when the memory is reused
    # here). Views still read through the read-only mapping.
    buf = client.create(1024, "float32")
    a = np.asarray(buf)  # An export: counted while it lives.
    written = a.__array_interface__["data"][0]
    a[:] = 5.0
    del a
    ref = buf.seal()
    assert "w" in _perms_at(written)  # Left open for the next buffer here.
    view = client.get(ref)
    assert view.address != written
    assert "w" not in _perms_at(view.address)
    a = np.asarray(view)
    assert not a.flags.writeable and a[0] == 5.0
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1.0
    # The same memory, recycled for the next buffer, is written in place.
    del view, a, ref
    buf2 = client.create(1024, "float32")
    a2 = np.asarray(buf2)
    assert a2.__array_interface__["data"][0] == written
    a2[:] = 6.0
    del a2
    assert np.asarray(client.get(buf2.seal())).tolist() == [6.0] * 1024
    # A raw address handed out is a pointer nobody counts: the seal closes
    # the range, and so does every later seal of that memory here.
    buf3 = client.create(1024, "float32")
    raw = buf3.address
    ref3 = buf3.seal()
    assert "w" not in _perms_at(raw)
    del ref3


def test_exclusive_seal_refuses_live_exports(client):
    buf = client.create(16, "float32")
    a = np.asarray(buf)
    with pytest.raises(BufferError, match="still alive"):
        buf.seal(exclusive=True)
    del a
    assert buf.seal(exclusive=True).exclusive


def test_errors_name_the_value(client):
    with pytest.raises(shmtensor.InvalidArgumentError, match="-3"):
        client.create((4, -3), "float32")
    with pytest.raises(shmtensor.LargerThanPoolError,
                       match="exceeds pool") as e:
        client.create(1 << 40, "uint8")
    # A reason, not the message, says no wait can help (the DataLoader's
    # advice relies on it).
    assert e.value.reason == "ERROR_REASON_LARGER_THAN_POOL"
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value, ValueError)
    with pytest.raises(shmtensor.InvalidArgumentError, match="name"):
        client.create(4, "uint8", name="x" * 300)
    with pytest.raises(ValueError, match="timeout"):
        client.create(4, "uint8", timeout=-1)
    with pytest.raises(TypeError, match="ObjectRef or a name"):
        client.get(42)
    with pytest.raises(shmtensor.InvalidArgumentError):
        shmtensor.ObjectRef(b"not a ref")


def test_bad_arguments_name_the_value(client):
    """The lifecycle calls convert their own arguments (no pybind11): every
    bad one is a precise TypeError or ValueError, and the client goes on."""
    cases = [
        (lambda: client.create((2, 2.5), "float32"), TypeError,
         r"shape \(2, 2.5\): dimensions must be integers"),
        (lambda: client.create(None, "float32"), TypeError,
         "shape must be an int or a sequence of ints, got None"),
        (lambda: client.create((1 << 70,), "uint8"), ValueError,
         "1180591620717411303424.*64 bits"),
        (lambda: client.create(4), TypeError,
         r"create\(\) missing required argument 'dtype' \(pos 2\)"),
        (lambda: client.create(4, "uint8", bogus=1), TypeError,
         "unexpected keyword argument 'bogus'"),
        (lambda: client.create(4, "uint8", dtype="uint8"), TypeError,
         "multiple values for argument 'dtype'"),
        (lambda: client.create(4, "uint8", None, None, None, False, 7),
         TypeError, r"at most 6 arguments \(7 given\)"),
        (lambda: client.create(4, "uint8", name=3), TypeError,
         "name must be a str or None, got int"),
        (lambda: client.create(4, "uint8", timeout="soon"), TypeError,
         "timeout must be None or a number of seconds, got 'soon'"),
        (lambda: client.create(4, "uint8", timeout=float("nan")), ValueError,
         "timeout must be None or >= 0 seconds, got nan"),
        (lambda: client.create(4, "no-such-dtype"),
         shmtensor.InvalidArgumentError, "no-such-dtype"),
        (lambda: shmtensor.ObjectRef(), TypeError,
         r"ObjectRef\(\) missing required argument 'ref_bytes'"),
        (lambda: shmtensor.ObjectRef(3), TypeError, "ref's bytes, not int"),
        (lambda: shmtensor.ObjectRef([1, 2]), TypeError,
         "ref's bytes, not list"),
        (lambda: client.create_bytes("4k"), TypeError,
         "size must be an int, got '4k'"),
        (lambda: client.create_bytes(-1), ValueError,
         "size must be a byte count >= 0 .*got -1"),
        (lambda: client.get(b"bytes"), TypeError,
         "ObjectRef or a name, not bytes"),
        (lambda: client.create(4, "uint8").seal(stream=object()), TypeError,
         "stream must be None, a stream handle or a torch.cuda.Stream, got "
         "object"),
        (lambda: client.create(4, "uint8").__dlpack__(dl_device="cpu"),
         TypeError, r"__dlpack__\(\): argument 'dl_device' has the wrong "
         r"type \(str\)"),
        (lambda: client.create(4, "uint8").__dlpack__(dl_device=(2, 0)),
         BufferError, r"dl_device=\(2, 0\)\): the bytes are on cpu"),
        (lambda: client.create(4, "uint8").__dlpack__(copy=True),
         BufferError, "without a copy only"),
        (lambda: client.create(4, "uint8").__dlpack__(bogus=1), TypeError,
         r"__dlpack__\(\) got an unexpected keyword argument 'bogus'"),
        (lambda: client.get(client.put(np.zeros(1))).__dlpack__(stream=-2),
         ValueError, "stream must be None, -1 or a stream handle, got -2"),
        (lambda: client.delete(3), TypeError, "name must be a str, got int"),
        (lambda: client.delete(None), TypeError,
         "name must be a str, got NoneType"),
        (lambda: client.has_pool_on(object()), shmtensor.InvalidArgumentError,
         "device '<object object at .*' is not one of 'cpu', 'cuda', "
         "'cuda:N'"),
        (lambda: client.has_pool_on(-1), shmtensor.InvalidArgumentError,
         "device -1 is not a CUDA device ordinal"),
        (lambda: client.delete("never-bound"), shmtensor.NotFoundError,
         "never-bound"),
        (lambda: client.has_pool_on("gpu:0"), shmtensor.InvalidArgumentError,
         "gpu:0"),
        (lambda: client._put(0, "shape", 0, 0, "", False, None), TypeError,
         r"_put\(\): argument 'shape' has the wrong type \(str\)"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    # Nothing was left behind (but the client's stock of buffers for its
    # puts), and the client works on.
    s = client.stats()
    assert s["leases"] - s["stock_objects"] == 0
    ref = client.put(np.arange(3, dtype=np.int16))
    assert np.asarray(client.get(ref)).tolist() == [0, 1, 2]
    # numpy integers and sequences of them are shapes, as ints are.
    assert client.create(np.int64(3), np.float32).shape == (3,)
    assert client.create([np.int32(2), 3], "torch.float32").shape == (2, 3)


def test_each_native_type_defines_its_attributes_once(client):
    """Buffer, View and Client are native types whose every method and
    property is a native descriptor of the type itself (no pybind11
    function or Python property attached to it): one definition each, with
    a signature and a docstring."""
    info = {"shape", "strides", "dtype_code", "nbytes", "ref_bytes", "device",
            "address", "__array__", "__dlpack__", "__dlpack_device__"}
    expected = {
        shmtensor._core.Buffer: info | {"valid", "seal", "discard"},
        shmtensor._core.View: info | {"writable", "closed", "close",
                                      "populate"},
        shmtensor._core.Client: {
            "create", "create_bytes", "get", "get_many", "delete", "stats",
            "_put", "_put_many", "has_pool_on", "_pool_on", "client_id",
            "daemon_epoch", "address"},
    }
    for native, names in expected.items():
        own = {n for n in vars(native)
               if not n.startswith("__") or n in names}
        assert own == names, (native.__name__, own ^ names)
        for name in names:
            attr = vars(native)[name]
            kind = type(attr).__name__
            assert kind in ("method_descriptor", "getset_descriptor"), (
                native.__name__, name, kind)
            assert attr.__doc__, (native.__name__, name)
            if kind == "method_descriptor":
                assert attr.__text_signature__, (native.__name__, name)
    # Each answers on a live object and fails precisely on a finished one.
    buf = client.create((2, 3), "int16")
    code = buf.dtype_code
    assert (buf.shape, buf.strides, buf.nbytes, buf.device) == (
        (2, 3), (6, 2), 12, "cpu")
    assert buf.valid and buf.address and buf.__dlpack_device__() == (1, 0)
    assert shmtensor.ObjectRef(buf.ref_bytes) == shmtensor.ObjectRef(
        buf.ref_bytes)
    view = client.get(buf.seal())
    assert not buf.valid
    with pytest.raises(shmtensor.PreconditionError, match="sealed"):
        buf.shape
    assert (view.shape, view.dtype_code, view.writable, view.closed) == (
        (2, 3), code, False, False)
    view.close()
    assert view.closed
    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        view.__dlpack_device__()
    assert isinstance(client.client_id, int) and client.address
    # [P15, P20] The session's id is its secret: no attribute shows it.
    assert not hasattr(client, "session_id")
    assert repr(client) == (f"<shmtensor.Client {client.client_id} of "
                            f"{client.address}>")


def test_native_objects_free_what_they_hold(client):
    """Buffer, View and ObjectRef are native types with their own
    allocation: many lifecycles, exports and failures leave no reference,
    lease or object behind, and Buffer and View are made only by the
    client."""
    types = (shmtensor.Buffer, shmtensor.View, shmtensor.ObjectRef,
             shmtensor.Client)
    for cls in (shmtensor.Buffer, shmtensor.View):
        with pytest.raises(TypeError, match="cannot create"):
            cls()
    # Each type's methods in one place: the native ones on the native type,
    # the Python ones on the package's subclass, nothing patched on.
    for cls, native in ((shmtensor.Buffer, shmtensor._core.Buffer),
                        (shmtensor.View, shmtensor._core.View)):
        assert cls.__bases__ == (native,) and cls.__module__ == "shmtensor"
        assert not hasattr(native, "tensor") and "tensor" in vars(cls)
    with client.create(4, "uint8") as b:
        assert type(b) is shmtensor.Buffer
        assert type(client.get(b.seal())) is shmtensor.View
    gc.collect()
    before = [sys.getrefcount(t) for t in types]
    for _ in range(300):
        buf = client.create(1024, "float32")
        np.asarray(buf)[0] = 1.0
        ref = buf.seal()
        view = client.get(ref)
        assert np.asarray(view)[0] == 1.0
        assert memoryview(view)[0] == 1.0
        assert weakref.ref(view)() is view
        del buf, view, ref
        with pytest.raises(shmtensor.InvalidArgumentError):
            client.create((4, -3), "float32")
        with pytest.raises(TypeError):
            client.create(4.5, "float32")
    gc.collect()
    assert [sys.getrefcount(t) for t in types] == before
    stats = client.stats()  # Nothing left but the client's stock.
    assert (stats["leases"] - stats["stock_objects"],
            stats["objects"] - stats["stock_objects"]) == (0, 0)


def test_error_hierarchy():
    for cls in (shmtensor.TimeoutError, shmtensor.PoolExhaustedError,
                shmtensor.StaleReferenceError, shmtensor.NotFoundError,
                shmtensor.InvalidArgumentError,
                shmtensor.DaemonUnavailableError, shmtensor.AlreadyTakenError):
        assert issubclass(cls, shmtensor.Error)
    assert issubclass(shmtensor.StaleReferenceError, shmtensor.NotFoundError)
    assert issubclass(shmtensor.TimeoutError, TimeoutError)
    assert issubclass(shmtensor.InvalidArgumentError, ValueError)
    assert issubclass(shmtensor.DaemonUnavailableError, ConnectionError)


def test_pool_exhausted_message(client):
    hog = client.create(200 << 20, "uint8")
    with pytest.raises(shmtensor.PoolExhaustedError) as e:
        client.create(100 << 20, "uint8", timeout=0.1)
    msg = str(e.value)
    assert "pool 'default'" in msg and "asked for 104857600 bytes" in msg
    assert "holds 209715200 bytes" in msg
    del hog


def test_stats_dict(client):
    client.put(np.ones(4), name="n")
    s = client.stats()
    assert s["sessions"] == 1 and s["named_objects"] == 1
    assert s["pools"][0]["name"] == "default"
    assert s["pools"][0]["size_bytes"] == 256 << 20


def _pool_descriptors():
    """(fd, access mode) of every pool descriptor this process holds, as
    /proc/self/fdinfo says."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:shmtensor:"):
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = next(int(line.split()[1], 8) for line in f
                             if line.startswith("flags:"))
            out.append((int(fd), flags & os.O_ACCMODE))
    return out


def test_a_read_only_session_can_never_write(daemon):
    """connect(read_only=True) in a fresh process: its pool descriptors are
    O_RDONLY, its mappings have no write permission, a writable mmap of a
    descriptor fails with EACCES, and create/put raise; reading works."""
    writer = shmtensor.connect(daemon.address)
    ref = writer.put(np.arange(5.0), name="five")
    code = textwrap.dedent(f"""
        import errno, json, mmap, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import numpy as np, shmtensor
        from test_api import _pool_descriptors
        c = shmtensor.connect({daemon.address!r}, read_only=True)
        fds = _pool_descriptors()
        mmap_errors = []
        for fd, _ in fds:
            try:
                mmap.mmap(fd, 4096, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE)
                mmap_errors.append("ok")
            except OSError as e:
                mmap_errors.append(errno.errorcode[e.errno])
        try:
            c.put(np.ones(3))
            put = "ok"
        except shmtensor.PermissionDeniedError as e:
            put = str(e)
        try:
            c.create(4, "float32")
            create = "ok"
        except shmtensor.PermissionDeniedError as e:
            create = "denied"
        view = np.asarray(c.get("five"))
        with open("/proc/self/maps") as f:
            perms = [l.split()[1] for l in f if "memfd:shmtensor:" in l]
        print(json.dumps(dict(modes=[m for _, m in fds], mmap=mmap_errors,
                              put=put, create=create, read=view.tolist(),
                              perms=perms)))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, env=child_env())
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["modes"] and all(m == os.O_RDONLY for m in r["modes"]), r
    assert r["mmap"] and all(e == "EACCES" for e in r["mmap"]), r
    assert r["perms"] and all("w" not in p for p in r["perms"]), r
    assert "opened read-only" in r["put"], r
    assert r["create"] == "denied"
    assert r["read"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    del ref


def test_a_reader_then_a_writer_in_one_process_share_one_mapping(daemon):
    """A process whose first client is read-only, then opens a writer: the
    writer's descriptor joins the process's one mapping of the pool, and
    both work (and the reverse order, in another process)."""
    code = textwrap.dedent(f"""
        import json, sys
        import numpy as np, shmtensor
        address = {daemon.address!r}
        first_ro = sys.argv[1] == "ro-first"
        a = shmtensor.connect(address, read_only=first_ro)
        b = shmtensor.connect(address, read_only=not first_ro)
        writer, reader = (b, a) if first_ro else (a, b)
        ref = writer.put(np.arange(4.0))
        buf = writer.create(3, "float32")
        np.asarray(buf)[:] = 7
        sealed = buf.seal()
        out = dict(put=np.asarray(reader.get(ref)).tolist(),
                   create=np.asarray(reader.get(sealed)).tolist())
        try:
            reader.put(np.ones(2))
            out["reader_put"] = "ok"
        except shmtensor.PermissionDeniedError:
            out["reader_put"] = "denied"
        with open("/proc/self/maps") as f:
            out["mappings"] = len({{l.split()[4] for l in f
                                    if "memfd:shmtensor:" in l}})
        print(json.dumps(out))
        """)
    for order in ("ro-first", "rw-first"):
        out = subprocess.run([sys.executable, "-c", code, order],
                             capture_output=True, text=True, timeout=60,
                             env=child_env())
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout.strip().splitlines()[-1])
        assert r["put"] == [0.0, 1.0, 2.0, 3.0], (order, r)
        assert r["create"] == [7.0, 7.0, 7.0], (order, r)
        assert r["reader_put"] == "denied", (order, r)
        assert r["mappings"] == 1, (order, r)  # One pool, one memory.


def test_a_limit_gives_a_limit_error_not_a_full_pool(tmp_path):
    cfg = tmp_path / "d.toml"
    cfg.write_text('[[pool]]\nname = "default"\nsize = "16MiB"\n'
                   '[limits]\nmax_sessions_per_uid = 2\n'
                   'max_leases_per_client = 3\n')
    with Daemon(config=str(cfg)) as d:
        c = shmtensor.connect(d.address)
        other = shmtensor.connect(d.address)
        with pytest.raises(shmtensor.LimitExceededError) as e:
            shmtensor.connect(d.address)
        assert not isinstance(e.value, shmtensor.PoolExhaustedError)
        assert "limits.max_sessions_per_uid = 2" in str(e.value)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert e.value.reason == "ERROR_REASON_LIMIT_EXCEEDED"
        refs = [c.put(np.ones(4)) for _ in range(3)]
        with pytest.raises(shmtensor.LimitExceededError) as e:
            c.put(np.ones(4))
        assert "limits.max_leases_per_client = 3" in str(e.value)
        del refs, other


def test_a_meta_tensor_to_put_is_a_type_error_naming_the_device(client):
    with pytest.raises(TypeError) as e:
        client.put(torch.empty(4, device="meta"))
    assert "meta" in str(e.value)


def _pages_present(address, nbytes):
    """Whether every page of [address, address + nbytes) has an entry in
    this process's page table (/proc/self/pagemap)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = address // page, (address + nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    entries = np.frombuffer(raw, dtype=np.uint64)
    return bool(np.all(entries >> np.uint64(62) != 0))


def test_populate_maps_a_read_view_in_one_call(client):
    """view.populate() maps every page of a read view (what a reader about
    to read it all, shmtensor.distributed.broadcast's ranks among them,
    calls); the bytes are as before, a second call changes nothing, and a
    closed view says so."""
    src = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    ref = client.put(src)
    reader = shmtensor.connect(client.address)
    view = reader.get(ref)
    # Nothing read it in this process yet: the put wrote through the
    # other (writable) mapping.
    assert not _pages_present(view.address, src.nbytes)
    assert view.populate() is None
    assert _pages_present(view.address, src.nbytes)
    view.populate()
    np.testing.assert_array_equal(np.asarray(view), src)
    view.close()
    with pytest.raises(shmtensor.PreconditionError, match="closed"):
        view.populate()

