// The objects a lifecycle makes, as native Python types of shmtensor._core:
//
//   Buffer     a writable, unsealed buffer (PyBuffer);
//   View       a view of a sealed object (PyView);
//   ObjectRef  a reference to a sealed object (shmtensor.ObjectRef), which
//              holds the creator's lease when seal() or put() returned it:
//              its own file, py_ref.h.
//
// Each type's methods are defined once, Buffer's and View's here; the
// native-object machinery they share is native_object.h.
//
// All of it is hand-written CPython: allocation, deallocation, methods,
// properties and the buffer protocol (py_support.h says why). The package
// subclasses Buffer and View for its Python-level methods
// (BindObjectClasses), which call these.
//
// Ownership: a Buffer owns its unsealed buffer (dropping it discards the
// object); a View owns one share of its lease (a hold of the SharedView
// that owns one), a SealedRef the creator's.
// Arrays and tensors made from either own shares of their own, so they
// outlive the object they came from. Deallocation of the last share sends
// the release with the GIL released.
//
// Thread safety: call with the GIL held.
#ifndef SHMTENSOR_PYTHON_SRC_PY_OBJECTS_H_
#define SHMTENSOR_PYTHON_SRC_PY_OBJECTS_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <vector>

#include "python/src/exports.h"
#include "python/src/shared_view.h"
#include "shmtensor/object_ref.h"
#include "shmtensor/view.h"

namespace shmtensor::python {

namespace py = pybind11;

// What a Buffer holds. Its arrays and DLPack tensors take the address from
// the lease, not Buffer::data(): they are counted exports of the lease
// (exports.h), so they mark nothing exposed, and the lease decides at Seal
// from them whether the range closes at once.
class PyBuffer {
 public:
  explicit PyBuffer(Buffer b) : buffer_(std::move(b)) {}
  ~PyBuffer();
  PyBuffer(const PyBuffer&) = delete;
  PyBuffer& operator=(const PyBuffer&) = delete;

  // The buffer; FAILED_PRECONDITION (as StatusError) once sealed or
  // discarded.
  const Buffer& get() const;
  bool valid() const { return buffer_.valid(); }

  // A writable ndarray over the buffer (made read-only at a shared seal).
  py::array Array();
  // A DLPack capsule over the buffer; `stream` as __dlpack__'s.
  py::capsule DLPack(const py::object& stream);
  // Seals: see Buffer.seal's docstring (py_objects.cc).
  SealedRef Seal(bool exclusive, CudaStream stream);
  void Discard();
  // What an export of the buffer needs.
  ExportSource Source();

 private:
  Buffer buffer_;
  // NumPy arrays exported, to make read-only at a shared seal.
  std::vector<py::weakref> arrays_;
};

// What a View holds: the SharedView of its object, which other Python
// Views of the object got through the same client may hold too
// (shared_view.h), held until deallocation and open until closed.
class PyView {
 public:
  // Takes over one hold of `shared`, open.
  explicit PyView(SharedView* shared) : shared_(shared) {}
  ~PyView();
  PyView(const PyView&) = delete;
  PyView& operator=(const PyView&) = delete;

  // The view; FAILED_PRECONDITION (as StatusError) once closed. The
  // reference stays readable while this PyView lives (shared_view.h).
  const View& get() const;
  ExportSource Source() const;
  // Drops this view's share of the lease; the last share waits for the
  // daemon (see View::Release).
  void Close();
  bool closed() const { return !open_; }
  const SharedView& shared() const { return *shared_; }

 private:
  SharedView* const shared_;
  bool open_ = true;
};

// Creates Buffer, View and ObjectRef and adds them to `m`.
void AddObjectTypes(py::module_& m);

// For the package, once: its subclasses of Buffer and View (their Python
// methods, shmtensor/__init__.py), which NewBuffer and NewView make from
// then on. TypeError unless each subclasses its native type and adds no
// instance attributes (__slots__ = ()).
void BindObjectClasses(py::handle buffer_class, py::handle view_class);

// New Python objects owning `b` / `v`. A View got through a client is
// entered in that client's `table` (SharedView::Make), for its next gets.
py::object NewBuffer(Buffer b);
py::object NewView(View v, std::shared_ptr<SharedViews> table = nullptr);
// A new Python View taking over one open hold of `shared`
// (SharedViews::Find's).
py::object NewView(SharedView* shared);

// The Buffer or View that `obj` is; TypeError naming the type otherwise.
PyBuffer& BufferOf(py::handle obj);
PyView& ViewOf(py::handle obj);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_PY_OBJECTS_H_
