#include "python/src/py_ref.h"

#include <structmember.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "python/src/native_object.h"
#include "python/src/py_support.h"

namespace shmtensor::python {
namespace {

// What an ObjectRef holds: the ref's bytes (a Python bytes object, for
// __bytes__, __hash__ and pickling), its parsed fields, and the creator's
// lease when it is the ref seal() or put() returned. The lease is dropped
// with the GIL released (its share is usually the last one: the release
// goes out then).
struct RefValue {
  RefValue(py::bytes b, const ObjectRef& r, SealedRef l)
      : bytes(std::move(b)), parsed(r), lease(std::move(l)) {}
  ~RefValue() {
    if (!lease.holds_lease()) return;
    ReleaseGil release;
    lease.Reset();
  }
  RefValue(const RefValue&) = delete;
  RefValue& operator=(const RefValue&) = delete;

  py::bytes bytes;
  ObjectRef parsed;
  SealedRef lease;  // Empty (holds nothing) for every other ref.
};

using RefObject = Native<RefValue>;

PyTypeObject* g_ref_type = nullptr;

RefValue& RefOf(PyObject* self) { return ValueOf<RefValue>(self); }

// ObjectRef(ref_bytes): validates and parses the bytes once.
PyObject* RefNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  return Guarded([&]() -> PyObject* {
    PyObject* arg = nullptr;
    static const char* kNames[] = {"ref_bytes", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:ObjectRef",
                                     const_cast<char**>(kNames), &arg)) {
      return nullptr;
    }
    if (!PyObject_CheckBuffer(arg)) {  // bytes, bytearray, memoryview.
      throw py::type_error(std::string("ObjectRef() takes the ref's bytes, "
                                       "not ") +
                           Py_TYPE(arg)->tp_name);
    }
    py::bytes bytes = py::reinterpret_steal<py::bytes>(PyBytes_FromObject(arg));
    if (!bytes) throw py::error_already_set();
    const ObjectRef parsed =
        Check(ObjectRef::Parse(static_cast<std::string>(bytes)));
    return NewInstance<RefValue>(type, std::move(bytes), parsed, SealedRef())
        .release()
        .ptr();
  });
}

PyObject* RefReduce(PyObject* self, PyObject*) {
  // (ObjectRef, (bytes,)): a copy made by pickling holds nothing.
  return Py_BuildValue("(O(O))", Py_TYPE(self), RefOf(self).bytes.ptr());
}

PyObject* RefBytesMethod(PyObject* self, PyObject*) {
  return RefOf(self).bytes.inc_ref().ptr();
}

PyObject* RefRelease(PyObject* self, PyObject*) {
  SealedRef& lease = RefOf(self).lease;
  SealedRef share = lease;  // With the GIL held.
  lease.Reset();
  {
    ReleaseGil release;
    share.Release().IgnoreError();  // Explicit: waits (last holder).
  }
  Py_RETURN_NONE;
}

PyObject* RefRichCompare(PyObject* self, PyObject* other, int op) {
  if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self)) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  const bool equal = static_cast<std::string_view>(RefOf(self).bytes) ==
                     static_cast<std::string_view>(RefOf(other).bytes);
  return PyBool_FromLong(equal == (op == Py_EQ));
}

Py_hash_t RefHash(PyObject* self) {
  return PyObject_Hash(RefOf(self).bytes.ptr());
}

PyObject* RefRepr(PyObject* self) {
  const RefValue& r = RefOf(self);
  return PyUnicode_FromFormat("ObjectRef(slot=%u, generation=%u%s%s)",
                              r.parsed.slot, r.parsed.generation,
                              r.parsed.exclusive ? ", exclusive" : "",
                              r.lease.holds_lease() ? ", holds lease" : "");
}

PyObject* RefExclusive(PyObject* self, void*) {
  return PyBool_FromLong(RefOf(self).parsed.exclusive);
}

PyObject* RefHoldsLease(PyObject* self, void*) {
  return PyBool_FromLong(RefOf(self).lease.holds_lease());
}

const char kRefDoc[] =
    "ObjectRef(ref_bytes)\n--\n\n"
    "A reference to a sealed object: small, hashable, picklable; "
    "bytes(ref) is its serialised form, and ObjectRef(those bytes) the "
    "same reference again.\n\n"
    "The ref that seal()/put() return holds a lease, so the object lives at "
    "least as long as that ref (or until release()). A copy made by "
    "pickling, or from the bytes, holds nothing until some process calls "
    "get() with it; if the object is gone by then, get() raises "
    "StaleReferenceError, never another object's bytes. InvalidArgumentError "
    "for bytes that are no ref.";

PyMethodDef kRefMethods[] = {
    {"__reduce__", RefReduce, METH_NOARGS, nullptr},
    {"__bytes__", RefBytesMethod, METH_NOARGS, nullptr},
    {"release", RefRelease, METH_NOARGS,
     "Drops the lease this ref holds (if any); the ref stays usable as a "
     "plain reference. If nothing else of this process holds the lease, "
     "waits for the daemon, so the memory is back in the pool for every "
     "process on return. (Dropping the last reference to the ref instead "
     "releases without waiting: this client sees it at once, other "
     "processes a moment later.)"},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kRefGetSet[] = {
    {"exclusive", RefExclusive, nullptr,
     "True for a ref sealed for hand-off to exactly one consumer.", nullptr},
    {"holds_lease", RefHoldsLease, nullptr,
     "True while this ref keeps its object alive.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef kRefMembers[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(RefObject, weakrefs), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

}  // namespace

void AddRefType(py::module_& m) {
  // Made from Python too (ObjectRef(bytes)), so not with MakeType. Named
  // shmtensor.ObjectRef: that is where pickle finds it.
  PyType_Slot ref_slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc<RefValue>)},
      {Py_tp_doc, const_cast<char*>(kRefDoc)},
      {Py_tp_new, reinterpret_cast<void*>(RefNew)},
      {Py_tp_methods, kRefMethods},
      {Py_tp_getset, kRefGetSet},
      {Py_tp_members, kRefMembers},
      {Py_tp_richcompare, reinterpret_cast<void*>(RefRichCompare)},
      {Py_tp_hash, reinterpret_cast<void*>(RefHash)},
      {Py_tp_repr, reinterpret_cast<void*>(RefRepr)},
      {0, nullptr},
  };
  PyType_Spec ref_spec = {"shmtensor.ObjectRef", sizeof(RefObject), 0,
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
                          ref_slots};
  PyObject* ref_type = PyType_FromSpec(&ref_spec);
  if (ref_type == nullptr) throw py::error_already_set();
  m.add_object("ObjectRef", py::handle(ref_type));
  g_ref_type = reinterpret_cast<PyTypeObject*>(ref_type);
}

py::object NewObjectRef(SealedRef ref) {
  py::bytes bytes(ref.ref().Serialize());
  const ObjectRef parsed = ref.ref();
  if (!ref.holds_lease()) ref = SealedRef();
  return NewInstance<RefValue>(g_ref_type, std::move(bytes), parsed,
                               std::move(ref));
}

const ObjectRef* ParsedRefOf(PyObject* obj) {
  if (Py_TYPE(obj) != g_ref_type) return nullptr;
  return &RefOf(obj).parsed;
}

}  // namespace shmtensor::python
