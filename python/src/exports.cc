#include "python/src/exports.h"

#include <Python.h>

#include <string>
#include <vector>

#include "client/lease_address.h"
#include "python/src/dlpack.h"
#include "python/src/py_support.h"

namespace shmtensor::python {
namespace {

// A counted export of the source's lease (client/lease_address.h), for
// the object that exports to own; null for a source without a lease.
internal::LeaseExport* ExportOf(const ExportSource& src) {
  return src.lease == nullptr ? nullptr : new internal::LeaseExport(src.lease);
}

// Ends an export from a destructor that may hold the GIL: its lease share
// goes, and the last share releases the lease with an RPC, which must not
// stall Python. Any other share just goes, GIL held (a share dropped at
// the same moment on another thread may make this one the last after all:
// then the release message goes out with the GIL held, which delays
// Python, nothing else).
void DropWithoutGil(internal::LeaseExport* e) {
  if (e == nullptr || e->lease().use_count() > 1) {
    delete e;
    return;
  }
  if (PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    delete e;
    PyEval_RestoreThread(state);
  } else {
    delete e;
  }
}

// How a dtype is spelt for NumPy (numpy.dtype) and for the buffer protocol
// (PEP 3118), from the dtype table (shmtensor/dtype.h); null where there is
// none (bfloat16). The bytes are little-endian: buffer formats are native
// on a little-endian host (memoryview indexes and converts only native
// ones), explicit "<" ones otherwise.
struct Formats {
  const char* numpy;
  const char* buffer;
};

Formats FormatsOf(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  if (info == nullptr) return {nullptr, nullptr};
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return {info->numpy, info->buffer};
#else
  static const std::vector<std::string>* explicit_le = [] {
    auto* v = new std::vector<std::string>();  // Never freed.
    for (const DTypeInfo* d = DTypesBegin(); d != DTypesEnd(); ++d) {
      v->push_back(d->buffer == nullptr ? ""
                   : d->item_size == 1  ? d->buffer
                                        : std::string("<") + d->buffer);
    }
    return v;
  }();
  return {info->numpy, info->buffer == nullptr
                           ? nullptr
                           : (*explicit_le)[static_cast<int>(dtype)].c_str()};
#endif
}

// What a buffer export's owner keeps alive: the lease's export and the
// arrays the Py_buffer points to.
struct BufferExport {
  internal::LeaseExport* lease = nullptr;
  std::vector<Py_ssize_t> shape;
  std::vector<Py_ssize_t> strides;  // Bytes.
};

void DeleteBufferExport(PyObject* capsule) {
  auto* e = static_cast<BufferExport*>(
      PyCapsule_GetPointer(capsule, "shmtensor.buffer_export"));
  DropWithoutGil(e->lease);
  delete e;
}

int BufferError(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  return -1;
}

// DLPack's type of a dtype, from the dtype table; false for one torch may
// lack (unsigned beyond 8 bits, torch 1.13).
bool ToDLDataType(DType dtype, DLDataType* out) {
  const DTypeInfo* info = FindDType(dtype);
  if (info == nullptr || !info->torch) return false;
  const uint8_t bits = static_cast<uint8_t>(info->item_size * 8);
  switch (info->kind) {
    case 'b':  // torch 1.13 rejects DLPack's bool code: bools travel as
               // uint8 and view.tensor() reinterprets them.
    case 'u':
      *out = {kDLUInt, bits, 1};
      return true;
    case 'i':
      *out = {kDLInt, bits, 1};
      return true;
    case 'f':
      *out = {kDLFloat, bits, 1};
      return true;
    case 'B':
      *out = {kDLBfloat, bits, 1};
      return true;
    case 'c':
      *out = {kDLComplex, bits, 1};
      return true;
  }
  return false;
}

// The DLManagedTensor's context: the shape, strides and lease it refers to.
struct DLContext {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // Elements.
  internal::LeaseExport* lease = nullptr;
  std::function<void()> on_release;
};

void DeleteDLContext(DLManagedTensor* self) {
  auto* ctx = static_cast<DLContext*>(self->manager_ctx);
  if (ctx->on_release) ctx->on_release();
  DropWithoutGil(ctx->lease);
  delete ctx;
}

// OK unless the source's lease was lost (client/lease_address.h).
absl::Status HeldOrNone(const ExportSource& src) {
  return src.lease != nullptr ? internal::LeaseHeld(*src.lease)
                              : absl::OkStatus();
}

}  // namespace

py::array MakeArray(const ExportSource& src) {
  const ObjectInfo& info = *src.info;
  Check(HeldOrNone(src));
  if (info.device.is_cuda()) {
    throw py::type_error("the object is in CUDA memory (" +
                         DeviceName(info.device) +
                         "), which NumPy cannot address; use .tensor() or "
                         "torch.from_dlpack() for a CUDA tensor");
  }
  const char* format = FormatsOf(info.dtype).numpy;
  if (format == nullptr) {
    throw py::type_error(std::string("dtype ") + DTypeName(info.dtype) +
                         " has no NumPy equivalent; use .tensor() or "
                         "torch.from_dlpack() instead");
  }
  std::vector<py::ssize_t> shape, strides;
  if (info.dtype == DType::kUnspecified) {
    shape.push_back(static_cast<py::ssize_t>(info.size_bytes));
    strides.push_back(1);
  } else {
    shape.assign(info.shape.begin(), info.shape.end());
    strides.assign(info.strides_bytes.begin(), info.strides_bytes.end());
  }
  // Parsed once per dtype: dtype construction dominates a small export.
  static py::object* dtypes[kMaxDTypeValue + 1] = {};
  py::object*& dt = dtypes[static_cast<int>(info.dtype)];
  if (dt == nullptr) dt = new py::object(py::dtype(format));  // Never freed.
  py::capsule owner(ExportOf(src), [](void* p) {
    DropWithoutGil(static_cast<internal::LeaseExport*>(p));
  });
  py::array arr(py::reinterpret_borrow<py::dtype>(*dt), shape, strides,
                src.data, owner);
  if (!src.writable) {
    py::detail::array_proxy(arr.ptr())->flags &=
        ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return arr;
}

py::capsule MakeDLPack(const ExportSource& src) {
  const ObjectInfo& info = *src.info;
  Check(HeldOrNone(src));
  DLDataType dl_type;
  if (!ToDLDataType(info.dtype, &dl_type)) {
    throw py::type_error(std::string("dtype ") + DTypeName(info.dtype) +
                         " has no torch equivalent in torch 1.13; use "
                         "numpy.asarray() instead");
  }
  auto* ctx = new DLContext();
  if (info.dtype == DType::kUnspecified) {
    ctx->shape = {static_cast<int64_t>(info.size_bytes)};
    ctx->strides = {1};
  } else {
    const int64_t item = ItemSize(info.dtype);
    ctx->shape = info.shape;
    for (int64_t s : info.strides_bytes) ctx->strides.push_back(s / item);
  }
  ctx->lease = ExportOf(src);
  ctx->on_release = src.on_release;
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = src.data;
  t.device = info.device.is_cuda()
                 ? DLDevice{kDLCUDA, static_cast<int32_t>(info.device.index)}
                 : DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = dl_type;
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteDLContext;
  // A capsule nobody consumed still owns the tensor; a consumer renames it
  // "used_dltensor" and calls the deleter itself.
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(
          PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  });
}

int FillBuffer(const ExportSource& src, Py_buffer* out, int flags) {
  out->obj = nullptr;
  const ObjectInfo& info = *src.info;
  if (absl::Status s = HeldOrNone(src); !s.ok()) {
    return BufferError(std::string(s.message()));
  }
  if (info.device.is_cuda()) {
    return BufferError("the object is in " + DeviceName(info.device) +
                       " memory, which the buffer protocol cannot address");
  }
  const char* format = FormatsOf(info.dtype).buffer;
  if (format == nullptr) {
    return BufferError(std::string("dtype ") + DTypeName(info.dtype) +
                       " has no buffer-protocol format");
  }
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && !src.writable) {
    return BufferError("the view is read-only");
  }
  auto e = std::make_unique<BufferExport>();
  Py_ssize_t item = 1;
  if (info.dtype == DType::kUnspecified) {
    e->shape = {static_cast<Py_ssize_t>(info.size_bytes)};
    e->strides = {1};
  } else {
    item = static_cast<Py_ssize_t>(ItemSize(info.dtype));
    e->shape.assign(info.shape.begin(), info.shape.end());
    e->strides.assign(info.strides_bytes.begin(), info.strides_bytes.end());
  }
  const int ndim = static_cast<int>(e->shape.size());
  Py_ssize_t len = item;
  for (Py_ssize_t n : e->shape) len *= n;
  // Contiguity as the buffer protocol sees it (dimensions of one element
  // have any stride; an empty array is contiguous).
  bool c_order = true, f_order = true;
  Py_ssize_t c_expect = item, f_expect = item;
  for (int i = 0; i < ndim; ++i) {
    const int r = ndim - 1 - i;
    if (e->shape[r] != 1 && e->strides[r] != c_expect) c_order = false;
    c_expect *= e->shape[r];
    if (e->shape[i] != 1 && e->strides[i] != f_expect) f_order = false;
    f_expect *= e->shape[i];
  }
  if (len == 0) c_order = f_order = true;
  if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !c_order) {
    return BufferError("the object is not C-contiguous: ask for strides");
  }
  if (((flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS && !c_order) ||
      ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && !f_order) ||
      ((flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS && !c_order &&
       !f_order)) {
    return BufferError("the object is not laid out contiguously as asked");
  }
  e->lease = ExportOf(src);
  PyObject* owner =
      PyCapsule_New(e.get(), "shmtensor.buffer_export", DeleteBufferExport);
  if (owner == nullptr) {
    DropWithoutGil(e->lease);
    return -1;
  }
  BufferExport* kept = e.release();  // The capsule owns it now.
  out->obj = owner;
  out->buf = src.data;
  out->len = len;
  out->readonly = src.writable ? 0 : 1;
  out->itemsize = item;
  out->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(format) : nullptr;
  out->ndim = ndim;
  out->shape = (flags & PyBUF_ND) == PyBUF_ND ? kept->shape.data() : nullptr;
  out->strides =
      (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? kept->strides.data() : nullptr;
  out->suboffsets = nullptr;
  out->internal = nullptr;
  return 0;
}

}  // namespace shmtensor::python
