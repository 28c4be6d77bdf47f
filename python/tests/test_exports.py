"""[P10] Every pointer into pool memory that leaves the package is known to
the lease it points into: an array, a tensor, a DLPack capsule or a
buffer-protocol export counts itself there while it lives; a raw address
escapes (it marks the lease). The lease alone decides from that whether a seal
write-protects the memory at once (client/lease_address.h), so a write
through any of them never changes a sealed object.

test_every_attribute_that_returns_memory_is_counted walks every attribute
of Buffer and View: one added without being classified here fails it."""

import gc
import signal

import numpy as np
import pytest
import torch

import shmtensor
from conftest import run_python
from shmtensor import _core

# How each attribute of Buffer and View hands out memory: "counted" (what
# it returns counts itself in the lease while it lives), "escaped" (a raw
# address: the lease is marked), or None (no memory: it returns a value, a
# ref, the object itself, or changes its state).
KINDS = {
    "address": "escaped",
    "__array__": "counted",
    "__dlpack__": "counted",
    "__buffer__": "counted",  # Python 3.12+ (PEP 688): the buffer protocol.
    "numpy": "counted",
    "tensor": "counted",
    "shape": None,
    "strides": None,
    "dtype": None,
    "dtype_code": None,
    "nbytes": None,
    "ref_bytes": None,
    "device": None,
    "__dlpack_device__": None,
    "valid": None,
    "seal": None,
    "discard": None,
    "writable": None,
    "closed": None,
    "close": None,
    "populate": None,  # Maps the pages; returns None, hands nothing out.
    "ref": None,
    "__repr__": None,
    "__enter__": None,
    "__exit__": None,
}
# Definitions every type has, not attributes of a buffer or view.
GENERIC = {"__module__", "__doc__", "__slots__", "__new__", "__init__",
           "__weaklistoffset__", "__qualname__", "__dict__", "__weakref__",
           "__getattribute__",
           # Python 3.13 records these for every class statement.
           "__firstlineno__", "__static_attributes__"}
# State-changing attributes: classified, called on an object of their own.
STATEFUL = {"seal", "discard", "close", "__enter__", "__exit__"}


def own_attributes(cls):
    """The attributes the package's class and its native base define."""
    names = set()
    for c in cls.__mro__:
        if c is object:
            continue
        names |= set(vars(c))
    return names - GENERIC


def is_memory(value, obj_address, nbytes):
    if isinstance(value, (np.ndarray, torch.Tensor, memoryview)):
        return True
    if type(value).__name__ == "PyCapsule":
        return True
    return (isinstance(value, int) and not isinstance(value, bool) and
            obj_address <= value < obj_address + max(nbytes, 1))


def check_attributes(obj, fresh, address):
    exports0, _ = _core._exports_of(obj)
    for name in sorted(own_attributes(type(obj))):
        assert name in KINDS, (
            f"{type(obj).__name__}.{name} is not classified: does it hand out "
            f"memory? Count it (a LeaseExport) or mark it escaped, and add "
            f"it to KINDS")
        kind = KINDS[name]
        if kind == "escaped":
            continue  # Taken last, below: it marks the lease for good.
        target = fresh() if name in STATEFUL else obj
        attr = getattr(target, name)
        if name == "__exit__":
            value = attr(None, None, None)
        elif name == "__buffer__":
            value = attr(0x1c)  # PyBUF_RECORDS_RO: strides and format.
        elif callable(attr):
            value = attr()
        else:
            value = attr
        if kind == "counted":
            assert _core._exports_of(obj) == (exports0 + 1, False), name
            assert is_memory(value, address, obj.nbytes), name
            del value
            gc.collect()
            assert _core._exports_of(obj)[0] == exports0, name
        else:
            assert not is_memory(value, address, obj.nbytes), (name, value)
            del value
        del attr, target
    # The escaped ones, last: a raw address into writable memory marks the
    # lease for good. A read-only view's points into the read-only mapping,
    # where no write lands: nothing to mark.
    assert _core._exports_of(obj) == (exports0, False)
    writable = getattr(obj, "writable", True)
    for name in (n for n, k in KINDS.items() if k == "escaped"):
        assert getattr(obj, name) == address, name
        assert _core._exports_of(obj) == (exports0, writable), name
        assert mapping_is_writable(address) == writable, name


def mapping_is_writable(address):
    """Whether the mapping of this process that holds `address` is
    writable (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return perms[1] == "w"
    raise AssertionError(f"{address:#x} is in no mapping")


def test_every_attribute_that_returns_memory_is_counted(client):
    buf = client.create((4, 8), "float32")
    check_attributes(buf, lambda: client.create((4, 8), "float32"),
                     buf.tensor().data_ptr())
    buf.seal()
    # A view of an object whose buffer handed out no address (a view in the
    # creating process shares the creator's lease).
    ref = client.create((4, 8), "float32").seal()
    view = client.get(ref)
    assert _core._exports_of(view) == (0, False)
    check_attributes(view, lambda: client.get(ref), view.tensor().data_ptr())
    # The protocols that reach the bytes without an attribute.
    for buf_or_view in (client.create(16, "uint8"), client.get(ref)):
        n = _core._exports_of(buf_or_view)[0]
        exports = [np.asarray(buf_or_view), torch.from_dlpack(buf_or_view),
                   np.from_dlpack(buf_or_view)]
        if isinstance(buf_or_view, shmtensor.View):
            exports.append(memoryview(buf_or_view))
        assert _core._exports_of(buf_or_view)[0] == n + len(exports)
        del exports
        gc.collect()
        assert _core._exports_of(buf_or_view)[0] == n


def test_a_buffer_without_the_buffer_protocol_says_so(client):
    """Buffer has no buffer protocol (an export nobody counted would be the
    trap): memoryview() is refused, not a pointer handed out uncounted."""
    with pytest.raises(TypeError):
        memoryview(client.create(16, "uint8"))


def test_a_write_through_an_address_after_seal_faults(client, daemon):
    """The raw address of a buffer escapes: the seal
    write-protects the memory at once, so a write through it faults and the
    sealed object keeps its bytes."""
    child = run_python(
        "import ctypes, numpy as np, shmtensor\n"
        "c = shmtensor.connect()\n"
        "b = c.create(1 << 16, 'uint8', name='addressed')\n"
        "np.asarray(b)[:] = 7\n"
        "addr = b.address\n"
        "b.seal()\n"
        "print('SEALED', flush=True)\n"
        "ctypes.memset(addr, 0, 1 << 16)\n"
        "print('WROTE', flush=True)\n",
        daemon.address)
    assert child.returncode == -signal.SIGSEGV, child.stdout + child.stderr
    assert "SEALED" in child.stdout and "WROTE" not in child.stdout
    assert (np.asarray(client.get("addressed")) == 7).all()
    client.delete("addressed")


@pytest.mark.parametrize("export", ["array", "tensor", "dlpack"])
def test_a_write_through_a_live_export_after_seal_never_lands(client, daemon,
                                                               export):
    """Each counted export alive at the seal closes the memory at once: an
    array made read-only raises, a tensor's (or a raw DLPack tensor's) write
    faults; the sealed object keeps its bytes."""
    make = {"array": "np.asarray(b)",
            "tensor": "b.tensor()",
            "dlpack": "torch.from_dlpack(b)"}[export]
    write = {"array": "e[:] = 0",
             "tensor": "e.zero_()",
             "dlpack": "e.zero_()"}[export]
    child = run_python(
        "import numpy as np, torch, shmtensor\n"
        "c = shmtensor.connect()\n"
        f"b = c.create(1 << 16, 'uint8', name='exported-{export}')\n"
        "np.asarray(b)[:] = 7\n"
        f"e = {make}\n"
        "b.seal()\n"
        "print('SEALED', flush=True)\n"
        "try:\n"
        f"    {write}\n"
        "except ValueError as err:\n"
        "    print('REFUSED', err, flush=True)\n"
        "else:\n"
        "    print('WROTE', flush=True)\n",
        daemon.address)
    assert "SEALED" in child.stdout and "WROTE" not in child.stdout, (
        child.stdout + child.stderr)
    if export == "array":
        assert child.returncode == 0 and "REFUSED" in child.stdout
    else:
        assert child.returncode == -signal.SIGSEGV, child.stdout + child.stderr
    assert (np.asarray(client.get(f"exported-{export}")) == 7).all()
    client.delete(f"exported-{export}")
