#include "python/src/py_support.h"

#include <new>
#include <stdexcept>
#include <string>

#include "shmtensor/errors.h"

namespace shmtensor::python {

void RaiseStatus(const absl::Status& status) {
  try {
    py::object errors = py::module_::import("shmtensor.errors");
    py::object exc = errors.attr("from_status")(static_cast<int>(status.code()),
                                                ErrorReasonOf(status),
                                                std::string(status.message()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& e) {
    e.restore();  // The package is broken: say why, not the status.
  }
}

void RaiseCurrentException() {
  try {
    throw;
  } catch (const StatusError& e) {
    RaiseStatus(e.status);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "shmtensor: unknown C++ exception");
  }
}

void BindArgs(const char* function, PyObject* const* args, Py_ssize_t nargs,
              PyObject* kwnames, std::initializer_list<const char*> names,
              size_t required, PyObject** out) {
  const size_t n = names.size();
  if (static_cast<size_t>(nargs) > n) {
    throw py::type_error(std::string(function) + " takes at most " +
                         std::to_string(n) + " arguments (" +
                         std::to_string(nargs) + " given)");
  }
  for (size_t i = 0; i < n; ++i) {
    out[i] = i < static_cast<size_t>(nargs) ? args[i] : nullptr;
  }
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t i = 0;
    for (const char* name : names) {
      if (PyUnicode_CompareWithASCIIString(key, name) == 0) break;
      ++i;
    }
    if (i == n) {
      throw py::type_error(std::string(function) +
                           " got an unexpected keyword argument '" +
                           py::str(key).cast<std::string>() + "'");
    }
    if (out[i] != nullptr) {
      throw py::type_error(std::string(function) +
                           " got multiple values for argument '" +
                           py::str(key).cast<std::string>() + "'");
    }
    out[i] = args[nargs + k];
  }
  size_t i = 0;
  for (const char* name : names) {
    if (i < required && out[i] == nullptr) {
      throw py::type_error(std::string(function) +
                           " missing required argument '" + name + "' (pos " +
                           std::to_string(i + 1) + ")");
    }
    ++i;
  }
}

}  // namespace shmtensor::python
