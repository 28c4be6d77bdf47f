#include "python/src/py_objects.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <structmember.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "client/lease_address.h"
#include "python/src/native_object.h"
#include "python/src/py_ref.h"
#include "python/src/py_support.h"

namespace shmtensor::python {
namespace {

using BufferObject = Native<PyBuffer>;
using ViewObject = Native<PyView>;

// The native types, and the package's subclasses of them that NewBuffer
// and NewView make (the native types themselves until BindObjectClasses).
PyTypeObject* g_buffer_type = nullptr;
PyTypeObject* g_view_type = nullptr;
PyTypeObject* g_buffer_class = nullptr;
PyTypeObject* g_view_class = nullptr;

// The keywords DLPack 1.0 consumers may pass besides `stream`: max_version
// (the legacy "dltensor" capsule is returned, which they accept), dl_device
// (must be where the bytes are) and copy (a copy cannot be made here).
void CheckDlpackKeywords(const ObjectInfo& info, const py::object& dl_device,
                         const py::object& copy) {
  if (Truth(copy.ptr(), false)) {
    throw py::buffer_error(
        "__dlpack__(copy=True): shmtensor exports its bytes without a copy "
        "only; copy the resulting tensor instead");
  }
  if (dl_device.is_none()) return;
  const auto want =
      ArgAs<std::pair<int, int>>("__dlpack__()", "dl_device", dl_device.ptr());
  const std::pair<int, int> have = info.device.is_cuda()
                                       ? std::make_pair(2, info.device.index)
                                       : std::make_pair(1, 0);
  if (want != have) {
    throw py::buffer_error("__dlpack__(dl_device=(" +
                           std::to_string(want.first) + ", " +
                           std::to_string(want.second) +
                           ")): the bytes are on " + DeviceName(info.device));
  }
}

// The consumer stream of a __dlpack__(stream=...) call, for a CUDA export:
// None means the legacy default stream; -1 means the consumer asks for no
// synchronisation (its use is then its own to order); any other integer is
// a stream handle (1 and 2: the legacy and per-thread default streams).
void DeclareDlpackStream(const py::object& stream,
                         const std::function<void(CudaStream)>& use) {
  if (stream.is_none()) return;  // The legacy default stream always counts.
  const long long s = stream.cast<long long>();
  if (s == -1) return;
  if (s < 0) {
    throw py::value_error(
        "__dlpack__: stream must be None, -1 or a stream "
        "handle, got " +
        std::to_string(s));
  }
  use(static_cast<CudaStream>(s));
}

// A CUDA stream given as None (0: all of this process's work), a handle, or
// an object with a cuda_stream handle (torch.cuda.Stream).
CudaStream StreamHandle(PyObject* stream) {
  if (IsNone(stream)) return 0;
  py::handle h(stream);
  if (py::isinstance<py::int_>(h)) return h.cast<CudaStream>();
  if (!py::hasattr(h, "cuda_stream")) {
    throw py::type_error(
        std::string("stream must be None, a stream handle or a "
                    "torch.cuda.Stream, got ") +
        Py_TYPE(stream)->tp_name);
  }
  return h.attr("cuda_stream").cast<CudaStream>();
}

// numpy's __array__(dtype=None): the array, converted when a dtype is
// given. (numpy >= 2 may pass copy=; a copy is then numpy's to make.)
PyObject* ArrayAs(py::array a, PyObject* dtype) {
  if (IsNone(dtype)) return a.release().ptr();
  return a.attr("astype")(py::handle(dtype)).release().ptr();
}

// -- Native methods -----------------------------------------------------

PyObject* BufferSeal(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                     PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[2];
    BindArgs("seal()", args, nargs, kwnames, {"exclusive", "stream"}, 0, a);
    const bool exclusive = Truth(a[0], false);
    const CudaStream stream = StreamHandle(a[1]);
    return NewObjectRef(ValueOf<PyBuffer>(self).Seal(exclusive, stream))
        .release()
        .ptr();
  });
}

PyObject* BufferArray(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[2];
    BindArgs("__array__()", args, nargs, kwnames, {"dtype", "copy"}, 0, a);
    return ArrayAs(ValueOf<PyBuffer>(self).Array(), a[0]);
  });
}

PyObject* ViewArray(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                    PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[2];
    BindArgs("__array__()", args, nargs, kwnames, {"dtype", "copy"}, 0, a);
    return ArrayAs(MakeArray(ValueOf<PyView>(self).Source()), a[0]);
  });
}

// tp_getattro of Buffer: Python's own lookup, except that the two
// attributes numpy.asarray(buffer) probes for before it calls __array__
// (__array_struct__, __array_interface__; a Buffer has neither, see
// PyBuffer::Array) fail with an AttributeError that is not formatted:
// numpy discards these errors, so the usual message would be formatted for
// nothing on every conversion (docs/performance.md, "Python binding").
PyObject* BufferGetAttr(PyObject* self, PyObject* name) {
  PyObject* r = _PyObject_GenericGetAttrWithDict(self, name, nullptr,
                                                 /*suppress=*/1);
  if (r != nullptr || PyErr_Occurred()) return r;
  static PyObject* const kStruct =
      PyUnicode_InternFromString("__array_struct__");
  static PyObject* const kInterface =
      PyUnicode_InternFromString("__array_interface__");
  if (name == kStruct || name == kInterface) {
    PyErr_SetObject(PyExc_AttributeError, name);
    return nullptr;
  }
  return PyObject_GenericGetAttr(self, name);  // Raises the usual error.
}

// bf_getbuffer of View: numpy.asarray(view) and memoryview(view) take the
// buffer protocol first, with no attribute lookups and no call, so this is
// the cheap way to an array (PyView::Source, FillBuffer). Errors are
// BufferErrors; NumPy then falls back to __array__, which raises the
// precise shmtensor error (a closed view, a CUDA object, bfloat16).
int ViewGetBuffer(PyObject* self, Py_buffer* out, int flags) {
  out->obj = nullptr;
  try {
    return FillBuffer(ValueOf<PyView>(self).Source(), out, flags);
  } catch (const StatusError& e) {
    PyErr_SetString(PyExc_BufferError, std::string(e.status.message()).c_str());
  } catch (...) {
    RaiseCurrentException();
  }
  return -1;
}

// The native methods' docstrings are the API reference; the package's
// guide (docs/guide.md) points here.
const char kSealDoc[] =
    "seal(exclusive=False, stream=None)\n--\n\n"
    "Makes the object immutable and returns its ObjectRef.\n\n"
    "CUDA buffers: first waits until the GPU work that filled the buffer is "
    "done: all of this process's work on the device, or only the work on "
    "`stream` (a torch.cuda.Stream, or its handle) when given. A consumer "
    "never sees the object before that.\n\n"
    "A shared seal returns a ref that keeps the object alive; arrays made "
    "from the buffer stay readable but not writable (a write through a "
    "torch tensor made from the buffer would fault: drop those first). With "
    "exclusive=True the object goes to exactly one consumer: the returned "
    "ref holds nothing, this process can no longer write it, and arrays or "
    "tensors made from the buffer must be gone (else BufferError).\n\n"
    "When no array or tensor of the buffer is alive at seal, its memory is "
    "not write-protected again in this process (nothing can reach it), "
    "which saves two page-table changes per buffer when the memory is "
    "reused here; views always read through a read-only mapping "
    "(docs/shm_layout.md, \"Deferred closing\").";

PyMemberDef kBufferMembers[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(BufferObject, weakrefs),
     READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyMemberDef kViewMembers[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ViewObject, weakrefs), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

// `name` is the qualified name ("shmtensor._core.Buffer"), a literal:
// Python 3.11 keeps pointing into it (tp_name) for the type's life.
PyTypeObject* MakeType(py::module_& m, const char* name, const char* doc,
                       int basicsize, destructor dealloc, PyMethodDef* methods,
                       PyMemberDef* members, PyGetSetDef* getset,
                       getbufferproc getbuffer, getattrofunc getattro) {
  std::vector<PyType_Slot> slots = {
      {Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
      {Py_tp_doc, const_cast<char*>(doc)},
      {Py_tp_methods, methods},
  };
  if (members != nullptr) slots.push_back({Py_tp_members, members});
  if (getset != nullptr) slots.push_back({Py_tp_getset, getset});
  if (getattro != nullptr) {
    slots.push_back({Py_tp_getattro, reinterpret_cast<void*>(getattro)});
  }
  if (getbuffer != nullptr) {
    slots.push_back({Py_bf_getbuffer, reinterpret_cast<void*>(getbuffer)});
  }
  slots.push_back({0, nullptr});
  // Made here only (NewBuffer, NewView, NewObjectRef), never from Python.
  // The package subclasses them (its Python methods; BindObjectClasses).
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION  // Python >= 3.10.
  const unsigned flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE |
                         Py_TPFLAGS_DISALLOW_INSTANTIATION;
#else
  const unsigned flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
#endif
  PyType_Spec spec = {name, basicsize, 0, flags, slots.data()};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
  reinterpret_cast<PyTypeObject*>(type)->tp_new = nullptr;
#endif
  // The module's own reference; `type`'s is kept for the process's life.
  m.add_object(std::strrchr(name, '.') + 1, py::handle(type));
  return reinterpret_cast<PyTypeObject*>(type);
}

// By value: `v` may be a view's, which Python code run by the tuple's
// allocation (a collection's finalizers) could close.
template <typename T>
py::tuple Tuple(const std::vector<T> v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t;
}

// An optional argument as a py::object: None when not given.
py::object Optional(PyObject* arg) {
  return py::reinterpret_borrow<py::object>(arg == nullptr ? Py_None : arg);
}

// The attributes Buffer and View share, for the ObjectInfo `Info(self)`
// gives (FAILED_PRECONDITION once the buffer is sealed or the view closed).
template <const ObjectInfo& (*Info)(PyObject*)>
struct InfoAttributes {
  static PyObject* Shape(PyObject* s, void*) {
    return Guarded([&] { return Tuple(Info(s).shape).release().ptr(); });
  }
  static PyObject* Strides(PyObject* s, void*) {
    return Guarded(
        [&] { return Tuple(Info(s).strides_bytes).release().ptr(); });
  }
  static PyObject* DTypeCode(PyObject* s, void*) {
    return Guarded([&] { return ToPython(static_cast<int>(Info(s).dtype)); });
  }
  static PyObject* NBytes(PyObject* s, void*) {
    return Guarded([&] { return ToPython(Info(s).size_bytes); });
  }
  static PyObject* RefBytesOf(PyObject* s, void*) {
    return Guarded(
        [&] { return py::bytes(Info(s).ref.Serialize()).release().ptr(); });
  }
  static PyObject* DeviceOf(PyObject* s, void*) {
    return Guarded([&] { return ToPython(DeviceName(Info(s).device)); });
  }
  static PyObject* DlpackDevice(PyObject* s, PyObject*) {
    return Guarded([&] {
      const Device& d = Info(s).device;
      // DLPack: kDLCPU = 1, kDLCUDA = 2.
      return (d.is_cuda() ? py::make_tuple(2, d.index) : py::make_tuple(1, 0))
          .release()
          .ptr();
    });
  }

  // The getters, then `more` (this type's own), then the sentinel. Made
  // on the first call, which is the only one (AddObjectTypes, once per
  // type): a later call returns that table, whatever its `more`. The type
  // points into it for the process's life.
  static PyGetSetDef* GetSet(std::initializer_list<PyGetSetDef> more) {
    static std::vector<PyGetSetDef>* const table = [&] {
      auto* t = new std::vector<PyGetSetDef>{
          {"shape", Shape, nullptr, "Elements per dimension.", nullptr},
          {"strides", Strides, nullptr,
           "Bytes between elements per dimension (NumPy convention).", nullptr},
          {"dtype_code", DTypeCode, nullptr, "The shmtensor.v1.DType value.",
           nullptr},
          {"nbytes", NBytes, nullptr, "Bytes the data spans.", nullptr},
          {"ref_bytes", RefBytesOf, nullptr,
           "The serialised ObjectRef of the object.", nullptr},
          {"device", DeviceOf, nullptr,
           "Where the bytes are: 'cpu' or 'cuda:N'.", nullptr},
      };
      t->insert(t->end(), more.begin(), more.end());
      t->push_back({nullptr, nullptr, nullptr, nullptr, nullptr});
      return t;
    }();
    return table->data();
  }
};

const ObjectInfo& BufferInfo(PyObject* s) {
  return ValueOf<PyBuffer>(s).get().info();
}
const ObjectInfo& ViewInfo(PyObject* s) {
  return ValueOf<PyView>(s).get().info();
}
using BufferInfoAttributes = InfoAttributes<BufferInfo>;
using ViewInfoAttributes = InfoAttributes<ViewInfo>;

const char kDlpackDoc[] =
    "__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)\n"
    "--\n\nA DLPack capsule (zero-copy).";
const char kDlpackDeviceDoc[] =
    "__dlpack_device__()\n--\n\n(device type, device index), as DLPack "
    "numbers them: (1, 0) for host memory, (2, N) for cuda:N.";

PyObject* BufferValid(PyObject* s, void*) {
  return PyBool_FromLong(ValueOf<PyBuffer>(s).valid());
}

PyObject* BufferAddress(PyObject* s, void*) {
  return Guarded([&] {
    // A raw pointer handed to the user: it escapes (lease_address.h).
    internal::Lease& lease = *ValueOf<PyBuffer>(s).get().lease();
    internal::MarkEscaped(lease);
    return ToPython(reinterpret_cast<uintptr_t>(internal::LeaseAddress(lease)));
  });
}

PyObject* BufferDlpack(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[4];
    BindArgs("__dlpack__()", args, nargs, kwnames,
             {"stream", "max_version", "dl_device", "copy"}, 0, a);
    PyBuffer& b = ValueOf<PyBuffer>(self);
    CheckDlpackKeywords(b.get().info(), Optional(a[2]), Optional(a[3]));
    return b.DLPack(Optional(a[0])).release().ptr();
  });
}

PyObject* BufferDiscard(PyObject* self, PyObject*) {
  return Guarded([&] {
    ValueOf<PyBuffer>(self).Discard();
    Py_RETURN_NONE;
  });
}

PyMethodDef kBufferMethods[] = {
    {"seal", FastMethod(BufferSeal), METH_FASTCALL | METH_KEYWORDS, kSealDoc},
    {"__array__", FastMethod(BufferArray), METH_FASTCALL | METH_KEYWORDS,
     "__array__(dtype=None)\n--\n\nA zero-copy writable ndarray."},
    {"__dlpack__", FastMethod(BufferDlpack), METH_FASTCALL | METH_KEYWORDS,
     kDlpackDoc},
    {"__dlpack_device__", BufferInfoAttributes::DlpackDevice, METH_NOARGS,
     kDlpackDeviceDoc},
    {"discard", BufferDiscard, METH_NOARGS,
     "discard()\n--\n\nDiscards the unsealed object."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* ViewWritable(PyObject* s, void*) {
  return Guarded(
      [&] { return PyBool_FromLong(ValueOf<PyView>(s).get().writable()); });
}

PyObject* ViewClosed(PyObject* s, void*) {
  return PyBool_FromLong(ValueOf<PyView>(s).closed());
}

PyObject* ViewAddress(PyObject* s, void*) {
  return Guarded([&] {
    // A raw pointer handed to the user: into writable bytes, it escapes
    // (lease_address.h); a read-only view's points into the read-only
    // mapping.
    const View& v = ValueOf<PyView>(s).get();
    if (v.writable()) internal::MarkEscaped(*v.lease());
    return ToPython(reinterpret_cast<uintptr_t>(v.data()));
  });
}

PyObject* ViewDlpack(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                     PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[4];
    BindArgs("__dlpack__()", args, nargs, kwnames,
             {"stream", "max_version", "dl_device", "copy"}, 0, a);
    PyView& v = ValueOf<PyView>(self);
    const View& view = v.get();
    CheckDlpackKeywords(view.info(), Optional(a[2]), Optional(a[3]));
    DeclareDlpackStream(Optional(a[0]),
                        [&](CudaStream cs) { view.UseOnStream(cs); });
    return MakeDLPack(v.Source()).release().ptr();
  });
}

PyObject* ViewClose(PyObject* self, PyObject*) {
  return Guarded([&] {
    ValueOf<PyView>(self).Close();
    Py_RETURN_NONE;
  });
}

PyObject* ViewPopulate(PyObject* self, PyObject*) {
  return Guarded([&] {
    // A share of its own: another thread may close the view meanwhile.
    const View view = ValueOf<PyView>(self).get();
    {
      ReleaseGil unlocked;  // One system call over the whole object.
      view.Populate();
    }
    Py_RETURN_NONE;
  });
}

PyMethodDef kViewMethods[] = {
    {"__array__", FastMethod(ViewArray), METH_FASTCALL | METH_KEYWORDS,
     "__array__(dtype=None)\n--\n\nA zero-copy ndarray (read-only unless "
     "writable). It keeps the object alive while it lives."},
    {"__dlpack__", FastMethod(ViewDlpack), METH_FASTCALL | METH_KEYWORDS,
     kDlpackDoc},
    {"__dlpack_device__", ViewInfoAttributes::DlpackDevice, METH_NOARGS,
     kDlpackDeviceDoc},
    {"populate", ViewPopulate, METH_NOARGS,
     "populate()\n--\n\n"
     "Maps every page of the object into this process now, in one system "
     "call, for a reader about to read all of it: otherwise the first read "
     "of each page takes a page fault. Only the first call for given bytes "
     "does anything; nothing is copied. Best effort (Linux 5.14 or later); "
     "no-op for a writable view or a CUDA object."},
    {"close", ViewClose, METH_NOARGS,
     "close()\n--\n\n"
     "Drops this view's share of the lease. Arrays and tensors made from it "
     "keep their own share: the lease ends when the last one dies. When "
     "this was the last share, waits for the daemon, so the memory is back "
     "in the pool for every process on return."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef* BufferGetSet() {
  return BufferInfoAttributes::GetSet({
      {"valid", BufferValid, nullptr, "False once sealed or discarded.",
       nullptr},
      {"address", BufferAddress, nullptr,
       "Address of the first byte in this process, for identity checks. Not "
       "a view: it keeps nothing alive. Taking it marks the buffer: at "
       "seal() its memory is write-protected at once, so a write through "
       "the address faults instead of changing the sealed object (arrays "
       "and tensors are the way to write). After the buffer is gone, a "
       "write through it is a use-after-free, as in C.",
       nullptr},
  });
}

PyGetSetDef* ViewGetSet() {
  return ViewInfoAttributes::GetSet({
      {"writable", ViewWritable, nullptr,
       "True for the consumer of an exclusive hand-off that took it "
       "writable, and for every view of a shared-writable object.",
       nullptr},
      {"closed", ViewClosed, nullptr, "True once close() was called.", nullptr},
      {"address", ViewAddress, nullptr,
       "Address of the first byte in this process.", nullptr},
  });
}

}  // namespace

// -- PyBuffer -----------------------------------------------------------

PyBuffer::~PyBuffer() {
  arrays_.clear();
  if (!buffer_.valid()) return;  // Sealed or discarded: nothing to send.
  ReleaseGil release;
  buffer_ = Buffer();
}

const Buffer& PyBuffer::get() const {
  if (!buffer_.valid()) {
    throw StatusError{absl::FailedPreconditionError(
        "buffer was sealed or discarded; get() the ref for a view")};
  }
  return buffer_;
}

py::array PyBuffer::Array() {
  get();  // Refuses a sealed or discarded buffer.
  py::array arr = MakeArray(Source());
  arrays_.push_back(py::weakref(arr));
  return arr;
}

py::capsule PyBuffer::DLPack(const py::object& stream) {
  const Buffer& b = get();
  DeclareDlpackStream(stream, [&](CudaStream s) { b.UseOnStream(s); });
  return MakeDLPack(Source());
}

SealedRef PyBuffer::Seal(bool exclusive, CudaStream stream) {
  get();
  if (buffer_.shared_writable()) {  // Before anything changes.
    throw StatusError{absl::FailedPreconditionError(
        "a shared-writable object is never sealed; drop or discard the "
        "buffer when done")};
  }
  // Every array, tensor and buffer-protocol export of the buffer counts
  // itself in the lease (exports.h), which decides from that whether the
  // range closes at once (Lease::ClosesAtOnce).
  const int exports = internal::LiveExports(*buffer_.lease());
  if (exclusive && exports > 0) {
    throw py::buffer_error(
        std::to_string(exports) +
        " arrays or tensors made from this buffer are still alive; delete "
        "them before seal(exclusive=True): the consumer will own the memory");
  }
  // Arrays made before a shared seal stay readable, no longer writable: a
  // write through one raises instead of faulting (a write through a
  // tensor, which torch cannot make read-only, faults).
  for (const py::weakref& w : arrays_) {
    py::object a = w();
    if (a.is_none()) continue;
    py::detail::array_proxy(a.ptr())->flags &=
        ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  arrays_.clear();
  // Taken out with the GIL held (another thread may be exporting it); given
  // back if the seal did not happen.
  Buffer b = std::move(buffer_);
  buffer_ = Buffer();
  std::optional<absl::StatusOr<SealedRef>> sealed;
  {
    ReleaseGil release;
    sealed = b.Seal(exclusive, stream);
  }
  if (!sealed->ok() && b.valid()) buffer_ = std::move(b);
  return Check(*std::move(sealed));
}

void PyBuffer::Discard() {
  get();
  arrays_.clear();
  Buffer b = std::move(buffer_);  // With the GIL held, as in Seal.
  buffer_ = Buffer();
  ReleaseGil release;
  Check(b.Discard());
}

ExportSource PyBuffer::Source() {
  const Buffer& b = get();
  return {&b.info(), internal::LeaseAddress(*b.lease()), b.lease(), true};
}

// -- PyView -------------------------------------------------------------

PyView::~PyView() { shared_->Drop(open_); }

const View& PyView::get() const {
  if (!open_) {
    throw StatusError{absl::FailedPreconditionError(
        "view was closed; arrays and tensors made from it stay valid")};
  }
  return shared_->view();
}

ExportSource PyView::Source() const {
  const View& v = get();
  return {&v.info(), const_cast<void*>(v.data()), v.lease(), v.writable()};
}

void PyView::Close() {
  if (!open_) return;
  // Closed first, with the GIL held: a method of this view that runs while
  // the release waits (another thread's) finds it closed.
  open_ = false;
  shared_->Close();
}

// -- The types ------------------------------------------------------------

void AddObjectTypes(py::module_& m) {
  g_buffer_type =
      MakeType(m, "shmtensor._core.Buffer",
               "A writable buffer, visible to nobody until sealed.",
               sizeof(BufferObject), Dealloc<PyBuffer>, kBufferMethods,
               kBufferMembers, BufferGetSet(), nullptr, BufferGetAttr);
  g_view_type =
      MakeType(m, "shmtensor._core.View", "A view of a sealed object.",
               sizeof(ViewObject), Dealloc<PyView>, kViewMethods, kViewMembers,
               ViewGetSet(), ViewGetBuffer, nullptr);
  AddRefType(m);
  g_buffer_class = g_buffer_type;
  g_view_class = g_view_type;
}

void BindObjectClasses(py::handle buffer_class, py::handle view_class) {
  auto check = [](py::handle cls, PyTypeObject* base) {
    if (!PyType_Check(cls.ptr()) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), base) ||
        reinterpret_cast<PyTypeObject*>(cls.ptr())->tp_basicsize !=
            base->tp_basicsize ||
        reinterpret_cast<PyTypeObject*>(cls.ptr())->tp_dictoffset != 0
#ifdef Py_TPFLAGS_MANAGED_DICT  // Python >= 3.11: a __dict__ before the object.
        || (reinterpret_cast<PyTypeObject*>(cls.ptr())->tp_flags &
            Py_TPFLAGS_MANAGED_DICT) != 0
#endif
    ) {
      throw py::type_error(std::string("expected a subclass of ") +
                           base->tp_name + " without instance attributes");
    }
    return reinterpret_cast<PyTypeObject*>(cls.inc_ref().ptr());  // Kept.
  };
  g_buffer_class = check(buffer_class, g_buffer_type);
  g_view_class = check(view_class, g_view_type);
}

py::object NewBuffer(Buffer b) {
  return NewInstance<PyBuffer>(g_buffer_class, std::move(b));
}

py::object NewView(View v, std::shared_ptr<SharedViews> table) {
  return NewView(SharedView::Make(std::move(v), std::move(table)));
}

py::object NewView(SharedView* shared) {
  try {
    return NewInstance<PyView>(g_view_class, shared);
  } catch (...) {
    shared->Drop(/*open=*/true);
    throw;
  }
}

PyBuffer& BufferOf(py::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), g_buffer_type)) {
    throw py::type_error(std::string("expected a shmtensor Buffer, got ") +
                         Py_TYPE(obj.ptr())->tp_name);
  }
  return ValueOf<PyBuffer>(obj.ptr());
}

PyView& ViewOf(py::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), g_view_type)) {
    throw py::type_error(std::string("expected a shmtensor View, got ") +
                         Py_TYPE(obj.ptr())->tp_name);
  }
  return ValueOf<PyView>(obj.ptr());
}

}  // namespace shmtensor::python
