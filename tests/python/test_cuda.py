"""CUDA pools from Python: create(device=...), CUDA tensors through
view.tensor() and torch.from_dlpack, put() of CUDA tensors device to device,
across real processes, under the same lease rules as host pools.

The GPU tests need a torch with CUDA and a usable GPU (skipped, saying so,
otherwise: Debian's torch is CPU-only); the device-selection errors are
tested everywhere."""

import multiprocessing as mp
import sys

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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
