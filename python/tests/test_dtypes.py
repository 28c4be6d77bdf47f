"""Every dtype round-trips exactly with NumPy and with torch; zero-copy is
asserted by address."""

import gc
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import shmtensor
from conftest import child_env, proto_enum
from shmtensor import _core

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


def test_the_dtype_table_is_the_protos():
    """The package's codes come from one table (the C++ one, via _core); it
    and the proto's DType enum name the same codes the same way, so a dtype
    added to one and not the other fails here."""
    from shmtensor import _dtypes
    proto = {code: name.lower()
             for code, name in proto_enum("DType", "DTYPE_").items()}
    table = {row[0]: row[1] for row in _dtypes.TABLE}
    assert table == {code: "bytes" if code == 0 else name
                     for code, name in proto.items()}
    for code, name, itemsize, _, numpy_name, has_torch in _dtypes.TABLE:
        if code == 0:
            continue
        if numpy_name is not None:  # NumPy has it (all but bfloat16).
            assert _dtypes.numpy_dtype(code) == np.dtype(name)
            assert np.dtype(name).itemsize == itemsize
            assert _core._dtype_code(name) == code
        if has_torch:
            assert _dtypes.torch_dtype(code) == getattr(torch, name)
            assert _core._dtype_code(getattr(torch, name)) == code
            assert torch.empty((), dtype=getattr(torch, name)).element_size() == itemsize
        else:  # uint16/32/64: arrays, never tensors (torch 1.13 lacks them).
            assert _dtypes.torch_dtype(code) is None


def test_float_means_what_numpy_says():
    """One answer to what a dtype spelling means: the binding parses it in
    C++ (ParseDType) where the table spells it, and asks NumPy for the rest,
    so "float" is float64 and every spelling agrees with numpy.dtype."""
    from shmtensor import _dtypes
    assert _core._dtype_code("float") == _core._dtype_code(np.dtype(float))
    assert _dtypes.numpy_dtype(_core._dtype_code("float")) == np.float64
    spellings = ["float", "int", "f", "d", "i8", "=f4", "|u1", "?", "b1",
                 "double", "single", "half", "short", "intc", "longlong",
                 "complex", "bool", "uint8", np.float32, np.bool_,
                 np.longlong, float, int, bool, complex, None]
    for s in spellings:
        d = np.dtype(s)
        assert _dtypes.numpy_dtype(_core._dtype_code(s)) == d, s


def test_torch_names_and_aliases_mean_what_torch_says():
    """A torch dtype, its name and torch's aliases of it ("torch.float" is
    float32, not NumPy's float64) give one code; torch types the table
    lacks, or has for NumPy only, are refused naming them."""
    from shmtensor import _dtypes
    for alias in ["float", "double", "half", "long", "int", "short", "cfloat",
                  "cdouble", "float32", "bfloat16", "bool", "uint8"]:
        t = getattr(torch, alias)
        code = _core._dtype_code(t)
        assert _core._dtype_code("torch." + alias) == code, alias
        assert _dtypes.torch_dtype(code) == t, alias
    refused = ["complex32", "uint16", "uint32", "quint8", "float8_e4m3fn"]
    for name in refused:
        t = getattr(torch, name, None)
        for spelling in ([t] if t is not None else []) + ["torch." + name]:
            with pytest.raises(shmtensor.InvalidArgumentError,
                               match=f"torch.{name}' has no shmtensor "
                                     f"equivalent"):
                _core._dtype_code(spelling)


def test_the_binding_never_imports_numpy_or_torch_for_a_dtype():
    """A torch name is parsed by the table: naming one never imports torch
    (which costs seconds), and a process without torch can still say
    "torch.float32"."""
    code = """
import sys, shmtensor
from shmtensor import _core
assert "torch" not in sys.modules
assert _core._dtype_code("torch.float32") == 9
assert _core._dtype_code("torch.half") == 7
assert _core._device_name("cuda") == "cuda:0"
assert "torch" not in sys.modules
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=child_env(), timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr

def test_put_reads_each_arrays_own_dtype_whatever_dtypes_went_before(client):
    # The binding remembers dtype objects by identity (put() reads one per
    # array): dtype objects that come and go (each unpickled one is new, and
    # a freed one's address is soon another's) must never lend an array
    # another's dtype. More kinds than it remembers, in turn.
    kinds = ["int8", "float32", "int64", "float64", "uint16", "int32",
             "float16", "uint8", "int16", "complex64", "bool", "complex128",
             "uint32", "uint64", "float32", "int8", "int64", "float64"]
    for i in range(3 * len(kinds)):
        dtype = pickle.loads(pickle.dumps(np.dtype(kinds[i % len(kinds)])))
        a = (np.arange(6) % 2).astype(dtype)
        assert a.dtype is dtype  # The array's own dtype object: a new one.
        got = np.asarray(client.get(client.put(a)))
        assert got.dtype == np.dtype(kinds[i % len(kinds)]), i
        assert np.array_equal(got, a), i
        del dtype, a, got
        gc.collect()


def test_put_copies_what_a_tensor_means_not_how_it_is_laid_out(client):
    # The ways a tensor's memory differs from its values: a lazy conjugate
    # or negation, strides, a graph, no dimensions at all.
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    x = torch.arange(12.0).reshape(3, 4)
    cases = [z.conj(), torch.tensor([1.0, -2.0])._neg_view(), x.T, x[:, ::2],
             (x * torch.ones(1, requires_grad=True)).T, torch.tensor(2.5)]
    assert cases[0].is_conj() and cases[1].is_neg()
    for t in cases:
        got = client.get(client.put(t)).tensor()
        want = t.detach().resolve_conj().resolve_neg()
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)
    for a in (np.float32(3.5), np.array(5.0), np.arange(6.0)[::-2]):
        got = np.asarray(client.get(client.put(a)))
        assert got.shape == np.shape(a) and np.array_equal(got, a)
