"""dtype conversions between NumPy, torch, strings and the wire DType codes.

Rules (P6 in docs/pitfalls.md):
- Strings are NumPy dtype names ("float32", "f4", "<i8", ...; note that in
  NumPy "float" means float64), plus "bfloat16" and "torch.<name>".
- Every value is stored little-endian. A big-endian NumPy dtype is refused
  with the conversion to use; it is never reinterpreted silently.
- bfloat16 exists in torch only: such objects give tensors, not arrays.
  uint16/32/64 exist in NumPy only (torch 1.13): arrays, not tensors.
- Anything else (object, str, datetime, structured, float128, complex32,
  quantized types) is refused with a message naming the dtype.
"""

import sys

import numpy as np

from . import _core
from .errors import InvalidArgumentError

# The one dtype table, the C++ one (shmtensor/dtype.h, checked against the
# proto): rows of (code, name, item size, kind, NumPy dtype string or None,
# whether torch has it). Everything below is derived from it.
TABLE = _core._dtype_table()
_CODE_BY_NAME = {row[1]: row[0] for row in TABLE}

BOOL, UINT8, INT8 = _CODE_BY_NAME["bool"], _CODE_BY_NAME["uint8"], _CODE_BY_NAME["int8"]
BFLOAT16 = _CODE_BY_NAME["bfloat16"]

# Code 0 (untyped bytes) is never what a NumPy or torch dtype maps to.
_NUMPY_BY_CODE = {code: np.dtype(numpy)
                  for code, _, _, _, numpy, _ in TABLE if code and numpy}
_CODE_BY_NUMPY = {(d.kind, d.itemsize): c for c, d in _NUMPY_BY_CODE.items()}
_TORCH_NAMES = {code: name for code, name, _, _, _, torch in TABLE
                if code and torch}


def _torch():
    return sys.modules.get("torch")


def code_of_numpy(dt):
    """The code of a NumPy dtype, or InvalidArgumentError saying why not."""
    dt = np.dtype(dt)
    if dt.byteorder == ">" or (dt.byteorder == "=" and sys.byteorder == "big"):
        raise InvalidArgumentError(
            f"dtype {dt.str} is big-endian; shmtensor stores little-endian "
            f"values: convert with a.astype(a.dtype.newbyteorder('<'))",
            "INVALID_ARGUMENT")
    code = _CODE_BY_NUMPY.get((dt.kind, dt.itemsize))
    if code is None or dt.fields is not None or dt.subdtype is not None:
        raise InvalidArgumentError(
            f"dtype {dt} has no shmtensor equivalent (supported: bool, "
            f"(u)int8-64, float16/32/64, complex64/128; bfloat16 via torch)",
            "INVALID_ARGUMENT")
    return code


def code_of_torch(dt):
    """The code of a torch dtype, or InvalidArgumentError saying why not."""
    torch = _torch()
    for code, name in _TORCH_NAMES.items():
        if dt == getattr(torch, name):
            return code
    raise InvalidArgumentError(
        f"dtype {dt} has no shmtensor equivalent (supported torch dtypes: "
        f"{', '.join(sorted(_TORCH_NAMES.values()))})", "INVALID_ARGUMENT")


_CACHE = {}


def dtype_code(dtype):
    """The wire code of a NumPy dtype or type, a torch dtype, or a name."""
    try:
        return _CACHE[dtype]
    except (KeyError, TypeError):  # TypeError: unhashable.
        pass
    code = _dtype_code(dtype)
    try:
        if len(_CACHE) < 256:
            _CACHE[dtype] = code
    except TypeError:
        pass
    return code


def _dtype_code(dtype):
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        return code_of_torch(dtype)
    if isinstance(dtype, str):
        if dtype == "bfloat16" or dtype == "torch.bfloat16":
            return BFLOAT16
        if dtype.startswith("torch."):
            if torch is None:
                import torch  # noqa: F811  (only for torch names)
            attr = getattr(torch, dtype[6:], None)
            if not isinstance(attr, torch.dtype):
                raise InvalidArgumentError(f"unknown dtype {dtype!r}",
                                           "INVALID_ARGUMENT")
            return code_of_torch(attr)
        try:
            return code_of_numpy(np.dtype(dtype))
        except TypeError:
            raise InvalidArgumentError(f"unknown dtype {dtype!r}",
                                       "INVALID_ARGUMENT") from None
    try:
        return code_of_numpy(np.dtype(dtype))
    except TypeError:
        raise InvalidArgumentError(f"unknown dtype {dtype!r}",
                                   "INVALID_ARGUMENT") from None


def numpy_dtype(code):
    """The NumPy dtype of a code, or None (bfloat16)."""
    return _NUMPY_BY_CODE.get(code)


def torch_dtype(code):
    """The torch dtype of a code, or None (uint16/32/64 in torch 1.13)."""
    import torch
    name = _TORCH_NAMES.get(code)
    return getattr(torch, name) if name else None
