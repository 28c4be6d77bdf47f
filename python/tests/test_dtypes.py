"""Every dtype round-trips exactly with NumPy and with torch; zero-copy is
asserted by address."""

import numpy as np
import pytest
import torch

import shmtensor

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16",
                "float32", "float64", "complex64", "complex128", "uint16",
                "uint32", "uint64"]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                torch.int64, torch.float16, torch.bfloat16, torch.float32,
                torch.float64, torch.complex64, torch.complex128]


def sample_numpy(dtype):
    rng = np.random.default_rng(1)
    if dtype == "bool":
        return rng.integers(0, 2, size=(3, 5)).astype(bool)
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=(3, 5), dtype=dt,
                            endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal((3, 5)) + 1j * rng.standard_normal((3, 5))).astype(dt)
    return rng.standard_normal((3, 5)).astype(dt)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_dtype_round_trips(client, dtype):
    src = sample_numpy(dtype)
    view = client.get(client.put(src))
    out = np.asarray(view)
    assert out.dtype == src.dtype and out.shape == src.shape
    assert out.tobytes() == src.tobytes()  # Bit-exact, NaN payloads included.
    assert out.__array_interface__["data"][0] == view.address  # Zero-copy.
    assert view.dtype == src.dtype


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtype_round_trips(client, dtype):
    if dtype.is_complex:
        src = torch.randn(3, 5, dtype=dtype)
    elif dtype.is_floating_point:
        src = torch.randn(3, 5).to(dtype)
    elif dtype == torch.bool:
        src = torch.rand(3, 5) > 0.5
    else:
        src = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (3, 5),
                            dtype=dtype)
    view = client.get(client.put(src))
    out = view.tensor()
    assert out.dtype == dtype and out.shape == src.shape
    assert torch.equal(out, src)
    assert out.data_ptr() == view.address  # Zero-copy.


@pytest.mark.parametrize("name,code", [
    ("float32", 9), ("f4", 9), ("<f8", 10), ("float", 10), ("int", 6),
    ("bfloat16", 8), ("torch.float16", 7), ("torch.int64", 6),
])
def test_dtype_names(client, name, code):
    assert client.create(2, name).dtype_code == code


@pytest.mark.parametrize("spec,numpy_dtype,torch_dtype", [
    (np.float32, np.float32, torch.float32),
    (np.dtype("uint16"), np.uint16, None),
    (torch.int8, np.int8, torch.int8),
    (torch.bfloat16, None, torch.bfloat16),
    ("complex128", np.complex128, torch.complex128),
], ids=str)
def test_create_accepts_numpy_torch_and_names(client, spec, numpy_dtype,
                                              torch_dtype):
    buf = client.create((2, 3), spec)
    if numpy_dtype is not None:
        a = np.asarray(buf)
        assert a.dtype == numpy_dtype and a.shape == (2, 3)
        del a
    if torch_dtype is not None:
        t = buf.tensor()
        assert t.dtype == torch_dtype and t.shape == (2, 3)


def test_unknown_dtype_names_the_value(client):
    with pytest.raises(shmtensor.InvalidArgumentError, match="'float7'"):
        client.create(2, "float7")
    with pytest.raises(shmtensor.InvalidArgumentError, match="'torch.nope'"):
        client.create(2, "torch.nope")


def test_zero_copy_through_buffer_and_dlpack(client):
    buf = client.create((256, 256), "float32")
    a = np.asarray(buf)
    t = buf.tensor()
    assert a.__array_interface__["data"][0] == buf.address == t.data_ptr()
    t.fill_(3.0)  # A write through the tensor shows in the array: one memory.
    assert a[255, 255] == 3.0
    del a, t
    view = client.get(buf.seal())
    assert torch.from_dlpack(view).data_ptr() == view.address


def _proto_dtypes():
    """{code: name} of the wire enum, read from the repository's proto."""
    import os
    import re
    from conftest import REPO
    with open(os.path.join(REPO, "proto", "shmtensor", "v1",
                           "shmtensor.proto")) as f:
        text = f.read()
    body = re.search(r"enum DType \{(.*?)\}", text, re.S).group(1)
    return {int(code): name.lower() for name, code in
            re.findall(r"^\s*DTYPE_(\w+)\s*=\s*(\d+);", body, re.M)}


def test_the_dtype_table_is_the_protos():
    """The package's codes come from one table (the C++ one, via _core); it
    and the proto's DType enum name the same codes the same way, so a dtype
    added to one and not the other fails here."""
    from shmtensor import _dtypes
    proto = _proto_dtypes()
    table = {row[0]: row[1] for row in _dtypes.TABLE}
    assert table == {code: "bytes" if code == 0 else name
                     for code, name in proto.items()}
    for code, name, itemsize, _, numpy_name, has_torch in _dtypes.TABLE:
        if code == 0:
            continue
        if numpy_name is not None:  # NumPy has it (all but bfloat16).
            assert _dtypes.numpy_dtype(code) == np.dtype(name)
            assert np.dtype(name).itemsize == itemsize
            assert _dtypes.dtype_code(name) == code
        if has_torch:
            assert _dtypes.torch_dtype(code) == getattr(torch, name)
            assert _dtypes.code_of_torch(getattr(torch, name)) == code
            assert torch.empty((), dtype=getattr(torch, name)).element_size() == itemsize
        else:  # uint16/32/64: arrays, never tensors (torch 1.13 lacks them).
            assert _dtypes.torch_dtype(code) is None


def test_float_means_what_numpy_says():
    """One answer to what "float" means: NumPy's (float64), in every call
    that takes a dtype string; C++ parses no dtype strings at all."""
    from shmtensor import _dtypes
    assert _dtypes.dtype_code("float") == _dtypes.dtype_code(np.dtype(float))
    assert _dtypes.numpy_dtype(_dtypes.dtype_code("float")) == np.float64
