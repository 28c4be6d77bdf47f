// The native Python objects of shmtensor._core (Buffer, View, ObjectRef):
// a CPython instance holding one C++ value, constructed in place after
// tp_alloc (NewInstance) and destroyed in tp_dealloc (Dealloc). One home
// for the machinery py_objects.cc and py_ref.cc share.
//
// Thread safety: call with the GIL held.
#ifndef SHMTENSOR_PYTHON_SRC_NATIVE_OBJECT_H_
#define SHMTENSOR_PYTHON_SRC_NATIVE_OBJECT_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include <new>
#include <utility>

namespace shmtensor::python {

namespace py = pybind11;

// A native instance holding a C++ `Value`: constructed in place after
// tp_alloc (NewInstance), destroyed in tp_dealloc (Dealloc). Standard
// layout, so that offsetof(weakrefs) is well defined.
template <typename Value>
struct Native {
  PyObject ob_base;  // PyObject_HEAD
  PyObject* weakrefs;
  alignas(Value) unsigned char storage[sizeof(Value)];

  Value* value() { return std::launder(reinterpret_cast<Value*>(storage)); }
};

template <typename Value>
Value& ValueOf(PyObject* obj) {
  return *reinterpret_cast<Native<Value>*>(obj)->value();
}

// A new instance of `type` holding Value(args...); on an exception the
// instance is freed unconstructed.
template <typename Value, typename... Args>
py::object NewInstance(PyTypeObject* type, Args&&... args) {
  PyObject* obj = type->tp_alloc(type, 0);  // Zeroed; holds a type ref.
  if (obj == nullptr) throw py::error_already_set();
  try {
    new (reinterpret_cast<Native<Value>*>(obj)->storage)
        Value(std::forward<Args>(args)...);
  } catch (...) {
    type->tp_free(obj);
    Py_DECREF(type);
    throw;
  }
  return py::reinterpret_steal<py::object>(obj);
}

template <typename Value>
void Dealloc(PyObject* self) {
  auto* o = reinterpret_cast<Native<Value>*>(self);
  if (o->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  o->value()->~Value();
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_NATIVE_OBJECT_H_
