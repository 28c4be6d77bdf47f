#include "python/src/py_args.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/src/py_support.h"

namespace shmtensor::python {
namespace {

std::string Str(PyObject* obj) {
  return py::str(py::handle(obj)).cast<std::string>();
}

std::string Repr(PyObject* obj) {
  return py::repr(py::handle(obj)).cast<std::string>();
}

// sys.modules[name], or null when it was never imported: the binding
// never imports NumPy or torch itself.
py::object Loaded(const char* name) {
  PyObject* m = PyImport_GetModule(py::str(name).ptr());
  if (m == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(m);
}

absl::Status Unknown(PyObject* dtype) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype ", Repr(dtype)));
}

// The dtype of a numpy.dtype, through its type string; an error names it
// as NumPy shows it.
DType OfDescr(py::handle descr) {
  const std::string typestr = descr.attr("str").cast<std::string>();
  absl::StatusOr<DType> d = DTypeOfTypestr(typestr, typestr);
  if (d.ok()) return *d;
  return Check(DTypeOfTypestr(typestr, Str(descr.ptr())));
}

// What numpy.dtype makes of `dtype`. A numpy.dtype itself (an array's
// .dtype: put()'s every call) is read as it is.
DType ByNumPy(PyObject* dtype) {
  if (py::isinstance<py::dtype>(dtype)) return OfDescr(dtype);
  py::object numpy = Loaded("numpy");
  if (!numpy) throw StatusError{Unknown(dtype)};
  py::object descr;
  try {
    descr = numpy.attr("dtype")(py::handle(dtype));
  } catch (const py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    throw StatusError{Unknown(dtype)};
  }
  return OfDescr(descr);
}

bool IsTorchDType(PyObject* obj) {
  return std::strcmp(Py_TYPE(obj)->tp_name, "torch.dtype") == 0;
}

// DTypeArg's memory of dtype objects read (see py_args.h). Its references
// are never dropped at exit (the interpreter may be gone by then). GIL held.
class DTypeCache {
 public:
  std::optional<DType> Find(PyObject* dtype) const {
    for (const Entry& e : entries_) {
      if (e.object == dtype) return e.dtype;
    }
    return std::nullopt;
  }
  void Add(PyObject* dtype, DType d) {
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    PyObject* evicted = e.object;
    Py_INCREF(dtype);
    e = Entry{dtype, d};
    Py_XDECREF(evicted);  // Last: its deallocation may run Python code.
  }

 private:
  static constexpr size_t kEntries = 16;
  struct Entry {
    PyObject* object = nullptr;  // A strong reference.
    DType dtype = DType::kUInt8;
  };
  std::array<Entry, kEntries> entries_;
  size_t next_ = 0;
};

DTypeCache& Cache() {
  static auto* cache = new DTypeCache;
  return *cache;
}

}  // namespace

DType DTypeArg(PyObject* dtype) {
  if (PyUnicode_Check(dtype)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(dtype, &size);
    if (text == nullptr) throw py::error_already_set();
    absl::StatusOr<DType> parsed =
        ParseDType(absl::string_view(text, static_cast<size_t>(size)));
    if (!absl::IsNotFound(parsed.status())) return Check(std::move(parsed));
    return ByNumPy(dtype);
  }
  // Only objects whose meaning cannot change are remembered: dtypes, not
  // what numpy.dtype() reads a dtype from (an object's .dtype attribute).
  const bool torch_dtype = IsTorchDType(dtype);
  const bool numpy_dtype = !torch_dtype && py::isinstance<py::dtype>(dtype);
  if (torch_dtype || numpy_dtype) {
    if (std::optional<DType> known = Cache().Find(dtype)) return *known;
  }
  // str(torch.float) is "torch.float32": torch names its dtypes by the
  // table's names.
  const DType d = torch_dtype ? Check(ParseDType(Str(dtype))) : ByNumPy(dtype);
  if (torch_dtype || numpy_dtype) Cache().Add(dtype, d);
  return d;
}

PyObject* ArraySource(PyObject* array) {
  if (!py::isinstance<py::array>(array)) {
    throw py::type_error(std::string("_array_source() takes a numpy.ndarray, "
                                     "not ") +
                         Py_TYPE(array)->tp_name);
  }
  const auto a = py::reinterpret_borrow<py::array>(array);
  if ((a.flags() & py::array::c_style) == 0) return py::none().release().ptr();
  const DType dtype = DTypeArg(a.dtype().ptr());
  py::tuple shape(a.ndim());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) shape[i] = py::int_(a.shape(i));
  // The bytes from the table's item size: pybind11 before 2.12 reads a
  // dtype's item size where NumPy 1 kept it, which NumPy 2 moved (a Debian
  // 12 virtualenv can pair the two); the array's own fields (data, shape,
  // flags, descr) are where they were.
  const auto nbytes =
      static_cast<uint64_t>(a.size()) * static_cast<uint64_t>(ItemSize(dtype));
  return py::make_tuple(reinterpret_cast<uintptr_t>(a.data()), shape,
                        static_cast<int>(dtype), nbytes)
      .release()
      .ptr();
}

Device DeviceArg(PyObject* device) {
  if (device == nullptr || device == Py_None) return Device::Host();
  if (PyLong_Check(device) && !PyBool_Check(device)) {
    const long index = PyLong_AsLong(device);
    if (index == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (index < 0 || index > INT32_MAX) {
      throw StatusError{absl::InvalidArgumentError(absl::StrCat(
          "device ", index, " is not a CUDA device ordinal (>= 0)"))};
    }
    return Device::Cuda(static_cast<int>(index));
  }
  const std::string name = Str(device);
  if (name == "cuda") {
    // torch's "current CUDA device", as torch keeps it (torch.cuda.
    // set_device): only torch knows it, in the CUDA runtime it loaded.
    int index = 0;
    if (py::object torch = Loaded("torch")) {
      py::object cuda = torch.attr("cuda");
      if (cuda.attr("is_available")().cast<bool>()) {
        index = cuda.attr("current_device")().cast<int>();
      }
    }
    return Device::Cuda(index);
  }
  return Check(ParseDevice(name));
}

}  // namespace shmtensor::python
