#include "client/python/exports.h"

#include <Python.h>

#include <string>
#include <vector>

#include "client/python/dlpack.h"

namespace shmtensor::python {
namespace {

// Drops a lease share from a destructor that may hold the GIL: the last
// share releases the lease with an RPC, which must not stall Python.
void DropWithoutGil(std::shared_ptr<internal::Lease>* lease) {
  if (PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    delete lease;
    PyEval_RestoreThread(state);
  } else {
    delete lease;
  }
}

const char* NumpyFormat(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
    case DType::kUInt8:
      return "u1";
    case DType::kBool:
      return "?";
    case DType::kInt8:
      return "i1";
    case DType::kInt16:
      return "<i2";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kComplex64:
      return "<c8";
    case DType::kComplex128:
      return "<c16";
    case DType::kUInt16:
      return "<u2";
    case DType::kUInt32:
      return "<u4";
    case DType::kUInt64:
      return "<u8";
    case DType::kBFloat16:
      return nullptr;
  }
  return nullptr;
}

bool ToDLDataType(DType dtype, DLDataType* out) {
  const uint8_t bits = static_cast<uint8_t>(ItemSize(dtype) * 8);
  switch (dtype) {
    // torch 1.13 rejects DLPack's bool code: bools travel as uint8 and
    // view.tensor() reinterprets them.
    case DType::kBool:
      *out = {kDLUInt, 8, 1};
      return true;
    case DType::kUnspecified:
    case DType::kUInt8:
      *out = {kDLUInt, 8, 1};
      return true;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      *out = {kDLInt, bits, 1};
      return true;
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      *out = {kDLFloat, bits, 1};
      return true;
    case DType::kBFloat16:
      *out = {kDLBfloat, 16, 1};
      return true;
    case DType::kComplex64:
    case DType::kComplex128:
      *out = {kDLComplex, bits, 1};
      return true;
    default:
      return false;  // Unsigned beyond 8 bits: not in torch 1.13.
  }
}

// The DLManagedTensor's context: the shape, strides and lease it refers to.
struct DLContext {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // Elements.
  std::shared_ptr<internal::Lease>* lease;
  std::shared_ptr<std::atomic<int>> counter;
  std::function<void()> on_release;
};

void DeleteDLContext(DLManagedTensor* self) {
  auto* ctx = static_cast<DLContext*>(self->manager_ctx);
  if (ctx->counter) --*ctx->counter;
  if (ctx->on_release) ctx->on_release();
  DropWithoutGil(ctx->lease);
  delete ctx;
}

}  // namespace

py::array MakeArray(const ExportSource& src) {
  const ObjectInfo& info = *src.info;
  if (info.device.is_cuda()) {
    throw py::type_error("the object is in CUDA memory (" +
                         DeviceName(info.device) +
                         "), which NumPy cannot address; use .tensor() or "
                         "torch.from_dlpack() for a CUDA tensor");
  }
  const char* format = NumpyFormat(info.dtype);
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
  auto* lease = new std::shared_ptr<internal::Lease>(src.lease);
  py::capsule owner(lease, [](void* p) {
    DropWithoutGil(static_cast<std::shared_ptr<internal::Lease>*>(p));
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
  ctx->lease = new std::shared_ptr<internal::Lease>(src.lease);
  ctx->counter = src.dlpack_exports;
  ctx->on_release = src.on_release;
  if (ctx->counter) ++*ctx->counter;
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

}  // namespace shmtensor::python
