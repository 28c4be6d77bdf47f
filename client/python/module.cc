// shmtensor._core: the pybind11 binding over the C++ client. The Python
// package (shmtensor/__init__.py) adds dtype handling, put(), tensor() and
// the exception classes on top; this module is not meant to be used alone.
//
// Every call that may block on the daemon releases the GIL. Errors come out
// as shmtensor.Error subclasses (see shmtensor/errors.py), built from the
// absl::Status code and reason.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lease.h"
#include "client/python/batch_ring.h"
#include "client/python/exports.h"
#include "shmtensor/client.h"
#include "shmtensor/defaults.h"
#include "shmtensor/errors.h"

namespace shmtensor::python {
namespace {

// A failed absl::Status on its way to Python.
struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}
template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError{v.status()};
  return *std::move(v);
}

// Python seconds (None: wait without limit) to a duration.
absl::Duration ToDuration(std::optional<double> seconds) {
  if (!seconds.has_value() || std::isinf(*seconds)) {
    return absl::InfiniteDuration();
  }
  if (std::isnan(*seconds) || *seconds < 0) {
    throw py::value_error("timeout must be None or >= 0 seconds, got " +
                          std::to_string(*seconds));
  }
  return absl::Seconds(*seconds);
}

py::bytes RefBytes(const ObjectRef& ref) { return py::bytes(ref.Serialize()); }

// The keywords DLPack 1.0 consumers may pass besides `stream`: max_version
// (the legacy "dltensor" capsule is returned, which they accept), dl_device
// (must be where the bytes are) and copy (a copy cannot be made here).
void CheckDlpackKeywords(const ObjectInfo& info, const py::object& dl_device,
                         const py::object& copy) {
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error(
        "__dlpack__(copy=True): shmtensor exports its bytes without a copy "
        "only; copy the resulting tensor instead");
  }
  if (dl_device.is_none()) return;
  const auto want = dl_device.cast<std::pair<int, int>>();
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

ObjectRef ParseRef(const std::string& bytes) {
  return Check(ObjectRef::Parse(bytes));
}

// The creator's ref as Python sees it (shmtensor.ObjectRef wraps it).
struct PySealedRef {
  SealedRef ref;
  explicit PySealedRef(SealedRef r) : ref(std::move(r)) {}
  PySealedRef(PySealedRef&&) = default;
  ~PySealedRef() {
    py::gil_scoped_release release;
    ref.Reset();
  }
};

// shmtensor.ObjectRef, a Python class with the slots _bytes and _owner,
// handed over by the package once defined (_set_ref_class). A strong
// reference, never dropped.
PyTypeObject* g_ref_type = nullptr;

// The ObjectRef that seal() and put() return, made here rather than by a
// Python classmethod: it holds the SealedRef (its lease) when there is one.
py::object NewObjectRef(PySealedRef sealed) {
  if (g_ref_type == nullptr) {
    throw std::logic_error("shmtensor._core: _set_ref_class was not called");
  }
  static PyObject* const kBytes = PyUnicode_InternFromString("_bytes");
  static PyObject* const kOwner = PyUnicode_InternFromString("_owner");
  py::object ref =
      py::reinterpret_steal<py::object>(g_ref_type->tp_alloc(g_ref_type, 0));
  if (!ref) throw py::error_already_set();
  py::bytes bytes = RefBytes(sealed.ref.ref());
  py::object owner =
      sealed.ref.holds_lease() ? py::cast(std::move(sealed)) : py::none();
  if (PyObject_SetAttr(ref.ptr(), kBytes, bytes.ptr()) != 0 ||
      PyObject_SetAttr(ref.ptr(), kOwner, owner.ptr()) != 0) {
    throw py::error_already_set();
  }
  return ref;
}

// A CUDA stream given as None (0: all of this process's work), a handle, or
// an object with a cuda_stream handle (torch.cuda.Stream).
CudaStream StreamHandle(const py::object& stream) {
  if (stream.is_none()) return 0;
  if (py::isinstance<py::int_>(stream)) return stream.cast<CudaStream>();
  return stream.attr("cuda_stream").cast<CudaStream>();
}

// A read-only (or taken, writable) view.
class PyView {
 public:
  explicit PyView(View v) : view_(std::move(v)) {}
  ~PyView() {
    // Only the last share of the lease sends a release (see DropWithoutGil).
    if (view_.lease() != nullptr && view_.lease().use_count() > 1) return;
    py::gil_scoped_release release;
    view_ = View();
  }
  const View& get() const {
    if (!view_.valid()) {
      throw StatusError{absl::FailedPreconditionError(
          "view was closed; arrays and tensors made from it stay valid")};
    }
    return view_;
  }
  ExportSource Source() const {
    const View& v = get();
    return {&v.info(), const_cast<void*>(v.data()), v.lease(), v.writable(),
            nullptr};
  }
  // Explicit: the last holder waits for the daemon (see View::Release).
  void Close() {
    // Taken out with the GIL held: another thread may be exporting it.
    View v = std::move(view_);
    view_ = View();
    py::gil_scoped_release release;
    if (v.valid()) v.Release().IgnoreError();
  }
  bool closed() const { return !view_.valid(); }

 private:
  View view_;
};

// bf_getbuffer of View: numpy.asarray(view) and memoryview(view) take the
// buffer protocol first, with no attribute lookups and no call, so this is
// the cheap way to an array (PyView::Source, FillBuffer). Errors are
// BufferErrors; NumPy then falls back to __array__, which raises the
// precise shmtensor error (a closed view, a CUDA object, bfloat16).
int ViewGetBuffer(PyObject* self, Py_buffer* out, int flags) {
  out->obj = nullptr;
  try {
    return FillBuffer(py::cast<const PyView&>(py::handle(self)).Source(), out,
                      flags);
  } catch (const StatusError& e) {
    PyErr_SetString(PyExc_BufferError, std::string(e.status.message()).c_str());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
  }
  return -1;
}

// A writable, unsealed buffer. Its arrays and DLPack tensors take the
// address from the lease, not Buffer::data(): they are counted here, and
// Seal chooses the revocation from them, so they mark nothing exposed.
class PyBuffer {
 public:
  explicit PyBuffer(Buffer b)
      : buffer_(std::move(b)), dlpack_(std::make_shared<std::atomic<int>>(0)) {}
  ~PyBuffer() {
    arrays_.clear();
    if (!buffer_.valid()) return;  // Sealed or discarded: nothing to send.
    py::gil_scoped_release release;
    buffer_ = Buffer();
  }
  const Buffer& get() const {
    if (!buffer_.valid()) {
      throw StatusError{absl::FailedPreconditionError(
          "buffer was sealed or discarded; get() the ref for a view")};
    }
    return buffer_;
  }
  py::array Array() {
    const Buffer& b = get();
    py::array arr = MakeArray(
        {&b.info(), b.lease()->data(), b.lease(), /*writable=*/true, nullptr});
    arrays_.push_back(py::weakref(arr));
    return arr;
  }
  py::capsule DLPack(const py::object& stream) {
    const Buffer& b = get();
    DeclareDlpackStream(stream, [&](CudaStream s) { b.UseOnStream(s); });
    return MakeDLPack({&b.info(), b.lease()->data(), b.lease(), true, dlpack_});
  }
  PySealedRef Seal(bool exclusive, CudaStream stream) {
    get();
    if (buffer_.shared_writable()) {  // Before anything changes.
      throw StatusError{absl::FailedPreconditionError(
          "a shared-writable object is never sealed; drop or discard the "
          "buffer when done")};
    }
    std::vector<py::object> live;
    for (const py::weakref& w : arrays_) {
      py::object a = w();
      if (!a.is_none()) live.push_back(a);
    }
    if (exclusive && (!live.empty() || dlpack_->load() > 0)) {
      throw py::buffer_error(
          std::to_string(live.size() + dlpack_->load()) +
          " arrays or tensors made from this buffer are still alive; delete "
          "them before seal(exclusive=True): the consumer will own the memory");
    }
    // Arrays made before a shared seal stay readable, no longer writable;
    // a write through one (or through a tensor, which torch cannot make
    // read-only) faults, so their memory is closed at once. With none
    // alive, nothing can write here any more: the range may stay open.
    const WriteRevocation revocation = live.empty() && dlpack_->load() == 0
                                           ? WriteRevocation::kDeferred
                                           : WriteRevocation::kImmediate;
    for (py::object& a : live) {
      py::detail::array_proxy(a.ptr())->flags &=
          ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    }
    arrays_.clear();
    // Taken out with the GIL held (another thread may be exporting it);
    // given back if the seal did not happen.
    Buffer b = std::move(buffer_);
    buffer_ = Buffer();
    std::optional<absl::StatusOr<SealedRef>> sealed;
    {
      py::gil_scoped_release release;
      sealed = b.Seal(exclusive, stream, revocation);
    }
    if (!sealed->ok() && b.valid()) buffer_ = std::move(b);
    return PySealedRef(Check(*std::move(sealed)));
  }
  void Discard() {
    get();
    arrays_.clear();
    Buffer b = std::move(buffer_);  // With the GIL held, as in Seal.
    buffer_ = Buffer();
    py::gil_scoped_release release;
    Check(b.Discard());
  }
  bool valid() const { return buffer_.valid(); }
  ExportSource Source() const {
    const Buffer& b = get();
    return {&b.info(), b.lease()->data(), b.lease(), true, dlpack_};
  }

 private:
  Buffer buffer_;
  std::vector<py::weakref> arrays_;           // NumPy arrays exported.
  std::shared_ptr<std::atomic<int>> dlpack_;  // Live DLPack exports.
};

py::dict StatsDict(const StoreStats& s) {
  py::dict d;
  py::list pools;
  for (const PoolUsage& p : s.pools) {
    py::dict pd;
    pd["name"] = p.name;
    pd["size_bytes"] = p.size_bytes;
    pd["used_bytes"] = p.used_bytes;
    pd["free_bytes"] = p.free_bytes;
    pd["largest_free_bytes"] = p.largest_free_bytes;
    pd["huge_page_size"] = p.huge_page_size;
    pd["objects"] = p.objects;
    pools.append(pd);
  }
  d["pools"] = pools;
  d["sessions"] = s.sessions;
  d["objects"] = s.objects;
  d["named_objects"] = s.named_objects;
  d["leases"] = s.leases;
  d["pending_transfers"] = s.pending_transfers;
  return d;
}

template <typename T>
py::tuple Tuple(const std::vector<T>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t;
}

// Properties shared by Buffer and View.
template <typename Cls, typename Get>
void AddInfoProperties(py::class_<Cls>& cls, Get get_info) {
  cls.def_property_readonly(
         "shape", [get_info](const Cls& c) { return Tuple(get_info(c).shape); },
         "Elements per dimension.")
      .def_property_readonly(
          "strides",
          [get_info](const Cls& c) { return Tuple(get_info(c).strides_bytes); },
          "Bytes between elements per dimension (NumPy convention).")
      .def_property_readonly(
          "dtype_code",
          [get_info](const Cls& c) {
            return static_cast<int>(get_info(c).dtype);
          },
          "The shmtensor.v1.DType value.")
      .def_property_readonly(
          "nbytes", [get_info](const Cls& c) { return get_info(c).size_bytes; },
          "Bytes the data spans.")
      .def_property_readonly(
          "ref_bytes",
          [get_info](const Cls& c) { return RefBytes(get_info(c).ref); },
          "The serialised ObjectRef of the object.")
      .def_property_readonly(
          "device",
          [get_info](const Cls& c) { return DeviceName(get_info(c).device); },
          "Where the bytes are: 'cpu' or 'cuda:N'.")
      .def("__dlpack_device__", [get_info](const Cls& c) {
        const Device& d = get_info(c).device;
        // DLPack: kDLCPU = 1, kDLCUDA = 2.
        return d.is_cuda() ? py::make_tuple(2, d.index) : py::make_tuple(1, 0);
      });
}

// Runs `attempt(wait)` in slices of at most one second until it succeeds, fails
// with something other than `retry_code`, or `timeout` has passed, so that a
// long wait (timeout=None waits without limit) still answers Ctrl-C.
template <typename T, typename Attempt>
T WaitInSlices(absl::Duration timeout, absl::StatusCode retry_code,
               Attempt attempt) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    std::optional<absl::StatusOr<T>> r;
    {
      py::gil_scoped_release release;
      r = attempt(std::min(left, absl::Seconds(1)));
    }
    if (r->ok() || r->status().code() != retry_code) {
      return Check(*std::move(r));
    }
    if (absl::Now() >= deadline) {
      if (timeout <= absl::Seconds(1)) return Check(*std::move(r));
      throw StatusError{absl::Status(
          r->status().code(),
          absl::StrCat(r->status().message(), " (waited ",
                       absl::FormatDuration(timeout), " in all)"))};
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace
}  // namespace shmtensor::python

using namespace shmtensor;          // NOLINT: the module body only.
using namespace shmtensor::python;  // NOLINT

PYBIND11_MODULE(_core, m) {
  m.doc() = "shmtensor C++ client binding (use the shmtensor package).";

  // StatusError -> shmtensor.errors.from_status(code, reason, message).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object errors = py::module_::import("shmtensor.errors");
      py::object exc = errors.attr("from_status")(
          static_cast<int>(e.status.code()), ErrorReasonOf(e.status),
          std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())),
                      exc.ptr());
    }
  });

  m.def(
      "_cpp_lifecycles",
      [](Client& c, int64_t nbytes, int count) {
        // Benchmark hook (bench/python_bench.py): `count` lifecycles of the
        // C++ client back to back, as a C++ program would run them, the
        // same steps as bench/python_bench.py's Python loop. Returns the
        // thread CPU time they took, in microseconds.
        py::gil_scoped_release release;
        timespec t0, t1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        for (int i = 0; i < count; ++i) {
          Buffer buf = Check(
              c.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
          static_cast<float*>(buf.data())[0] = 1.0f;
          SealedRef ref = Check(buf.Seal());
          View v = Check(c.Get(ref.ref()));
          if (static_cast<const float*>(v.data())[0] != 1.0f) {
            throw StatusError{absl::DataLossError("bytes differ")};
          }
        }  // The view, then the ref, release as they go out of scope.
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        return (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
      },
      py::arg("client"), py::arg("nbytes"), py::arg("count"));
  m.def(
      "_cpp_lifecycle",
      [](Client& c, int64_t nbytes) {
        // Benchmark hook (bench/python_bench.py): one lifecycle of the C++
        // client in this process, to compare the binding's overhead
        // against. Returns (wall us, [thread CPU us of each step: nothing
        // (the timer's own cost), create, fill, seal, get, read, release
        // view, release ref]).
        std::vector<double> steps;
        absl::Duration wall;
        {
          py::gil_scoped_release release;
          auto cpu_us = [] {
            timespec ts;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
          };
          double t = cpu_us();
          auto step = [&] {
            const double now = cpu_us();
            steps.push_back(now - t);
            t = now;
          };
          const absl::Time t0 = absl::Now();
          step();  // Nothing: what timing a step costs.
          Buffer buf = Check(
              c.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
          step();
          static_cast<float*>(buf.data())[0] = 1.0f;
          step();
          SealedRef ref = Check(buf.Seal());
          step();
          std::optional<View> v(Check(c.Get(ref.ref())));
          step();
          if (static_cast<const float*>(v->data())[0] != 1.0f) {
            throw StatusError{absl::DataLossError("bytes differ")};
          }
          step();
          v.reset();
          step();
          ref.Reset();
          step();
          wall = absl::Now() - t0;
        }
        return py::make_tuple(absl::ToDoubleMicroseconds(wall), steps);
      },
      py::arg("client"), py::arg("nbytes"));
  m.def(
      "_keep_clients_alive_until_exit",
      [] {
        py::gil_scoped_release release;
        Client::KeepAliveUntilExit();
      },
      "For atexit: see Client::KeepAliveUntilExit (shmtensor/client.h).");
  m.def(
      "_set_ref_class",
      [](py::object cls) {
        if (!PyType_Check(cls.ptr())) throw py::type_error("a class");
        g_ref_type = reinterpret_cast<PyTypeObject*>(cls.release().ptr());
      },
      "For the package: the class that seal() and put() return "
      "(shmtensor.ObjectRef).");
  m.def("default_address", &DefaultAddress,
        "The daemon address used when none is given ($SHMTENSOR_ADDRESS or "
        "unix:/tmp/shmtensord-<uid>.sock).");
  m.def(
      "parse_ref",
      [](const std::string& b) {
        ObjectRef r = ParseRef(b);
        return py::make_tuple(r.daemon_epoch, r.slot, r.generation,
                              r.exclusive);
      },
      "Fields (epoch, slot, generation, exclusive) of a serialised ref.");

  py::class_<PySealedRef>(m, "SealedRef",
                          "The creator's ref; holds a lease while alive.")
      .def_property_readonly(
          "ref_bytes",
          [](const PySealedRef& r) { return RefBytes(r.ref.ref()); })
      .def_property_readonly(
          "holds_lease",
          [](const PySealedRef& r) { return r.ref.holds_lease(); })
      .def("reset", [](PySealedRef& r) {
        SealedRef share = r.ref;  // With the GIL held; r keeps the ref.
        r.ref.Reset();
        py::gil_scoped_release release;
        share.Release().IgnoreError();  // Explicit: waits (last holder).
      });

  py::class_<PyView> view(m, "View", "A view of a sealed object.");
  {
    // The buffer protocol, with an owner of our own in Py_buffer.obj (see
    // FillBuffer): pybind11's def_buffer would make every array keep the
    // View itself, whose close() must not wait for them.
    auto* heap = reinterpret_cast<PyHeapTypeObject*>(view.ptr());
    heap->as_buffer.bf_getbuffer = ViewGetBuffer;
    heap->as_buffer.bf_releasebuffer = nullptr;
    heap->ht_type.tp_as_buffer = &heap->as_buffer;
    PyType_Modified(&heap->ht_type);
  }
  AddInfoProperties(view, [](const PyView& v) -> const ObjectInfo& {
    return v.get().info();
  });
  view.def_property_readonly(
          "writable", [](const PyView& v) { return v.get().writable(); },
          "True only for the consumer of an exclusive hand-off.")
      .def_property_readonly("closed", &PyView::closed)
      .def_property_readonly(
          "address",
          [](const PyView& v) {
            return reinterpret_cast<uintptr_t>(v.get().data());
          },
          "Address of the first byte in this process.")
      .def(
          "__array__",
          [](const PyView& v, py::object dtype) {
            py::array a = MakeArray(v.Source());
            return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none(),
          "A zero-copy ndarray (read-only unless writable). It keeps the "
          "object alive while it lives.")
      .def(
          "__dlpack__",
          [](const PyView& v, py::object stream, py::object max_version,
             py::object dl_device, py::object copy) {
            const View& view = v.get();
            CheckDlpackKeywords(view.info(), dl_device, copy);
            DeclareDlpackStream(stream,
                                [&](CudaStream s) { view.UseOnStream(s); });
            return MakeDLPack(v.Source());
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "A DLPack capsule (zero-copy).")
      .def("close", &PyView::Close,
           "Drops this view's share of the lease. Arrays and tensors made from "
           "it keep their own share: the lease ends when the last one dies. "
           "When this was the last share, waits for the daemon, so the memory "
           "is back in the pool for every process on return.");

  py::class_<PyBuffer> buffer(
      m, "Buffer", "A writable buffer, visible to nobody until sealed.");
  AddInfoProperties(buffer, [](const PyBuffer& b) -> const ObjectInfo& {
    return b.get().info();
  });
  buffer.def_property_readonly("valid", &PyBuffer::valid)
      .def_property_readonly(
          "address",
          [](const PyBuffer& b) {
            return reinterpret_cast<uintptr_t>(b.get().data());
          },
          "Address of the first byte in this process, for identity checks. "
          "Not a view: it keeps nothing alive, and after seal() a write "
          "through it is undefined (arrays and tensors are the way to "
          "write).")
      .def(
          "__array__",
          [](PyBuffer& b, py::object dtype) {
            py::array a = b.Array();
            return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none(), "A zero-copy writable ndarray.")
      .def(
          "__dlpack__",
          [](PyBuffer& b, py::object stream, py::object max_version,
             py::object dl_device, py::object copy) {
            CheckDlpackKeywords(b.get().info(), dl_device, copy);
            return b.DLPack(stream);
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "A DLPack capsule (zero-copy).")
      .def(
          "seal",
          [](PyBuffer& b, bool exclusive, const py::object& stream) {
            return NewObjectRef(b.Seal(exclusive, StreamHandle(stream)));
          },
          py::arg("exclusive") = false, py::arg("stream") = py::none(),
          "Makes the object immutable and returns its ObjectRef.\n\n"
          "CUDA buffers: first waits until the GPU work that filled the "
          "buffer is done: all of this process's work on the device, or only "
          "the work on `stream` (a torch.cuda.Stream, or its handle) when "
          "given. A consumer never sees the object before that.\n\n"
          "A shared seal returns a ref that keeps the object alive; arrays "
          "made from the buffer stay readable but not writable (a write "
          "through a torch tensor made from the buffer would fault: drop "
          "those first). With exclusive=True the object goes to exactly one "
          "consumer: the returned ref holds nothing, this process can no "
          "longer write it, and arrays or tensors made from the buffer must "
          "be gone (else BufferError).\n\n"
          "When no array or tensor of the buffer is alive at seal, its memory "
          "is not write-protected again in this process (nothing can reach "
          "it), which saves two page-table changes per buffer when the "
          "memory is reused here; views always read through a read-only "
          "mapping (docs/shm_layout.md, \"Deferred closing\").")
      .def("discard", &PyBuffer::Discard, "Discards the unsealed object.");

  py::class_<BatchRing>(
      m, "BatchRing",
      "Slots for batches in one shared-writable object, handed from a "
      "producer process to a consumer with no daemon call per batch (see "
      "client/python/batch_ring.h).")
      .def_static(
          "bytes",
          [](int slots, uint64_t slot_bytes, uint64_t align) {
            return Check(BatchRing::Bytes(slots, slot_bytes, align));
          },
          py::arg("slots"), py::arg("slot_bytes"), py::arg("align"),
          "Bytes a ring's object needs.")
      .def_static(
          "create",
          [](PyBuffer& b, int slots, uint64_t slot_bytes, uint64_t align) {
            return Check(
                BatchRing::Open(b.Source(), slots, slot_bytes, align, true));
          },
          py::arg("buffer"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The producer's ring over a shared-writable buffer it just made "
          "(every slot free).")
      .def_static(
          "join",
          [](PyView& v, int slots, uint64_t slot_bytes, uint64_t align) {
            return Check(
                BatchRing::Open(v.Source(), slots, slot_bytes, align, false));
          },
          py::arg("view"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The consumer's ring over a writable view of the producer's object.")
      .def_property_readonly("slots", &BatchRing::slots)
      .def_property_readonly("slot_bytes", &BatchRing::slot_bytes)
      .def_property_readonly("align", &BatchRing::align)
      .def("claim", &BatchRing::Claim,
           "A free slot, now being filled, or -1 when all are in use.")
      .def("generation", &BatchRing::Generation, py::arg("slot"))
      .def("target", &BatchRing::Target, py::arg("slot"), py::arg("nbytes"),
           "A DLPack capsule (uint8) over a claimed slot, to fill.")
      .def(
          "hand", [](BatchRing& r, int slot) { Check(r.Hand(slot)); },
          py::arg("slot"), "The claimed slot's batch is complete.")
      .def(
          "unclaim", [](BatchRing& r, int slot) { Check(r.Unclaim(slot)); },
          py::arg("slot"), "The claimed slot was not filled after all.")
      .def(
          "adopt",
          [](BatchRing& r, int slot, uint32_t generation, uint64_t nbytes) {
            return Check(r.Adopt(slot, generation, nbytes));
          },
          py::arg("slot"), py::arg("generation"), py::arg("nbytes"),
          "A DLPack capsule (uint8) over a handed slot; the slot is free "
          "again when the last tensor over it dies. Raises for a stale "
          "handle.")
      .def("abandon", &BatchRing::Abandon, py::arg("slot"),
           py::arg("generation"))
      .def("reclaim_handed", &BatchRing::ReclaimHanded);

  py::class_<Client>(m, "Client", "A session with shmtensord.")
      .def_static(
          "connect",
          [](const std::string& address, const std::string& name,
             double connect_timeout) {
            ClientOptions o;
            o.address = address;
            o.client_name = name;
            o.connect_timeout = absl::Seconds(connect_timeout);
            // Every pointer this package hands out into a writable buffer or
            // view is an array or tensor it counts (PyBuffer, MakeArray,
            // MakeDLPack), and a lease is released only when the last is
            // gone; where one is alive at a seal, PyBuffer::Seal asks for
            // kImmediate.
            o.write_revocation = WriteRevocation::kDeferred;
            py::gil_scoped_release release;
            return Check(Client::Connect(o));
          },
          py::arg("address"), py::arg("client_name"),
          py::arg("connect_timeout"))
      .def_property_readonly("session_id", &Client::session_id)
      .def_property_readonly("daemon_epoch", &Client::daemon_epoch)
      .def_property_readonly("address", &Client::address)
      .def(
          "has_pool_on",
          [](const Client& c, const std::string& device) {
            return c.HasPoolOn(Check(ParseDevice(device)));
          },
          py::arg("device"), "True when the daemon has a pool on `device`.")
      .def(
          "create",
          [](Client& c, std::vector<int64_t> shape, int dtype, uint64_t size,
             const std::string& name, std::optional<double> timeout,
             const std::string& device, bool shared_writable) {
            CreateOptions o;
            o.device = Check(ParseDevice(device));
            o.shape = std::move(shape);
            o.dtype = static_cast<DType>(dtype);
            o.size_bytes = size;
            o.name = name;
            o.shared_writable = shared_writable;
            return std::make_unique<PyBuffer>(WaitInSlices<Buffer>(
                ToDuration(timeout), absl::StatusCode::kResourceExhausted,
                [&](absl::Duration slice) {
                  o.timeout = slice;
                  return c.Create(o);
                }));
          },
          py::arg("shape"), py::arg("dtype"), py::arg("size_bytes"),
          py::arg("name"), py::arg("timeout"), py::arg("device") = "cpu",
          py::arg("shared_writable") = false)
      .def(
          "put",
          [](Client& c, uintptr_t src, std::vector<int64_t> shape, int dtype,
             uint64_t nbytes, const std::string& name, bool exclusive,
             std::optional<double> timeout, const std::string& device,
             CudaStream stream) {
            CreateOptions o;
            o.device = Check(ParseDevice(device));
            o.shape = std::move(shape);
            o.dtype = static_cast<DType>(dtype);
            // Exactly the bytes at `src`: the daemon refuses a layout that
            // needs more, so Put never reads past the caller's data.
            o.size_bytes = nbytes;
            o.name = name;
            // The caller keeps `src` alive and unchanged for this call.
            return NewObjectRef(PySealedRef(WaitInSlices<SealedRef>(
                ToDuration(timeout), absl::StatusCode::kResourceExhausted,
                [&](absl::Duration slice) {
                  o.timeout = slice;
                  return c.Put(reinterpret_cast<const void*>(src), o, exclusive,
                               stream);
                })));
          },
          py::arg("src"), py::arg("shape"), py::arg("dtype"), py::arg("nbytes"),
          py::arg("name"), py::arg("exclusive"), py::arg("timeout"),
          py::arg("device") = "cpu", py::arg("stream") = 0,
          "Creates on `device`, copies `nbytes` from address `src` (host "
          "memory, or for a CUDA pool device memory, copied on `stream`), "
          "seals.")
      .def(
          "get_ref",
          [](Client& c, const std::string& ref_bytes, bool writable) {
            ObjectRef ref = ParseRef(ref_bytes);
            std::optional<absl::StatusOr<View>> v;
            {
              py::gil_scoped_release release;
              v = c.Get(ref, writable);
            }
            return std::make_unique<PyView>(Check(*std::move(v)));
          },
          py::arg("ref_bytes"), py::arg("writable") = true)
      .def(
          "get_name",
          [](Client& c, const std::string& name,
             std::optional<double> timeout) {
            return std::make_unique<PyView>(WaitInSlices<View>(
                ToDuration(timeout), absl::StatusCode::kDeadlineExceeded,
                [&](absl::Duration slice) { return c.Get(name, slice); }));
          },
          py::arg("name"), py::arg("timeout"))
      .def(
          "delete",
          [](Client& c, const std::string& name) {
            py::gil_scoped_release release;
            Check(c.Delete(name));
          },
          py::arg("name"))
      .def("stats", [](Client& c) {
        std::optional<absl::StatusOr<StoreStats>> s;
        {
          py::gil_scoped_release release;
          s = c.Stats();
        }
        return StatsDict(Check(*std::move(s)));
      });
}
