// shmtensor.ObjectRef, the native type of a reference to a sealed object:
// small, hashable, picklable (its bytes), made from Python too
// (ObjectRef(bytes)). The ref seal() or put() returns holds the creator's
// lease (a SealedRef); every other ref holds nothing.
//
// Thread safety: call with the GIL held.
#ifndef SHMTENSOR_PYTHON_SRC_PY_REF_H_
#define SHMTENSOR_PYTHON_SRC_PY_REF_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include "shmtensor/object_ref.h"
#include "shmtensor/sealed_ref.h"

namespace shmtensor::python {

namespace py = pybind11;

// Makes the type and adds it to `m` as ObjectRef (its qualified name is
// shmtensor.ObjectRef: that is where pickle finds it). Once, at import.
void AddRefType(py::module_& m);

// A new shmtensor.ObjectRef for `ref`, holding its lease if it holds one.
py::object NewObjectRef(SealedRef ref);

// The ref `obj` names if it is a shmtensor.ObjectRef (valid while `obj`
// lives), else null.
const ObjectRef* ParsedRefOf(PyObject* obj);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_PY_REF_H_
