"""CUDA pools from Python: create(device=...), CUDA tensors through
view.tensor() and torch.from_dlpack, put() of CUDA tensors device to device,
across real processes, under the same lease rules as host pools; and
shmtensor.distributed.broadcast of a CUDA tensor into GPU pools (NCCL
between nodes, which needs 2 GPUs).

The GPU tests need a torch with CUDA and a usable GPU (skipped, saying so,
otherwise: Debian's torch is CPU-only); the device-selection errors are
tested everywhere."""

import multiprocessing as mp
import os
import sys
import tempfile
import traceback
from datetime import timedelta

import numpy as np
import pytest

from conftest import Daemon, wait_until

import shmtensor


def test_a_device_without_a_pool_is_a_clear_error(client):
    with pytest.raises(shmtensor.NotFoundError, match=r"no pool on cuda:0"):
        client.create((4,), "float32", device="cuda:0")
    with pytest.raises(shmtensor.NotFoundError, match=r"default \(cpu\)"):
        client.put(np.zeros(4), device="cuda")
    with pytest.raises(shmtensor.InvalidArgumentError, match=r"'gpu'"):
        client.create((4,), "float32", device="gpu")
    assert client.has_pool_on("cpu") and not client.has_pool_on("cuda:0")
    buf = client.create((4,), "float32", device="cpu")
    assert buf.device == "cpu"
    assert buf.__dlpack_device__() == (1, 0)
    ref = buf.seal()
    assert client.get(ref).device == "cpu"


def test_dlpack_keywords_of_newer_consumers(client):
    """DLPack 1.0 consumers (torch >= 2.4) pass max_version, dl_device and
    copy; shmtensor answers with the legacy capsule, refuses a copy or
    another device, saying why."""
    import torch
    buf = client.create((8,), "float32")
    cap = buf.__dlpack__(stream=None, max_version=(1, 0))
    t = torch.from_dlpack(cap)
    assert t.data_ptr() == buf.address
    del t, cap
    view = client.get(buf.seal())
    with pytest.raises(BufferError, match="the bytes are on cpu"):
        view.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy=True"):
        view.__dlpack__(copy=True)
    assert torch.from_dlpack(view.__dlpack__(dl_device=(1, 0), copy=False)
                             ).data_ptr() == view.address


def _why_no_gpu():
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


@pytest.fixture
def gpu_client(tmp_path):
    why = _why_no_gpu()
    if why:
        pytest.skip(f"GPU tests skipped: {why}")
    config = tmp_path / "gpu.toml"
    config.write_text('[[pool]]\nname = "host"\nsize = "64MiB"\n'
                      '[[pool]]\nname = "gpu0"\nsize = "1GiB"\n'
                      'kind = "cuda"\ndevice = 0\n')
    d = Daemon(config=str(config))
    try:
        c = shmtensor.connect(d.address)
        if not c.has_pool_on("cuda:0"):
            pytest.skip("the daemon could not create its CUDA pool")
        yield d, c
    finally:
        d.kill()


def gpu_used(c):
    return c.stats()["pools"][1]["used_bytes"]


def test_create_fill_seal_get_on_the_gpu(gpu_client):
    import torch
    _, c = gpu_client
    buf = c.create((256, 1024), torch.float32, device="cuda:0")
    assert buf.device == "cuda:0" and buf.__dlpack_device__() == (2, 0)
    t = buf.tensor()
    assert t.is_cuda and t.data_ptr() == buf.address
    t.copy_(torch.arange(256 * 1024, dtype=torch.float32,
                         device="cuda").view(256, 1024))
    del t
    ref = buf.seal()
    view = c.get(ref)
    v = view.tensor()
    assert v.device == torch.device("cuda:0")
    assert v.data_ptr() == view.address  # Zero-copy.
    assert torch.equal(v.cpu().flatten(), torch.arange(256 * 1024,
                                                       dtype=torch.float32))
    with pytest.raises(RuntimeError):
        v.add_(1)  # A shared object's tensor is read-only.
    with pytest.raises(TypeError, match="CUDA memory"):
        np.asarray(view)
    d = torch.from_dlpack(view)
    assert d.data_ptr() == view.address
    del v, d, view, ref
    assert wait_until(lambda: gpu_used(c) == 0, 2.0)


def test_put_of_a_cuda_tensor_copies_device_to_device(gpu_client):
    import torch
    _, c = gpu_client
    src = torch.randn(1 << 20, device="cuda")
    ref = c.put(src)  # To the GPU pool of its own device.
    assert gpu_used(c) >= src.numel() * 4
    view = c.get(ref)
    t = view.tensor()
    assert t.is_cuda and t.data_ptr() != src.data_ptr()
    assert torch.equal(t, src)
    # device="cpu" puts it in host memory instead.
    host_ref = c.put(src, device="cpu")
    assert np.array_equal(np.asarray(c.get(host_ref)), src.cpu().numpy())


def _consumer(address, ref, queue):
    import torch
    c = shmtensor.connect(address)
    view = c.get(ref)
    t = view.tensor()
    if view.writable:
        t.mul_(2)  # The one consumer of a hand-off may write.
    queue.put((str(t.device), float(t.double().sum().item()), view.writable))


def test_another_process_reads_and_takes_gpu_objects(gpu_client):
    import torch
    d, c = gpu_client
    ctx = mp.get_context("spawn")  # CUDA does not survive fork.
    src = torch.ones(1 << 20, device="cuda")
    for exclusive in (False, True):
        ref = c.put(src, exclusive=exclusive)
        q = ctx.Queue()
        p = ctx.Process(target=_consumer, args=(d.address, ref, q))
        p.start()
        device, total, writable = q.get(timeout=60)
        p.join(60)
        assert device == "cuda:0"
        assert writable == exclusive
        assert total == (2 if exclusive else 1) * (1 << 20)
        del ref
    assert wait_until(lambda: gpu_used(c) == 0, 2.0)


def _gpu_rank(rank, world, init_file, addresses, node_of_rank, devices,
              results):
    try:
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(devices[rank])
        os.environ["SHMTENSOR_ADDRESS"] = addresses[node_of_rank[rank]]
        dist.init_process_group("gloo", init_method=f"file://{init_file}",
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        import shmtensor.distributed as sd
        x = (torch.arange(1 << 20, dtype=torch.float32,
                          device=f"cuda:{devices[rank]}")
             if rank == 0 else None)
        t = sd.broadcast(x, src=0, name="gpu-weights")
        try:
            t.add_(1)
            writable = True
        except RuntimeError:
            writable = False
        c = shmtensor.connect(addresses[node_of_rank[rank]])
        results.put({"rank": rank, "device": str(t.device),
                     "sum": float(t.double().sum()), "writable": writable,
                     "gpu_objects": c.stats()["pools"][1]["objects"]})
        dist.barrier()
        del t
        dist.barrier()
    except Exception:  # noqa: BLE001 - reported to the test.
        results.put({"rank": rank, "crash": traceback.format_exc()})


def _broadcast_on_gpus(tmp_path, node_of_rank, devices):
    """Runs one GPU broadcast from rank 0 over len(devices) ranks (spawned),
    a daemon per node with a CUDA pool on its ranks' device; returns the
    ranks' reports in rank order."""
    nodes = sorted(set(node_of_rank))
    daemons = []
    try:
        for n in nodes:
            dev = devices[node_of_rank.index(n)]
            config = tmp_path / f"node{n}.toml"
            config.write_text('[[pool]]\nname = "host"\nsize = "64MiB"\n'
                              '[[pool]]\nname = "gpu"\nsize = "256MiB"\n'
                              f'kind = "cuda"\ndevice = {dev}\n')
            daemons.append(Daemon(config=str(config)))
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        init_file = tempfile.mktemp(dir=tmp_path)
        world = len(devices)
        procs = [ctx.Process(target=_gpu_rank,
                             args=(r, world, init_file,
                                   [d.address for d in daemons], node_of_rank,
                                   devices, results))
                 for r in range(world)]
        for p in procs:
            p.start()
        reports = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        for r in reports:
            assert "crash" not in r, r["crash"]
        return sorted(reports, key=lambda r: r["rank"])
    finally:
        for d in daemons:
            d.kill()


def test_broadcast_of_a_cuda_tensor_is_one_gpu_copy_per_node(gpu_client,
                                                             tmp_path):
    n = 1 << 20
    reports = _broadcast_on_gpus(tmp_path, [0, 0], [0, 0])
    for r in reports:
        assert r["device"] == "cuda:0"
        assert r["sum"] == n * (n - 1) / 2
        assert not r["writable"]
        assert r["gpu_objects"] == 1  # One copy, in the GPU pool.


def test_broadcast_between_nodes_goes_over_nccl_into_gpu_pools(gpu_client,
                                                               tmp_path):
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: NCCL refuses two ranks of one group on "
                    "one GPU, and each simulated node's leader needs its own")
    n = 1 << 20
    reports = _broadcast_on_gpus(tmp_path, [0, 0, 1, 1], [0, 0, 1, 1])
    for r in reports:
        assert r["device"] == f"cuda:{[0, 0, 1, 1][r['rank']]}"
        assert r["sum"] == n * (n - 1) / 2
        assert not r["writable"]
        assert r["gpu_objects"] == 1


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
