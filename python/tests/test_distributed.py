"""shmtensor.distributed.broadcast: 4 ranks (Gloo) on this machine, simulated
as 2 nodes, each with its own daemon: ranks 0 and 1 on node A, 2 and 3 on
node B."""

import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch

import shmtensor
from conftest import Daemon, used, wait_until

WORLD = 4
NODE_OF_RANK = [0, 0, 1, 1]


def _rank_main(rank, init_file, addresses, scenario, results, go):
    try:
        import torch.distributed as dist
        if scenario == "autostart":
            # No daemon anywhere: addresses[0] is the ranks' own
            # $XDG_RUNTIME_DIR, where none runs.
            os.environ.pop("SHMTENSOR_ADDRESS", None)
            os.environ["XDG_RUNTIME_DIR"] = addresses[0]
            os.environ["SHMTENSOR_POOL_SIZE"] = "64MiB"
        else:
            os.environ["SHMTENSOR_ADDRESS"] = addresses[NODE_OF_RANK[rank]]
        dist.init_process_group("gloo", init_method=f"file://{init_file}",
                                rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=20))
        import shmtensor.distributed as sd
        if scenario in ("basic", "src3"):
            src = 0 if scenario == "basic" else 3
            layout = sd.plan(src=src)
            x = (torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024)
                 if rank == src else None)
            t = sd.broadcast(x, src=src, name="weights")
            a = (np.arange(3000, dtype=np.uint16).reshape(30, 100)
                 if rank == src else None)
            n = sd.broadcast(a, src=src, name="index")
            try:
                t.add_(1)
                writable = True
            except RuntimeError:
                writable = False
            results.put({
                "rank": rank, "pid": os.getpid(), "leaders": layout.leaders,
                "nodes": layout.nodes, "dtype": str(t.dtype),
                "shape": tuple(t.shape), "sum": float(t.double().sum()),
                "tensor_writable": writable, "np_dtype": n.dtype.str,
                "np_shape": n.shape, "np_sum": int(n.sum()),
                "np_writable": n.flags.writeable})
            go.wait(60)
            del t, n
            dist.barrier()
            results.put({"rank": rank, "done": True})
        elif scenario == "autostart":
            from shmtensor import _autostart
            x = torch.arange(4096, dtype=torch.float32) if rank == 0 else None
            t = sd.broadcast(x, src=0, name="weights")
            layout = sd.plan(src=0)
            results.put({"rank": rank, "nodes": layout.nodes,
                         "sum": float(t.sum()),
                         "own": _autostart.private_daemon(),
                         "address": os.environ.get("SHMTENSOR_ADDRESS")})
            del t
            dist.barrier()
        elif scenario == "takeover":
            # A broadcast, then both nodes' daemons are taken over (the test
            # does it while the ranks wait), then another.
            x = (torch.arange(1 << 18, dtype=torch.float32)
                 if rank == 0 else None)
            t = sd.broadcast(x, src=0, name="before")
            results.put({"rank": rank, "sum": float(t.double().sum())})
            go.wait(60)
            y = (torch.arange(1 << 18, dtype=torch.float32) * 2
                 if rank == 0 else None)
            u = sd.broadcast(y, src=0, name="after")
            results.put({"rank": rank, "before": float(t.double().sum()),
                         "after": float(u.double().sum())})
            del t, u
            dist.barrier()
        elif scenario == "slow":
            # Ranks 1 and 3 get a second after the others: the source and
            # rank 2 (node 1's leader) have returned and dropped theirs by
            # then, and rank 0 has exited.
            others = dist.new_group([1, 2, 3])  # Collective: made by all.
            if rank in (1, 3):
                sd.local_client = _SlowGets.wrapping(sd.local_client)
            x = (torch.arange(1 << 20, dtype=torch.float32)
                 if rank == 0 else None)
            t = sd.broadcast(x, src=0, name="slow")
            sum_ = float(t.double().sum())
            del t
            out = {"rank": rank, "sum": sum_}
            if rank == 0:
                # Its barrier waits for ranks 1 and 3 still: a child forked
                # now inherits none to wait for at its exit.
                out["pending"] = len(sd._pending_barriers)
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.write(w, bytes([len(sd._pending_barriers)]))
                    os._exit(0)
                os.waitpid(pid, 0)
                out["pending_in_child"] = os.read(r, 1)[0]
                os.close(r)
                os.close(w)
            results.put(out)
            if rank != 0:
                dist.barrier(group=others)
                results.put({"rank": rank, "done": True})
        elif scenario == "mismatch":
            try:
                sd.broadcast(torch.ones(4) if rank == 0 else None, src=0,
                             name="b" if rank == 1 else "a")
                results.put({"rank": rank, "error": None})
            except ValueError as e:
                results.put({"rank": rank, "error": str(e)})
        elif scenario == "killed":
            if rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.monotonic()
            try:
                sd.broadcast(torch.ones(1 << 20) if rank == 0 else None,
                             src=0, name="doomed")
                results.put({"rank": rank, "error": None})
            except RuntimeError as e:
                results.put({"rank": rank, "error": str(e),
                             "seconds": time.monotonic() - t0})
    except Exception:  # noqa: BLE001 - reported to the test.
        results.put({"rank": rank, "crash": traceback.format_exc()})


class _SlowGets:
    """A client whose gets start a second late."""

    def __init__(self, client):
        self._client = client

    @classmethod
    def wrapping(cls, local_client):
        return lambda *a, **k: cls(local_client(*a, **k))

    def get(self, *args, **kwargs):
        time.sleep(1.0)
        return self._client.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


class TwoNodes:
    def __init__(self):
        self.daemons = [Daemon("64MiB"), Daemon("64MiB")]
        self.clients = [shmtensor.connect(d.address) for d in self.daemons]

    def run(self, scenario, addresses=None):
        ctx = mp.get_context("spawn")
        self.results, self.go = ctx.Queue(), ctx.Event()
        # torch's FileStore rendezvous file; close() removes it.
        self.init = init = tempfile.mktemp(prefix="shmtensor-dist-")
        self.procs = [ctx.Process(target=_rank_main,
                                  args=(r, init, addresses or
                                        [d.address for d in self.daemons],
                                        scenario, self.results, self.go))
                      for r in range(WORLD)]
        for p in self.procs:
            p.start()

    def collect(self, n, timeout=120):
        out = [self.results.get(timeout=timeout) for _ in range(n)]
        for r in out:
            assert "crash" not in r, r["crash"]
        return sorted(out, key=lambda r: r["rank"])

    def close(self):
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        for d in self.daemons:
            d.kill()
        if getattr(self, "init", None) and os.path.exists(self.init):
            os.unlink(self.init)


@pytest.fixture
def nodes():
    n = TwoNodes()
    yield n
    n.close()


@pytest.mark.parametrize("scenario,leaders",
                         [("basic", [0, 2]), ("src3", [0, 3])])
def test_one_copy_per_node_identical_read_only_views(nodes, scenario,
                                                     leaders):
    nodes.run(scenario)
    got = nodes.collect(WORLD)
    expected_sum = float(torch.arange(1 << 20, dtype=torch.float64).sum())
    for r in got:
        assert r["nodes"] == [[0, 1], [2, 3]]
        assert r["leaders"] == leaders
        assert (r["dtype"], r["shape"]) == ("torch.float32", (1024, 1024))
        assert r["sum"] == expected_sum
        assert not r["tensor_writable"]
        assert (r["np_dtype"], r["np_shape"]) == ("<u2", (30, 100))
        assert r["np_sum"] == int(np.arange(3000).sum())
        assert not r["np_writable"]
    # One copy of each broadcast per daemon, while every rank holds views.
    for c in nodes.clients:
        s = c.stats()
        assert s["objects"] == 2, s
        assert used(c) == (4 << 20) + 8192, s  # 4 MiB + 6000 B page-rounded.
    # Every rank dropped its views: the memory is back on both nodes.
    nodes.go.set()
    nodes.collect(WORLD)
    for c in nodes.clients:
        assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_a_rank_that_gets_late_finds_the_data_the_others_dropped(nodes):
    nodes.run("slow")
    expected = float(np.arange(1 << 20, dtype=np.float64).sum())
    got = nodes.collect(WORLD)
    assert [r["sum"] for r in got] == [expected] * WORLD, got
    assert (got[0]["pending"], got[0]["pending_in_child"]) == (1, 0), got[0]
    nodes.procs[0].join(30)
    assert nodes.procs[0].exitcode == 0
    nodes.collect(WORLD - 1)
    for c in nodes.clients:  # Every rank dropped its view: all returned.
        assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_mismatched_calls_fail_on_every_rank(nodes):
    nodes.run("mismatch")
    got = nodes.collect(WORLD)
    for r in got:
        assert r["error"] and "mismatched" in r["error"], r
        assert "rank 1: name='b' src=0" in r["error"], r
    for c in nodes.clients:
        assert c.stats()["objects"] == 0


def test_a_killed_rank_fails_the_others_not_hangs(nodes):
    nodes.run("killed")
    got = nodes.collect(WORLD - 1, timeout=90)
    for r in got:
        assert r["error"], r
        assert r["seconds"] < 40, r  # Within the group's timeout (20 s).
    for p in nodes.procs:
        p.join(30)
    for c in nodes.clients:  # Whatever the source published is reclaimed.
        assert wait_until(lambda: used(c) == 0, 5.0), c.stats()


def test_ranks_without_a_daemon_share_one_their_lowest_rank_starts(nodes, tmp_path):
    run = tempfile.mkdtemp(prefix="st-run-", dir="/tmp")
    try:
        nodes.run("autostart", addresses=[run])
        got = nodes.collect(WORLD)
        owner = got[0]["own"]
        assert owner is not None and owner[1] == got[0]["address"]
        for r in got:
            # One host, one daemon: one node of every rank, one copy.
            assert r["nodes"] == [[0, 1, 2, 3]], r
            assert r["sum"] == float(sum(range(4096)))
            assert r["address"] == owner[1]
            assert r["own"] is None or r["rank"] == 0
        for p in nodes.procs:
            p.join(30)
        # It ended with rank 0 and left nothing.
        assert wait_until(lambda: os.listdir(run) == [], 10.0), os.listdir(run)
    finally:
        import shutil
        shutil.rmtree(run, ignore_errors=True)


def test_broadcast_gives_the_same_data_across_a_take_over(nodes):
    nodes.run("takeover")
    expected = float(np.arange(1 << 18, dtype=np.float64).sum())
    assert [r["sum"] for r in nodes.collect(WORLD)] == [expected] * WORLD
    for d in nodes.daemons:
        d.take_over()
    nodes.go.set()
    for r in nodes.collect(WORLD):
        assert r["before"] == expected and r["after"] == 2 * expected, r
