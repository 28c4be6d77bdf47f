// shmtensor._core.Client: a session with shmtensord as a native Python type,
// which the package's shmtensor.Client subclasses (adding put(), which
// reads NumPy arrays and torch tensors).
//
// Every method and property is hand-written CPython (py_support.h says
// why): they convert their arguments themselves (py_args.h: dtypes and
// devices by the C++ rules), call the client, and release the GIL while
// they wait for the daemon.
//
// Ownership: the instance owns its Client; dropping it closes the session
// (with the GIL released).
//
// Thread safety: a Client may be used from several Python threads at once
// (the C++ Client is thread-safe; every call holds the GIL except while it
// waits).
#ifndef SHMTENSOR_PYTHON_SRC_PY_CLIENT_H_
#define SHMTENSOR_PYTHON_SRC_PY_CLIENT_H_

#include <pybind11/pybind11.h>

#include "shmtensor/client.h"

namespace shmtensor::python {

namespace py = pybind11;

// Creates the type and adds it to `m` as Client.
void AddClientType(py::module_& m);

// The Client of `obj` (a _core.Client, or an instance of a subclass);
// TypeError otherwise.
Client& ClientOf(py::handle obj);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_PY_CLIENT_H_
