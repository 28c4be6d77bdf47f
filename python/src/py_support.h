// Support for the binding's hand-written CPython methods (py_objects.h,
// py_client.h): status errors on their way to Python, GIL release, one
// exception barrier per entry point, and argument binding for
// METH_FASTCALL | METH_KEYWORDS calls.
//
// Why hand-written: the lifecycle calls (create, seal, get, the objects'
// deallocation) run once per batch, and pybind11's generic dispatch (an
// argument tuple and dict per call, type lookups by hashed type name, a
// registry entry per instance) is work per call that a native method does
// not do (bench/python/python_bench.py --instructions counts it;
// docs/performance.md, "Python binding"). So every method and property of
// the binding's types is a native one, written with these helpers; pybind11
// is used for conversions only (arrays, capsules, casts).
//
// Thread safety: everything here is called with the GIL held, except what
// runs inside a ReleaseGil scope.
#ifndef SHMTENSOR_PYTHON_SRC_PY_SUPPORT_H_
#define SHMTENSOR_PYTHON_SRC_PY_SUPPORT_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shmtensor::python {

namespace py = pybind11;

// A failed absl::Status on its way to Python, where it becomes a
// shmtensor.Error subclass (RaiseStatus).
struct StatusError {
  absl::Status status;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}
template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError{v.status()};
  return *std::move(v);
}

// Sets the Python error for `status`: shmtensor.errors.from_status(code,
// reason, message), an instance of the shmtensor.Error subclass for it.
void RaiseStatus(const absl::Status& status);

// Sets the Python error for the exception in flight (call from a catch
// block only): StatusError as RaiseStatus, pybind11's exceptions as
// pybind11 raises them, anything else as RuntimeError.
void RaiseCurrentException();

// Runs `body` (which returns a new reference, or null with an error set)
// with every C++ exception turned into a Python error: the barrier each
// hand-written entry point goes through.
template <typename Body>
PyObject* Guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    RaiseCurrentException();
    return nullptr;
  }
}

// Releases the GIL for its scope, except while the interpreter finalizes:
// then a thread other than the main one that took the GIL back would be
// made to exit (pthread_exit) inside our destructors, which is fatal.
// Not movable; the thread must hold the GIL on construction.
class ReleaseGil {
 public:
  ReleaseGil() : state_(Finalizing() ? nullptr : PyEval_SaveThread()) {}
  ~ReleaseGil() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  static bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }
  PyThreadState* state_;  // Null: the GIL was kept.
};

// Binds the arguments of a METH_FASTCALL | METH_KEYWORDS call to the
// parameters `names` (positional or keyword, in order), the first
// `required` of them required: out[i] is the argument for names[i]
// (borrowed), or null when not given. Throws py::type_error, worded as
// Python's own, for too many, missing, unknown or repeated arguments.
// `function` is the name the messages give ("create()").
void BindArgs(const char* function, PyObject* const* args, Py_ssize_t nargs,
              PyObject* kwnames, std::initializer_list<const char*> names,
              size_t required, PyObject** out);

// A METH_FASTCALL | METH_KEYWORDS function for a PyMethodDef (through
// void(*)(), the cast CPython's own modules make).
inline PyCFunction FastMethod(PyObject* (*f)(PyObject*, PyObject* const*,
                                             Py_ssize_t, PyObject*)) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

// `arg`, an argument of `function` bound to parameter `name`, as a T (by
// pybind11's conversion). Throws py::type_error naming both, as Python's
// own functions do, when it is not one.
template <typename T>
T ArgAs(const char* function, const char* name, PyObject* arg) {
  try {
    return py::handle(arg).cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(function) + ": argument '" + name +
                         "' has the wrong type (" + Py_TYPE(arg)->tp_name +
                         ")");
  }
}

// A new reference to `value` as a Python object (by pybind11's
// conversion), for a native method's or getter's return.
template <typename T>
PyObject* ToPython(T&& value) {
  return py::cast(std::forward<T>(value)).release().ptr();
}

// True when `arg` is absent or None.
inline bool IsNone(PyObject* arg) { return arg == nullptr || arg == Py_None; }

// The truth of `arg` (bool(arg)), or `absent` when it was not given.
inline bool Truth(PyObject* arg, bool absent) {
  if (arg == nullptr) return absent;
  const int t = PyObject_IsTrue(arg);
  if (t < 0) throw py::error_already_set();
  return t != 0;
}

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_PY_SUPPORT_H_
