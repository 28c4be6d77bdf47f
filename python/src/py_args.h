// Python arguments to the client's types, by the same rules the C++ API
// has (shmtensor/dtype.h, shmtensor/device.h): the binding converts and
// calls the client, and never asks the package.
//
// Thread safety: call with the GIL held.
#ifndef SHMTENSOR_PYTHON_SRC_PY_ARGS_H_
#define SHMTENSOR_PYTHON_SRC_PY_ARGS_H_

#include <Python.h>

#include "shmtensor/device.h"
#include "shmtensor/dtype.h"

namespace shmtensor::python {

// A dtype in any spelling a user of NumPy or torch writes: a str
// (ParseDType; any other text as numpy.dtype reads it, so "float" is
// float64); a torch.dtype (its name); anything else numpy.dtype takes (a
// numpy.dtype, np.float32, float, None: float64, an object with .dtype).
// Throws StatusError INVALID_ARGUMENT naming the dtype for one shmtensor
// does not store (or big-endian, saying how to convert), and "unknown
// dtype" with its repr for one neither the table nor NumPy knows.
// Each numpy.dtype and torch.dtype object read is remembered by identity
// (kept alive, so that its address stays its own; at most a few, the
// oldest forgotten first): put() reads the dtype of every array and tensor
// it copies, and NumPy formats a dtype's type string anew on every read.
DType DTypeArg(PyObject* dtype);

// What put() copies from a numpy.ndarray `array`: (address, shape tuple,
// dtype code, nbytes) when it is C-contiguous; None when it is not (the
// package copies it into a C-contiguous array first). Read from the
// array's own fields, with no dict or string made on the way. Throws
// TypeError for anything but a numpy.ndarray, and as DTypeArg for a dtype
// shmtensor does not store.
PyObject* ArraySource(PyObject* array);

// A device: None is the host; an int (not a bool) the CUDA device of that
// ordinal; a str or anything whose str() is one (a torch.device) as
// ParseDevice reads it, except that "cuda" alone is torch's current CUDA
// device (device 0 when torch is not loaded or has no CUDA). Throws
// StatusError INVALID_ARGUMENT naming what it got otherwise.
Device DeviceArg(PyObject* device);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_PY_ARGS_H_
