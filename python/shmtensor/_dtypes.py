"""The wire DType codes as NumPy and torch dtypes (code -> dtype).

The other way, any dtype spelling -> code, is the binding's
(python/src/py_args.h over ParseDType, shmtensor/dtype.h; P6 in
docs/pitfalls.md): strings mean what NumPy says ("float" is float64), plus
"bfloat16" and "torch.<name>"; big-endian dtypes are refused with the
conversion to use; anything the table lacks is refused naming it.
bfloat16 exists in torch only: such objects give tensors, not arrays.
uint16/32/64 exist in NumPy only (torch 1.13): arrays, not tensors.
"""

import sys

import numpy as np

from . import _core

# The one dtype table, the C++ one (shmtensor/dtype.h, checked against the
# proto): rows of (code, name, item size, kind, NumPy dtype string or None,
# whether torch has it). Everything below is derived from it.
TABLE = _core._dtype_table()
BOOL = next(row[0] for row in TABLE if row[1] == "bool")

# Code 0 (untyped bytes) is never what a NumPy or torch dtype maps to.
_NUMPY_BY_CODE = {code: np.dtype(numpy)
                  for code, _, _, _, numpy, _ in TABLE if code and numpy}
_TORCH_NAMES = {code: name for code, name, _, _, _, torch in TABLE
                if code and torch}


def _torch():
    return sys.modules.get("torch")


def numpy_dtype(code):
    """The NumPy dtype of a code, or None (bfloat16)."""
    return _NUMPY_BY_CODE.get(code)


def torch_dtype(code):
    """The torch dtype of a code, or None (uint16/32/64 in torch 1.13)."""
    import torch
    name = _TORCH_NAMES.get(code)
    return getattr(torch, name) if name else None
