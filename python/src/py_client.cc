#include "python/src/py_client.h"

#include <Python.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/call_canceller.h"
#include "python/src/py_args.h"
#include "python/src/py_objects.h"
#include "python/src/py_ref.h"
#include "python/src/py_support.h"
#include "python/src/shared_view.h"
#include "shmtensor/errors.h"

namespace shmtensor::python {
namespace {

struct ClientObject {
  PyObject ob_base;  // PyObject_HEAD
  Client* client;    // Owned; set by ClientNew right after allocation.
  // The views got through this client, for its gets to share; constructed
  // and destroyed with `client`.
  std::shared_ptr<SharedViews> views;
};

PyTypeObject* g_client_type = nullptr;

Client& Self(PyObject* self) {
  return *reinterpret_cast<ClientObject*>(self)->client;
}

const std::shared_ptr<SharedViews>& ViewsOf(PyObject* self) {
  return reinterpret_cast<ClientObject*>(self)->views;
}

std::string Repr(PyObject* obj) {
  return py::repr(py::handle(obj)).cast<std::string>();
}

// Python seconds (None: wait without limit) to a duration.
absl::Duration Timeout(PyObject* seconds) {
  if (IsNone(seconds)) return absl::InfiniteDuration();
  const double s = PyFloat_AsDouble(seconds);
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error("timeout must be None or a number of seconds, got " +
                         Repr(seconds));
  }
  if (std::isinf(s) && s > 0) return absl::InfiniteDuration();
  if (std::isnan(s) || s < 0) {
    throw py::value_error("timeout must be None or >= 0 seconds, got " +
                          Repr(seconds));
  }
  return absl::Seconds(s);
}

// A str argument (None: empty).
std::string Text(const char* what, PyObject* obj) {
  if (IsNone(obj)) return std::string();
  if (!PyUnicode_Check(obj)) {
    throw py::type_error(std::string(what) + " must be a str or None, got " +
                         Py_TYPE(obj)->tp_name);
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(obj, &size);
  if (utf8 == nullptr) throw py::error_already_set();
  return std::string(utf8, size);
}

// A str argument that must be given (None refused).
std::string RequiredText(const char* what, PyObject* obj) {
  if (obj == nullptr || !PyUnicode_Check(obj)) {
    throw py::type_error(std::string(what) + " must be a str, got " +
                         (obj == nullptr ? "nothing" : Py_TYPE(obj)->tp_name));
  }
  return Text(what, obj);
}

// One dimension: an int or anything with __index__ (numpy integers).
int64_t Dimension(PyObject* shape, PyObject* dim) {
  long long d;
  if (PyLong_CheckExact(dim)) {
    d = PyLong_AsLongLong(dim);
  } else {
    PyObject* index = PyNumber_Index(dim);
    d = index == nullptr ? -1 : PyLong_AsLongLong(index);
    Py_XDECREF(index);
  }
  if (d == -1 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow) {
      throw py::value_error("shape " + Repr(shape) +
                            ": a dimension does not fit in 64 bits");
    }
    throw py::type_error("shape " + Repr(shape) +
                         ": dimensions must be integers");
  }
  return d;
}

// create_bytes()'s size: an int (or anything with __index__) >= 0.
uint64_t ByteCount(PyObject* size) {
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(size));
  if (!index) {
    PyErr_Clear();
    throw py::type_error("size must be an int, got " + Repr(size));
  }
  const unsigned long long n = PyLong_AsUnsignedLongLong(index.ptr());
  if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(
        "size must be a byte count >= 0 that fits in 64 "
        "bits, got " +
        Repr(size));
  }
  return n;
}

// A shape given as an int or a sequence of ints.
std::vector<int64_t> Shape(PyObject* shape) {
  if (PyLong_Check(shape) ||
      (PyIndex_Check(shape) && !PyTuple_Check(shape) && !PyList_Check(shape))) {
    return {Dimension(shape, shape)};
  }
  if (!PySequence_Check(shape)) {
    throw py::type_error("shape must be an int or a sequence of ints, got " +
                         Repr(shape));
  }
  py::object seq = py::reinterpret_steal<py::object>(
      PySequence_Fast(shape, "shape must be an int or a sequence of ints"));
  if (!seq) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  std::vector<int64_t> dims(n);
  for (Py_ssize_t i = 0; i < n; ++i) dims[i] = Dimension(shape, items[i]);
  return dims;
}

// Runs `attempt(wait)` and returns what it got, raising its error. A wait
// is one call to the daemon, which answers when it can (memory freed, a
// name sealed) or at the end of `timeout` (None: never), and formats the
// pool's holder report once, when the wait fails. With `try_first`, an
// attempt that does not wait comes first, on this thread (what a stock
// buffer or free memory answers at once); only if it fails with
// `retry_code` (not a limit: LIMIT_EXCEEDED is RESOURCE_EXHAUSTED too, but
// no wait lifts it) does the waiting call follow. The waiting call runs on
// a helper thread while this one answers signals every 100 ms: Ctrl-C
// cancels the call (internal::CallCanceller) and raises. The GIL is
// released while an attempt runs.
template <typename T, typename Attempt>
T WaitInterruptibly(absl::Duration timeout, absl::StatusCode retry_code,
                    bool try_first, Attempt attempt) {
  std::optional<absl::StatusOr<T>> r;
  if (try_first || timeout <= absl::ZeroDuration()) {
    {
      ReleaseGil release;
      r = attempt(absl::ZeroDuration());
    }
    if (r->ok() || r->status().code() != retry_code ||
        IsLimitExceeded(r->status()) || timeout <= absl::ZeroDuration()) {
      return Check(*std::move(r));
    }
  }
  internal::CallCanceller canceller;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread worker([&] {
    internal::ScopedCanceller scope(&canceller);
    absl::StatusOr<T> got = attempt(timeout);
    std::lock_guard<std::mutex> lock(mu);
    r = std::move(got);
    done = true;
    cv.notify_all();
  });
  bool interrupted = false;
  while (true) {
    {
      ReleaseGil release;
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, std::chrono::milliseconds(100),
                      [&] { return done; })) {
        break;
      }
    }
    if (PyErr_CheckSignals() != 0) {
      interrupted = true;
      canceller.Cancel();
      break;
    }
  }
  {
    ReleaseGil release;
    worker.join();
    if (interrupted) r.reset();  // What it got just before goes.
  }
  if (interrupted) throw py::error_already_set();
  return Check(*std::move(r));
}

PyObject* NewBufferFor(Client& c, CreateOptions& o, PyObject* timeout) {
  return NewBuffer(WaitInterruptibly<Buffer>(
                       Timeout(timeout), absl::StatusCode::kResourceExhausted,
                       /*try_first=*/true,
                       [&](absl::Duration wait) {
                         CreateOptions with = o;
                         with.timeout = wait;
                         return c.Create(with);
                       }))
      .release()
      .ptr();
}

PyObject* ClientCreate(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[6];
    BindArgs("create()", args, nargs, kwnames,
             {"shape", "dtype", "name", "timeout", "device", "shared_writable"},
             2, a);
    CreateOptions o;
    o.shape = Shape(a[0]);
    o.dtype = DTypeArg(a[1]);
    o.name = Text("name", a[2]);
    o.device = DeviceArg(a[4]);
    o.shared_writable = Truth(a[5], false);
    return NewBufferFor(Self(self), o, a[3]);
  });
}

PyObject* ClientCreateBytes(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs, PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[4];
    BindArgs("create_bytes()", args, nargs, kwnames,
             {"size", "name", "timeout", "shared_writable"}, 1, a);
    CreateOptions o;
    o.size_bytes = ByteCount(a[0]);
    o.name = Text("name", a[1]);
    o.shared_writable = Truth(a[3], false);
    return NewBufferFor(Self(self), o, a[2]);
  });
}

PyObject* ClientGet(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                    PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[3];
    BindArgs("get()", args, nargs, kwnames,
             {"ref_or_name", "timeout", "writable"}, 1, a);
    Client& c = Self(self);
    const std::shared_ptr<SharedViews>& views = ViewsOf(self);
    if (const ObjectRef* parsed = ParsedRefOf(a[0]); parsed != nullptr) {
      const ObjectRef ref = *parsed;  // Parsed once, when the ref was made.
      // A share of a lease this process holds: no call, so the interpreter's
      // lock is kept (giving it up and taking it back costs more than the
      // share). First that of a view got here, then any the client has.
      if (SharedView* shared = views->Find(ref)) {
        return NewView(shared).release().ptr();
      }
      if (std::optional<View> held = c.GetHeld(ref)) {
        return NewView(*std::move(held), views).release().ptr();
      }
      const bool writable = Truth(a[2], true);
      std::optional<absl::StatusOr<View>> v;
      {
        ReleaseGil release;
        v = c.Get(ref, writable);
      }
      return NewView(Check(*std::move(v)), views).release().ptr();
    }
    if (PyUnicode_Check(a[0])) {
      const std::string name = Text("name", a[0]);
      return NewView(
                 WaitInterruptibly<View>(
                     Timeout(a[1]), absl::StatusCode::kDeadlineExceeded,
                     /*try_first=*/false,
                     [&](absl::Duration wait) { return c.Get(name, wait); }),
                 views)
          .release()
          .ptr();
    }
    throw py::type_error(
        std::string("get() takes an ObjectRef or a name, not ") +
        Py_TYPE(a[0])->tp_name);
  });
}

PyObject* ClientNew(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kKeywords[] = {"address", "client_name", "connect_timeout",
                                    "read_only", nullptr};
  const char* address = "";
  const char* name = "";
  double connect_timeout = 5.0;
  int read_only = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ssdp:Client",
                                   const_cast<char**>(kKeywords), &address,
                                   &name, &connect_timeout, &read_only)) {
    return nullptr;
  }
  return Guarded([&]() -> PyObject* {
    if (std::isnan(connect_timeout) || connect_timeout < 0) {
      throw py::value_error("connect_timeout must be >= 0 seconds, got " +
                            std::to_string(connect_timeout));
    }
    ClientOptions o;
    o.address = address;
    o.client_name = name;
    o.connect_timeout = absl::Seconds(connect_timeout);
    o.read_only = read_only != 0;
    // This package hands out no pointer its user could keep from one buffer
    // to the next use of its memory: every one is an export the lease counts
    // or an escaped address (client/lease_address.h), which close the
    // range at once whatever the revocation.
    o.write_revocation = WriteRevocation::kDeferred;
    std::optional<absl::StatusOr<Client>> c;
    {
      ReleaseGil release;
      c = Client::Connect(o);
    }
    auto client = std::make_unique<Client>(Check(*std::move(c)));
    auto views = std::make_shared<SharedViews>();
    PyObject* obj = type->tp_alloc(type, 0);
    if (obj == nullptr) throw py::error_already_set();
    auto* self = reinterpret_cast<ClientObject*>(obj);
    self->client = client.release();
    new (&self->views) std::shared_ptr<SharedViews>(std::move(views));
    return obj;
  });
}

void ClientDealloc(PyObject* self) {
  auto* o = reinterpret_cast<ClientObject*>(self);
  Client* client = o->client;
  if (client != nullptr) {
    o->views.~shared_ptr();  // Its views keep it while they live.
    ReleaseGil release;      // Closing the session may wait for the daemon.
    delete client;
  }
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

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
    pd["stock_bytes"] = p.stock_bytes;
    pools.append(pd);
  }
  d["pools"] = pools;
  d["sessions"] = s.sessions;
  d["objects"] = s.objects;
  d["named_objects"] = s.named_objects;
  d["leases"] = s.leases;
  d["pending_transfers"] = s.pending_transfers;
  d["fork_holds"] = s.fork_holds;
  d["offers"] = s.offers;
  d["stock_objects"] = s.stock_objects;
  d["stock_bytes"] = s.stock_bytes;
  return d;
}

PyObject* ClientClientId(PyObject* self, void*) {
  return Guarded([&] { return ToPython(Self(self).client_id()); });
}

PyObject* ClientDaemonEpoch(PyObject* self, void*) {
  return Guarded([&] { return ToPython(Self(self).daemon_epoch()); });
}

PyObject* ClientAddress(PyObject* self, void*) {
  return Guarded([&] { return ToPython(Self(self).address()); });
}

PyObject* ClientHasPoolOn(PyObject* self, PyObject* device) {
  return Guarded(
      [&] { return PyBool_FromLong(Self(self).HasPoolOn(DeviceArg(device))); });
}

PyObject* ClientPoolOn(PyObject* self, PyObject* device) {
  return Guarded(
      [&] { return ToPython(Check(Self(self).PoolOn(DeviceArg(device)))); });
}

// _put(src, shape, dtype, nbytes, name, exclusive, timeout, device="cpu",
// stream=0), for the package's put(): its arguments are already checked
// and converted there.
PyObject* ClientPut(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                    PyObject* kwnames) {
  return Guarded([&] {
    constexpr const char* kFn = "_put()";
    PyObject* a[9];
    BindArgs(kFn, args, nargs, kwnames,
             {"src", "shape", "dtype", "nbytes", "name", "exclusive", "timeout",
              "device", "stream"},
             7, a);
    Client& c = Self(self);
    CreateOptions o;
    const auto src = ArgAs<uintptr_t>(kFn, "src", a[0]);
    o.shape = ArgAs<std::vector<int64_t>>(kFn, "shape", a[1]);
    o.dtype = static_cast<DType>(ArgAs<int>(kFn, "dtype", a[2]));
    // Exactly the bytes at `src`: the daemon refuses a layout that needs
    // more, so Put never reads past the caller's data.
    o.size_bytes = ArgAs<uint64_t>(kFn, "nbytes", a[3]);
    o.name = Text("name", a[4]);
    const bool exclusive = Truth(a[5], false);
    const absl::Duration timeout = Timeout(a[6]);
    o.device = DeviceArg(a[7]);
    const CudaStream stream =
        a[8] == nullptr ? 0 : ArgAs<CudaStream>(kFn, "stream", a[8]);
    // The caller keeps `src` alive and unchanged for this call.
    return NewObjectRef(WaitInterruptibly<SealedRef>(
                            timeout, absl::StatusCode::kResourceExhausted,
                            /*try_first=*/true,
                            [&](absl::Duration wait) {
                              CreateOptions with = o;
                              with.timeout = wait;
                              return c.Put(reinterpret_cast<const void*>(src),
                                           with, exclusive, stream);
                            }))
        .release()
        .ptr();
  });
}

// _put_many(items, exclusive, timeout): items a list of (src, shape,
// dtype, nbytes) for host objects, checked and converted by the package's
// put_many(), which keeps each `src` alive and unchanged for the call.
PyObject* ClientPutMany(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames) {
  return Guarded([&] {
    constexpr const char* kFn = "_put_many()";
    PyObject* a[3];
    BindArgs(kFn, args, nargs, kwnames, {"items", "exclusive", "timeout"}, 3,
             a);
    Client& c = Self(self);
    using Item = std::tuple<uintptr_t, std::vector<int64_t>, int, uint64_t>;
    const auto raw = ArgAs<std::vector<Item>>(kFn, "items", a[0]);
    const bool exclusive = Truth(a[1], false);
    const absl::Duration timeout = Timeout(a[2]);
    std::vector<PutItem> items(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      items[i].data = reinterpret_cast<const void*>(std::get<0>(raw[i]));
      items[i].options.shape = std::get<1>(raw[i]);
      items[i].options.dtype = static_cast<DType>(std::get<2>(raw[i]));
      items[i].options.size_bytes = std::get<3>(raw[i]);
    }
    std::vector<SealedRef> refs = WaitInterruptibly<std::vector<SealedRef>>(
        timeout, absl::StatusCode::kResourceExhausted, /*try_first=*/true,
        [&](absl::Duration wait) {
          std::vector<PutItem> with = items;
          for (PutItem& item : with) item.options.timeout = wait;
          return c.PutMany(with, exclusive);
        });
    py::list out(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      out[i] = NewObjectRef(std::move(refs[i]));
    }
    return out.release().ptr();
  });
}

// get_many(refs, writable=True): one round trip for all.
PyObject* ClientGetMany(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames) {
  return Guarded([&] {
    PyObject* a[2];
    BindArgs("get_many()", args, nargs, kwnames, {"refs", "writable"}, 1, a);
    Client& c = Self(self);
    py::object seq = py::reinterpret_steal<py::object>(
        PySequence_Fast(a[0], "get_many() takes a sequence of ObjectRefs"));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** objs = PySequence_Fast_ITEMS(seq.ptr());
    std::vector<ObjectRef> refs(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      const ObjectRef* r = ParsedRefOf(objs[i]);
      if (r == nullptr) {
        throw py::type_error(absl::StrCat("get_many() takes ObjectRefs; item ",
                                          i, " is a ",
                                          Py_TYPE(objs[i])->tp_name));
      }
      refs[i] = *r;
    }
    const bool writable = Truth(a[1], true);
    std::vector<absl::StatusOr<View>> views;
    {
      ReleaseGil release;
      views = c.GetMany(refs, writable);
    }
    // The first failure raises; the views got drop with the list.
    for (absl::StatusOr<View>& v : views) Check(v.status());
    py::list out(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      out[i] = NewView(*std::move(views[i]), ViewsOf(self));
    }
    return out.release().ptr();
  });
}

PyObject* ClientDelete(PyObject* self, PyObject* name) {
  return Guarded([&] {
    const std::string n = RequiredText("name", name);
    Client& c = Self(self);
    absl::Status st;
    {
      ReleaseGil release;
      st = c.Delete(n);
    }
    Check(st);
    Py_RETURN_NONE;
  });
}

PyObject* ClientStats(PyObject* self, PyObject*) {
  return Guarded([&] {
    Client& c = Self(self);
    std::optional<absl::StatusOr<StoreStats>> st;
    {
      ReleaseGil release;
      st = c.Stats();
    }
    return StatsDict(Check(*std::move(st))).release().ptr();
  });
}

PyMethodDef kClientMethods[] = {
    {"create", FastMethod(ClientCreate), METH_FASTCALL | METH_KEYWORDS,
     "create(shape, dtype, name=None, timeout=None, device=None, "
     "shared_writable=False)\n--\n\n"
     "A writable buffer of `shape` (an int or a sequence of ints) and "
     "`dtype` (NumPy dtype or type, torch dtype, or a name). Fill it through "
     "numpy.asarray(buf) or buf.tensor(), then seal() it. `name` binds a "
     "name visible once sealed. When the pool is full, waits up to `timeout` "
     "seconds for memory (None: without limit), then raises "
     "PoolExhaustedError.\n\n"
     "device: None or \"cpu\" for host shared memory; \"cuda:N\" (or a "
     "torch.device, or N) for a CUDA pool of that device, whose buffers give "
     "CUDA tensors (buf.tensor(), torch.from_dlpack) and no NumPy arrays. "
     "NotFoundError listing the daemon's pools if it has none there.\n\n"
     "shared_writable=True makes an object for processes that order their "
     "writes to it themselves: it is never sealed (seal() raises), every "
     "get() of its ref, in any process, gives a writable view, and it lives "
     "while any of them (or this buffer) holds it. No name."},
    {"create_bytes", FastMethod(ClientCreateBytes),
     METH_FASTCALL | METH_KEYWORDS,
     "create_bytes(size, name=None, timeout=None, shared_writable=False)\n--"
     "\n\nAn untyped writable buffer of `size` bytes (viewed as uint8); "
     "shared_writable as for create()."},
    {"get", FastMethod(ClientGet), METH_FASTCALL | METH_KEYWORDS,
     "get(ref_or_name, timeout=None, writable=True)\n--\n\n"
     "A view of a sealed object, by ObjectRef or by name.\n\n"
     "Read-only for a shared object; writable for the one consumer of an "
     "exclusive hand-off (a second get raises AlreadyTakenError), and for "
     "every holder of a shared-writable object. Pass writable=False to take "
     "an exclusive hand-off read-only: still yours alone, but no writable "
     "range is opened, which is cheaper when you only read it. For a name, "
     "waits up to `timeout` seconds for an object of that name to be sealed "
     "(None: without limit; 0: NotFoundError at once; else TimeoutError)."},
    {"has_pool_on", ClientHasPoolOn, METH_O,
     "has_pool_on(device)\n--\n\n"
     "True when the daemon has a pool this session may use on `device` "
     "(None or \"cpu\", \"cuda\", \"cuda:N\", an int, a torch.device)."},
    {"_pool_on", ClientPoolOn, METH_O,
     "_pool_on(device)\n--\n\n"
     "The name of the pool create() on `device` goes to by default."},
    {"_put", FastMethod(ClientPut), METH_FASTCALL | METH_KEYWORDS,
     "_put(src, shape, dtype, nbytes, name, exclusive, timeout, device='cpu', "
     "stream=0)\n--\n\n"
     "Creates on `device`, copies `nbytes` from address `src` (host memory, "
     "or for a CUDA pool device memory, copied on `stream`), seals."},
    {"_put_many", FastMethod(ClientPutMany), METH_FASTCALL | METH_KEYWORDS,
     "_put_many(items, exclusive, timeout)\n--\n\n"
     "Puts host objects given as (src, shape, dtype, nbytes), in at most "
     "one round trip for all; returns their ObjectRefs."},
    {"get_many", FastMethod(ClientGetMany), METH_FASTCALL | METH_KEYWORDS,
     "get_many(refs, writable=True)\n--\n\n"
     "get(ref, writable) of every ObjectRef in `refs`, in one round trip "
     "(none for objects this process already holds a view or ref of: those "
     "share it). Returns the views in order; the first failure raises (the "
     "views got are dropped)."},
    {"delete", ClientDelete, METH_O,
     "delete(name)\n--\n\n"
     "Unbinds `name`. The memory is freed once nothing uses it (deferred "
     "while views are alive). NotFoundError if unbound."},
    {"stats", ClientStats, METH_NOARGS,
     "stats()\n--\n\n"
     "Pool, session, object and lease counters, as a dict."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kClientGetSet[] = {
    {"client_id", ClientClientId, nullptr,
     "This session's public id: what operators see (shmtensorctl clients). "
     "It acts for nothing; the session's own id, its secret, never leaves "
     "the library.",
     nullptr},
    {"daemon_epoch", ClientDaemonEpoch, nullptr,
     "Random id of the daemon instance: clients with the same epoch share "
     "its pools (the same node).",
     nullptr},
    {"address", ClientAddress, nullptr, "The daemon's address.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

void AddClientType(py::module_& m) {
  PyType_Slot slots[] = {
      {Py_tp_new, reinterpret_cast<void*>(ClientNew)},
      {Py_tp_dealloc, reinterpret_cast<void*>(ClientDealloc)},
      {Py_tp_methods, kClientMethods},
      {Py_tp_getset, kClientGetSet},
      {Py_tp_doc, const_cast<char*>(
                      "Client(address='', client_name='', connect_timeout=5.0, "
                      "read_only=False)\n--\n\n"
                      "A session with shmtensord (use shmtensor.connect()).")},
      {0, nullptr},
  };
  PyType_Spec spec = {"shmtensor._core.Client", sizeof(ClientObject), 0,
                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  g_client_type = reinterpret_cast<PyTypeObject*>(type);
  m.add_object("Client", py::handle(type));
}

Client& ClientOf(py::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), g_client_type) ||
      reinterpret_cast<ClientObject*>(obj.ptr())->client == nullptr) {
    throw py::type_error(std::string("expected a shmtensor Client, got ") +
                         Py_TYPE(obj.ptr())->tp_name);
  }
  return Self(obj.ptr());
}

}  // namespace shmtensor::python
