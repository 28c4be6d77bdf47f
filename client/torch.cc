#include "shmtensor/torch.h"

#include <ATen/Functions.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shmtensor {
namespace {

std::optional<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return at::kBool;
    case DType::kUInt8:
      return at::kByte;
    case DType::kInt8:
      return at::kChar;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kComplex64:
      return at::kComplexFloat;
    case DType::kComplex128:
      return at::kComplexDouble;
    default:
      return std::nullopt;
  }
}

}  // namespace

absl::StatusOr<at::Tensor> ToTensor(const View& view, CudaStream stream) {
  if (!view.valid()) {
    return absl::FailedPreconditionError("view was released");
  }
  std::optional<at::ScalarType> type = ToScalarType(view.dtype());
  if (!type) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(view.dtype()),
                     " has no torch equivalent in this libtorch"));
  }
  const int64_t item = ItemSize(view.dtype());
  std::vector<int64_t> strides;
  for (int64_t s : view.strides_bytes()) strides.push_back(s / item);
  const Device& device = view.info().device;
  // The deleter owns a share of the lease: the last tensor releases it (for
  // CUDA, once the work on `stream` is done as well).
  auto keep = view.lease();
  if (device.is_cuda()) view.UseOnStream(stream);
  // libtorch reports errors by exception: this is its one adapter.
  try {
    return at::from_blob(
        const_cast<void*>(view.data()), view.shape(), strides,
        [keep](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(*type).device(
            device.is_cuda()
                ? at::Device(at::kCUDA, static_cast<int8_t>(device.index))
                : at::Device(at::kCPU)));
  } catch (const std::exception& e) {
    // E.g. a CUDA object with a libtorch built without CUDA (Debian's).
    return absl::FailedPreconditionError(absl::StrCat(
        "torch::from_blob on ", DeviceName(device), ": ", e.what()));
  }
}

}  // namespace shmtensor
