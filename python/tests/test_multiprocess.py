"""Real processes: refs through multiprocessing queues, fork safety, readers
outliving their producer."""

import multiprocessing as mp
import os
import pickle
import time

import numpy as np
import pytest
import torch

import shmtensor
from conftest import spawn_python, used, wait_until


def _consumer(address, queue, results):
    c = shmtensor.connect(address)
    ref = queue.get()
    view = c.get(ref)
    results.put(float(np.asarray(view).sum()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_ref_through_multiprocessing_queue(client, daemon, method):
    ctx = mp.get_context(method)
    queue, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(daemon.address, queue, results))
    proc.start()
    ref = client.put(np.arange(1000.0))
    queue.put(ref)
    assert results.get(timeout=60) == sum(range(1000))
    proc.join(30)
    assert proc.exitcode == 0


def _forked_child(parent_client, address, results):
    try:
        parent_client.stats()
        results.put("inherited client worked")
        return
    except shmtensor.PreconditionError as e:
        inherited = str(e)
    own = shmtensor.connect(address)
    ref = own.put(np.full(8, 3.0), exclusive=True)
    results.put((inherited, own.client_id, ref))
    # Keep the session (and so the untaken transfer) while the parent takes it.
    time.sleep(2)


def test_fork_gives_child_its_own_session_and_spares_the_parent(client, daemon):
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    proc = ctx.Process(target=_forked_child,
                       args=(client, daemon.address, results))
    proc.start()
    inherited, child_session, ref = results.get(timeout=60)
    assert "fork" in inherited
    assert child_session != client.client_id
    view = client.get(ref)  # The parent takes the child's hand-off.
    assert view.writable and np.asarray(view).tolist() == [3.0] * 8
    proc.join(30)
    assert proc.exitcode == 0
    # The child's session ended with its process.
    assert wait_until(lambda: client.stats()["sessions"] == 1)
    assert np.asarray(client.get(client.put(np.ones(2)))).sum() == 2


READER = (
    "import pickle, sys, numpy as np, shmtensor\n"
    "c = shmtensor.connect()\n"
    "v = c.get(pickle.loads(bytes.fromhex(sys.argv[1])))\n"
    "a = np.asarray(v)\n"
    "print('got', flush=True)\n"
    "sys.stdin.readline()\n"  # Until the producer is gone.
    "print('sum', int(a.sum()), flush=True)\n")

PRODUCER = (
    "import pickle, sys, numpy as np, shmtensor\n"
    "c = shmtensor.connect()\n"
    "ref = c.put(np.arange(1 << 20, dtype=np.int64))\n"
    "print(pickle.dumps(ref).hex(), flush=True)\n"
    "sys.stdin.readline()\n")


def test_two_readers_outlive_their_producer(client, daemon):
    producer = spawn_python(PRODUCER, daemon.address)
    ref_hex = producer.stdout.readline().strip()
    readers = [spawn_python(READER, daemon.address, ref_hex) for _ in range(2)]
    for r in readers:
        assert r.stdout.readline().strip() == "got", r.stderr.read()
    producer.kill()
    producer.wait()
    expected = sum(range(1 << 20))
    for r in readers:
        out, err = r.communicate("go\n", timeout=60)
        assert out.strip().endswith(f"sum {expected}"), err
    assert wait_until(lambda: used(client) == 0)


def _forked_taker(address, q, done):
    # As torch's DataLoader workers do: GNU OpenMP (PyPI's torch) cannot
    # run a parallel region in a child forked after the parent ran one
    # (the child hangs or crashes in its first sum), whatever shmtensor does.
    torch.set_num_threads(1)
    own = shmtensor.connect(address)
    done.put("ready")
    total = 0.0
    for _ in range(5):
        view = own.get(q.get())
        total += float(view.tensor().sum())
        del view
    done.put(total)


def test_parent_and_forked_child_use_grpc_at_once(client, daemon):
    # Regression: with gRPC's epoll poller, parent and child shared one
    # epoll instance after fork, and the parent's session broke as soon as
    # both were active.
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(maxsize=2), ctx.Queue()
    proc = ctx.Process(target=_forked_taker, args=(daemon.address, q, done))
    proc.start()
    assert done.get(timeout=60) == "ready"
    session = client.client_id
    for i in range(5):
        ref = client.put(np.full(1 << 18, float(i), dtype=np.float32),
                         exclusive=True)
        # Both sessions alive. Asked before the child has its last ref: once
        # it has, it may finish and end its session before the answer.
        assert client.stats()["sessions"] == 2
        q.put(ref)
    assert done.get(timeout=60) == sum(i * (1 << 18) for i in range(5))
    proc.join(30)
    assert proc.exitcode == 0 and client.client_id == session
    assert client.stats()["pending_transfers"] == 0
